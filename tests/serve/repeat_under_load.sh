#!/bin/bash
# 10 consecutive runs of the Serve tests (tests/serve) with a CPU hog busy on one core.
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD
mkdir -p "${OUT:-/tmp/serve_runs}"
python3 -c "
import time
t = time.time()
while time.time() - t < 4000: pass" &
HOG=$!
PYT=""
trap 'kill $HOG 2>/dev/null; [ -n "$PYT" ] && kill -- -$PYT 2>/dev/null' EXIT
for i in $(seq 1 10); do
  start=$(date +%s)
  setsid timeout 900 .venv/bin/python -m pytest -q -p no:warnings -p no:cacheprovider tests/serve > ${OUT:-/tmp/serve_runs}/run_$i.txt 2>&1 &
  PYT=$!
  wait $PYT
  rc=$?
  PYT=""
  echo "run $i rc=$rc $(( $(date +%s) - start ))s $(tail -1 ${OUT:-/tmp/serve_runs}/run_$i.txt)" >> ${OUT:-/tmp/serve_runs}/summary.txt
done
echo finished >> ${OUT:-/tmp/serve_runs}/summary.txt
