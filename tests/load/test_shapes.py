"""The Locust shapes' ticks, run in a subprocess: importing Locust monkey-patches the process with gevent,
which this test process (it also runs Ray) must not be."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = r"""
import json, sys
from loadtests.settings import LoadSettings
from loadtests.shapes.article import ArticleShape
from loadtests.shapes.ramp import StepRampShape
from loadtests.shapes.soak import SoakShape

class Entry:
    response_times = {}

class Stats:
    def get(self, name, method):
        assert (name, method) == ("short", "TTFT")
        return Entry

class Env:
    loadtest_settings = LoadSettings(time_scale=0.5, article_single_s=100, article_four_s=200, ramp_step_users=3,
                                     ramp_step_s=10, ramp_max_users=7, knee_ttft_s=1.0, soak_users=4, soak_s=30)

class Runner:
    environment = Env()
    stats = Stats()

def ticks(shape, wall_times, slow_after=None):
    shape.runner = Runner()
    out = []
    for t in wall_times:
        shape.get_run_time = lambda t=t: t
        if slow_after is not None and t >= slow_after:
            Entry.response_times = {**Entry.response_times, 5000: Entry.response_times.get(5000, 0) + 1}
        out.append(shape.tick())
    return out

print(json.dumps({
    "article_fixed_chats": ArticleShape.chat_users_fixed,
    "article": ticks(ArticleShape(), [0, 49.9, 50, 149.9, 150]),
    "ramp": ticks(StepRampShape(), [0, 4.9, 5, 10, 14.9, 15]),
    "ramp_knee": ticks(StepRampShape(), [0, 5, 6, 10, 11], slow_after=6),
    "soak": ticks(SoakShape(), [0, 14.9, 15]),
}))
"""


def test_shapes_tick_through_their_stages_in_engine_time() -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    # Time scale 0.5: engine time = wall time * 2.
    assert got["article_fixed_chats"] == 1
    assert got["article"] == [[2, 100.0], [2, 100.0], [5, 100.0], [5, 100.0], None]
    assert [t and t[0] for t in got["ramp"]] == [3, 3, 6, 7, 7, None]
    # A step whose short TTFT p99 (5 s) is above --knee-ttft-s (1 engine s = 500 ms wall): stop after it.
    assert [t and t[0] for t in got["ramp_knee"]] == [3, 6, 6, None, None]
    assert got["soak"] == [[4, 100.0], [4, 100.0], None]


ORDER_PROBE = r"""
import itertools, json
from locust.dispatch import _kl_generator
from loadtests.prediction import _weighted_order
out = []
for w in [(4, 1), (1, 1), (3, 2), (5, 1), (1, 4), (2, 7), (0, 3)]:
    pairs = [("chat", w[0]), ("doc", w[1])]
    out.append(list(itertools.islice(_kl_generator(pairs), 40)) == list(itertools.islice(_weighted_order(pairs), 40)))
print(json.dumps(out))
"""


def test_prediction_fills_users_in_locusts_order() -> None:
    proc = subprocess.run([sys.executable, "-c", ORDER_PROBE], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [True] * 7
