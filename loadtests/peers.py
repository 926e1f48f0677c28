"""This app beside its peers: one seeded closed-loop workload against several fronts in turn, on the same engines.

    python -m loadtests.peers                                          # the four fronts, 2 rounds of 120 s each
    python -m loadtests.peers --duration-s 30 --rounds 1 --fronts fairshare,round_robin   # a quick look
    python -m loadtests.peers --workload followups                     # plain clients: no session id
    python -m loadtests.peers --workload documents --fronts fairshare,cache_aware   # documents alone
    python -m loadtests.peers --workload all --fronts fairshare,cache_aware     # every workload in turn
    python -m loadtests.peers --fronts fairshare,fairshare+pass_throughput_slack=0.005,cache_aware   # a policy variant
    python -m loadtests.peers --fronts fairshare,fairshare+long_lane_replicas=1,cache_aware   # static lanes

Every front serves the same tiny random-weight Llama (`harness.tiny_model`, a 32,768-token context: a
12,000-token document takes seconds to prefill on one core; a byte-level tokenizer over ASCII, so that each token it
emits is whole text, as a trained model's first token is: `TinyModelSpec.ascii_only`) on two CPU sglang 0.5.23
engines with the same settings (`EngineSettings`) and `OMP_NUM_THREADS=1`. Every front runs as shipped: each
process at the priority it starts with (0: this app's config keeps its replicas at the raylet's priority,
`serve_path.WORKER_PRIORITY_ENV`). `--renice` is the other setting, labelled so in the result file: sglang's
scheduler processes, which run the forward passes (the device), at niceness 15 and every other process at 0 under
every front, as beside a GPU (`DEVICE_PROCESS`). Fronts, in turn:

- `fairshare`: this app (`config.sglang-cpu.yaml`): lanes that follow the load, the plugin's rules.
- `fairshare-off`: this app with the plugin taking upstream's decisions (`sglang_upstream_overrides`: the
  `baseline` rule set) and Ray Serve's default router (no lanes).
- `cache_aware`, `round_robin`: `sglang-router` (the `bench` extra: `pip install -e '.[bench]'`) in front of
  two stock sglang servers (the plugin switched off).
- `fairshare+FIELD=VALUE[+FIELD=VALUE...]`: this app with those fields over the config file's, each where it lives:
  its engines' policy (`PolicyConfig`), the Engine deployment's knobs (`long_lane_replicas`: static lanes) or the
  Ingress deployment's (`chat_spill`...); a VALUE is read as YAML (`null`, numbers, booleans), checked as a deployed
  config is (`loadtests.variants`). A variant, not as shipped (the result file says so), to set a trade beside the
  shipped app and a peer in one run.

The default workload, `sessions` (closed loop, streaming): 2 document users (a 10-14k-token document, then one
follow-up question on it in the same session, then the next document) and 4 chat users (20-60-token questions, 4
a session, 16 output tokens), each thinking 0.5-1.5 s between requests, for `--duration-s`; every conversation is
named by an `X-Session-ID` header (`loadtests.locustfile`). `documents` is its document users alone, no chat
users: what each front costs documents with nothing beside them, so its documents ratio is the front's and the
engines' own, not what the chats' service takes from them. The plain workloads (`followups`, `multiturn`,
`system_prompt`, `overflow`: `loadtests.workloads`, played by `loadtests.plain_users`) send no session id at all,
as a plain OpenAI client does; `--workload all` runs every workload in turn, each front started afresh for each
(cold caches). Prompts are sized in the model's own tokens (characters per token measured on its tokenizer).
Every engine reports its cached prompt tokens (sglang's `enable_cache_report`), from which the table gives each
front's prefix-cache hit rate.

The fronts take turns in rounds (`--rounds`), each round a fresh start of every front for `--duration-s` under
the same seeded workload, in turn forwards then backwards (A B, B A, A B, ...): a machine that drifts between
windows (the same front's own figures moved by a quarter between runs ten minutes apart) then weighs on every
front alike rather than on whichever ran second. Each front's figures pool its rounds; the headline gives the
ratio in each round beside the pooled one, its spread.

The result file (`harness.results`: docs/results/peers/, `FAIRSHARE_RESULTS_DIR` moves the folder) starts with
each workload's headline figures, this app against `cache_aware` (`peer_report.headline`), then has a section a
workload: its table (chat TTFT, ITL, document TTFT and prompt tokens/s, follow-up TTFT, SLO attainment, hit rates,
failures, the ratio of this app to the best peer, and the CPU cores the engines, the front, the load generator and
the rest of the machine used while the load ran: `loadtests.cpu_share`), with a PNG per workload beside it. Before
its load, each front answers `IDLE_PROBES` new chats sent one at a time (`idle_chat_ttfts`): its TTFT with the
engines idle, the path's own latency, which the loaded chat TTFT is read against.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import requests

from harness import local_serve as sc
from harness.cpu_env import CPU_ENGINE_KWARGS, CPU_SERVER_ARGS, cpu_sglang_env
from harness.net import free_port
from harness.processes import service
from harness.results import LATEST_NAME, BenchmarkRun
from harness.sglang_server import LocalServer
from loadtests import prompts
from loadtests.app import LocalApp, sglang_upstream_overrides
from loadtests.cpu_share import CpuSampler
from loadtests.peer_report import (
    APP,
    CHAT_USER_COUNT,
    DOCUMENT_USER_COUNT,
    DOCUMENTS_WORKLOAD,
    REFERENCE,
    SESSIONS_WORKLOAD,
    Front,
    headline,
    markdown,
    plot,
    pool_rounds,
)
from loadtests.recording import read_samples
from loadtests.variants import SEP as VARIANT_SEP
from loadtests.variants import Variant, parse_variant
from loadtests.workloads import PLAIN, PlainWorkload, plain_workload
from scheduler.sglang_plugin.env import PASS_TRACE_VAR

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "config.sglang-cpu.yaml"
FRONTS = ("fairshare", "fairshare-off", "cache_aware", "round_robin")
SESSIONS = "sessions"
DOCUMENTS = "documents"
WORKLOADS = (SESSIONS, DOCUMENTS, *PLAIN)
"""`--workload`: the default names each conversation (`X-Session-ID`), and so does `documents` (its document
users alone); the plain ones name none."""
LOCUSTFILES = {SESSIONS: REPO / "loadtests" / "locustfile.py", "plain": REPO / "loadtests" / "plain_users.py"}
TITLE = "This app beside sglang-router: chats and documents on two CPU engines"
DEVICE_NICENESS = 15
DEVICE_PROCESS = "sglang::scheduler"
"""The title of the processes whose niceness is `DEVICE_NICENESS`, under every front: sglang's schedulers, which run
the engines' forward passes, the device of these CPU engines. Every other process (the fronts, a stock server's HTTP
and tokenizer process, sglang's detokenizers, this app's engine replicas, which hold sglang's tokenizer) and the
load generator run at 0, as beside a GPU, where the device's work takes no host CPU from them. With every engine
process at 15 (the runs up to 2026-12-02), a chat's first token took up to 0.36 s from the end of the pass that made
it to the client while both schedulers prefilled documents: the detokenizer and the tokenizer waited for a core on
equal terms with the two passes. With every process at 0, this app's Serve proxy and ingress waited so too."""
RAY_NICENESS_VAR = "RAY_worker_niceness"
"""Ray's own setting (its case is Ray's): the niceness a worker lowers itself to as it starts (15 by default; this
app's config sets 0 for its replicas)."""
ENGINE_REPLICA = "ServeReplica:fairshare:Engine"
"""The process title Ray gives this app's engine replicas."""
LOCUST_GRACE_S = 300


@dataclass(frozen=True)
class EngineSettings:
    """One engine's settings, the same under every front."""

    context_tokens: int = 32_768
    chunk_tokens: int = 2048
    max_running_requests: int = 8
    max_total_tokens: int = 65_536
    short_request_tokens: int = 2048
    """This app's class bound on these engines (the policy's default): a prompt of one chunk or less is a chat.
    The laptop config's 256 fits its 4,096-token context; here it made a chat with a few turns of history a
    document (300-350 uncached tokens), queued behind the other documents' prefill for seconds."""

    def server_args(self) -> list[str]:
        return [
            *CPU_SERVER_ARGS,
            "--context-length",
            str(self.context_tokens),
            "--chunked-prefill-size",
            str(self.chunk_tokens),
            "--max-running-requests",
            str(self.max_running_requests),
            "--max-total-tokens",
            str(self.max_total_tokens),
            "--log-level",
            "warning",
            "--enable-cache-report",
        ]

    def engine_kwargs(self) -> dict[str, Any]:
        """The same settings as `sglang.Engine`'s arguments (an engine in a process of one's own)."""
        return {
            **CPU_ENGINE_KWARGS,
            "context_length": self.context_tokens,
            "chunked_prefill_size": self.chunk_tokens,
            "max_running_requests": self.max_running_requests,
            "max_total_tokens": self.max_total_tokens,
            "log_level": "warning",
            "enable_cache_report": True,
        }


def app_policy(engine: EngineSettings, upstream: bool) -> dict[str, Any]:
    """The policy this app's engines run here: the config file's, with this benchmark's class bound; `upstream`:
    the plugin taking upstream's decisions."""
    policy = dict(sc.deployment(_config(), "Engine")["user_config"].get("policy") or {})
    policy["short_request_tokens"] = engine.short_request_tokens
    if upstream:
        policy.update(sglang_upstream_overrides())
    return policy


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m loadtests.peers", description=__doc__.split("\n\n")[0])
    ap.add_argument("--fronts", default=",".join(FRONTS), help=f"Fronts to run, in order, from {list(FRONTS)}.")
    ap.add_argument(
        "--workload",
        default=SESSIONS,
        help=f"Workloads to run, in order, from {list(WORKLOADS)}, or `all`; each runs every front.",
    )
    ap.add_argument("--duration-s", type=float, default=120.0, help="Length of each front's window (wall s).")
    ap.add_argument(
        "--rounds", type=int, default=2, help="Windows of each front, the fronts' order reversed each round."
    )
    ap.add_argument("--seed", type=int, default=23, help="Seed of the workload (the same for every front).")
    ap.add_argument("--model", type=Path, default=None, help="A tiny model built with the context (default: build).")
    ap.add_argument("--out", type=Path, default=Path("loadtest-out/peers"), help="Samples and logs.")
    ap.add_argument(
        "--renice",
        action="store_true",
        help="Not as shipped: every front's sglang schedulers at niceness 15, every other process at 0 (as by a GPU).",
    )
    args = ap.parse_args(argv)
    fronts = [f for f in args.fronts.split(",") if f]
    bad = [f for f in fronts if f not in FRONTS and not f.startswith(f"{APP}{VARIANT_SEP}")]
    if bad or not fronts:
        ap.error(f"--fronts: unknown {bad}; choose from {list(FRONTS)} or {APP}{VARIANT_SEP}FIELD=VALUE")
    args.variants = {}
    for f in fronts:
        try:
            if variant := variant_of(f):
                args.variants[f] = variant
        except ValueError as e:
            ap.error(f"--fronts {f}: {e}")
    if args.duration_s <= 0:
        ap.error(f"--duration-s {args.duration_s}: must be > 0")
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: must be at least 1")
    workloads = list(WORKLOADS) if args.workload == "all" else [w for w in args.workload.split(",") if w]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown or not workloads:
        ap.error(f"--workload: unknown {unknown}; choose from {list(WORKLOADS)} or all")
    args.fronts, args.workloads = fronts, workloads
    return args


def chars_per_token(model: Path) -> float:
    """Characters per token of the model's tokenizer on the workload's documents."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    text = prompts.document("doc-probe", 4000, 4.0, random.Random(0))
    return len(text) / len(tok(text).input_ids)


def workload_flags(seed: int, cpt: float, duration_s: float, chat_users: int = CHAT_USER_COUNT) -> list[str]:
    """The `sessions` workload's Locust flags (`loadtests.locustfile`): `DOCUMENT_USER_COUNT` document users and
    `chat_users` chat users (0: the `documents` workload). Locust's weights are its users here, one user each."""
    return [
        *("--chat-weight", str(chat_users), "--doc-weight", str(DOCUMENT_USER_COUNT), "--doc-tokens", "10000:14000"),
        *("--doc-followups", "1", "--question-tokens", "20:60", "--chat-turns", "4"),
        *("--chat-max-tokens", "16", "--doc-max-tokens", "16"),
        *loop_flags(seed, cpt, duration_s, users=DOCUMENT_USER_COUNT + chat_users),
    ]


def plain_flags(seed: int, cpt: float, duration_s: float, workload: PlainWorkload, workload_file: Path) -> list[str]:
    """A plain workload's Locust flags (`loadtests.plain_users`): what its users send is in `workload_file`."""
    return ["--workload-file", str(workload_file), *loop_flags(seed, cpt, duration_s, users=workload.users)]


def loop_flags(seed: int, cpt: float, duration_s: float, users: int) -> list[str]:
    """Every workload's pacing: `users` users at once, each thinking 0.5-1.5 s, for `duration_s`."""
    return [
        *("--think-s", "0.5:1.5", "--request-timeout-s", "600", "--chars-per-token", f"{cpt:.4f}", "--seed", str(seed)),
        *("-u", str(users), "-r", "100", "-t", f"{duration_s:.0f}s", "--stop-timeout", "240"),
    ]


@dataclass(frozen=True)
class Load:
    """One workload as the load generator runs it."""

    name: str
    locustfile: Path
    flags: list[str]
    description: str
    """What its users send, in words (the result file's settings)."""


def load_of(name: str, seed: int, cpt: float, duration_s: float, engine: EngineSettings, out: Path) -> Load:
    """The workload `name`; a plain one is written to `out`/workload.json, which its users read."""
    if name == SESSIONS:
        return Load(name, LOCUSTFILES[SESSIONS], workload_flags(seed, cpt, duration_s), SESSIONS_WORKLOAD)
    if name == DOCUMENTS:
        flags = workload_flags(seed, cpt, duration_s, chat_users=0)
        return Load(name, LOCUSTFILES[SESSIONS], flags, DOCUMENTS_WORKLOAD)
    # The overflow workload's documents outgrow both engines' pools together.
    workload = plain_workload(name, seed, kv_pool_tokens=2 * engine.max_total_tokens)
    path = out / "workload.json"
    path.write_text(workload.model_dump_json(indent=2))
    flags = plain_flags(seed, cpt, duration_s, workload, path)
    return Load(name, LOCUSTFILES["plain"], flags, workload.describe())


def run_locust(
    url: str,
    name: str,
    flags: list[str],
    out: Path,
    duration_s: float,
    locustfile: Path = LOCUSTFILES[SESSIONS],
    idle_ttft_s: list[float] | None = None,
    stem: str = "",
) -> Front:
    """One window of load on the front `name`; its samples and Locust's log are `stem` (default `name`) in `out`."""
    stem = stem or name
    samples = out / f"{stem}.samples.jsonl"
    samples.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "locust", "-f", str(locustfile), "--headless"]
    cmd += ["--host", url, "--only-summary", "--samples-file", str(samples), *flags]
    load_start = os.getloadavg()[0]
    cpu = CpuSampler()
    cpu.start()
    with open(out / f"{stem}.locust.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        try:
            proc.wait(timeout=duration_s + LOCUST_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.terminate()
            proc.wait(timeout=60)
    cpu.stop()
    return front_of(name, samples, load_start, proc.returncode, cpu, idle_ttft_s)


def front_of(
    name: str,
    samples: Path,
    load_start: float,
    locust_rc: int | None,
    cpu: CpuSampler,
    idle_ttft_s: list[float] | None = None,
) -> Front:
    """One front's result: its samples (none if the file is missing), what the sampler measured and the idle probe's
    TTFTs (`idle_chat_ttfts`)."""
    start = float(Path(f"{samples}.start").read_text()) if Path(f"{samples}.start").exists() else time.time()
    got = read_samples(samples) if samples.exists() else []
    return Front(
        name,
        got,
        start,
        load_start,
        os.getloadavg()[0],
        locust_rc,
        cpu_cores=cpu.cores(),
        cpu_waiting=cpu.waiting_cores(),
        cpu_by_process=cpu.cores_by_kind(),
        cpu_waiting_by_process=cpu.waiting_cores_by_kind(),
        idle_ttft_s=idle_ttft_s or [],
    )


# -- the fronts -------------------------------------------------------------------------------------------------

FrontStarter = Callable[[], contextlib.AbstractContextManager[tuple[str, str]]]
"""A front not yet started: entering it starts the front and yields its URL and the model name to ask for."""


def variant_of(front: str) -> Variant:
    """The variant of this app a front's name asks for (`loadtests.variants`: empty for any name without
    ``+``), around the config file and the policy its engines run here; ValueError naming what is wrong."""
    return parse_variant(front, APP, _config(), app_policy(EngineSettings(), upstream=False))


def front_starters(
    model: Path,
    engine: EngineSettings,
    out: Path,
    renice: bool = False,
    pools: dict[str, list[int]] | None = None,
    variants: Mapping[str, Variant] | None = None,
) -> dict[str, FrontStarter]:
    """Each of `FRONTS` by name, and each of `variants` (a front's name: the variant it asks for, `variant_of`);
    `out`: the router fronts' logs; `pools`: a router front's servers' KV pools are appended to its list there
    (`router_front`)."""
    pools = pools or {}
    return {
        **{f: app_front(model, engine, upstream=False, renice=renice, variant=v) for f, v in (variants or {}).items()},
        "fairshare": app_front(model, engine, upstream=False, renice=renice),
        "fairshare-off": app_front(model, engine, upstream=True, renice=renice),
        **{
            p: router_front(model, engine, p, out, renice=renice, pools=pools.get(p))
            for p in ("cache_aware", "round_robin")
        },
    }


def app_front(
    model: Path,
    engine: EngineSettings,
    upstream: bool,
    started: list[LocalApp] | None = None,
    renice: bool = False,
    num_engines: int = 2,
    variant: Variant | None = None,
) -> FrontStarter:
    """This app on a local Ray + Serve; `upstream`: the plugin's upstream rules and Serve's default router;
    `started`: the running app is appended to it (a benchmark that changes its `user_config` live); `renice`: not as
    shipped, Ray's workers at 0 and the schedulers at `DEVICE_NICENESS`; `num_engines`: engine replicas, two as every
    front here has; `variant`: fields over the config file's (`loadtests.variants`, not as shipped)."""
    os.environ.update({k: v for k, v in cpu_sglang_env().items() if k in ("PYTHONPATH", "OMP_NUM_THREADS")})

    def edit(cfg: dict[str, Any]) -> None:
        app = cfg["applications"][0]
        app["args"].pop("embeddings", None)
        app["deployments"] = [d for d in app["deployments"] if d["name"] != "Embedder"]
        s = app["args"]["sglang"]
        s.update(
            model_path=str(model),
            context_length=engine.context_tokens,
            chunked_prefill_size=engine.chunk_tokens,
            max_running_requests=engine.max_running_requests,
        )
        s["engine_args"].update(max_total_tokens=engine.max_total_tokens, enable_cache_report=True)
        app["args"]["max_context_tokens"] = engine.context_tokens
        if upstream:
            sc.deployment(cfg, "Engine").pop("request_router_config", None)  # Ray Serve's default router
        if variant:
            variant.apply(cfg)

    engine_policy = {**app_policy(engine, upstream), **(variant.policy if variant else {})}

    @contextlib.contextmanager
    def start() -> Iterator[tuple[str, str]]:
        if renice:
            os.environ[RAY_NICENESS_VAR] = "0"  # read when Ray starts: every worker at 0, the schedulers reniced below
        try:
            with LocalApp(
                CONFIG, {"engine_replicas": num_engines, "policy": engine_policy}, edit=edit, deploy_timeout_s=900
            ) as local:
                if renice:
                    renice_devices(engine_replicas(), DEVICE_NICENESS)
                if started is not None:
                    started.append(local)
                yield local.url, model_id(local.url)
        finally:
            os.environ.pop(RAY_NICENESS_VAR, None)

    return start


def renice_devices(roots: list[psutil.Process], niceness: int) -> None:
    """Every sglang scheduler (`DEVICE_PROCESS`) under each of `roots`, at least one each, at `niceness`."""
    for root in roots:
        schedulers = []
        for proc in root.children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                if DEVICE_PROCESS in " ".join(proc.cmdline()):
                    proc.nice(niceness)
                    schedulers.append(proc)
        if not schedulers:
            raise RuntimeError(f"no {DEVICE_PROCESS!r} process under pid {root.pid} to renice")


def engine_replicas() -> list[psutil.Process]:
    """This app's engine replica processes (`ENGINE_REPLICA`)."""
    return processes_titled(ENGINE_REPLICA)


def processes_titled(title: str) -> list[psutil.Process]:
    """The processes whose command line holds `title` (Serve titles a replica's process by its deployment)."""
    found = [p for p in psutil.process_iter(["cmdline"]) if title in " ".join(p.info["cmdline"] or ())]
    if not found:
        raise RuntimeError(f"no process titled {title!r}")
    return found


def _config() -> dict[str, Any]:
    import yaml

    config: dict[str, Any] = yaml.safe_load(CONFIG.read_text())
    return config


def router_front(
    model: Path, engine: EngineSettings, policy: str, out: Path, renice: bool = False, pools: list[int] | None = None
) -> FrontStarter:
    """`sglang-router` with `policy` in front of two stock sglang servers (the plugin off); `renice`: not as
    shipped, their schedulers at `DEVICE_NICENESS`; `pools`: each server's KV pool (`kv_pool_tokens`) is
    appended to it."""

    @contextlib.contextmanager
    def start() -> Iterator[tuple[str, str]]:
        env = cpu_sglang_env(plugin_enabled=False)
        if trace := os.environ.get(PASS_TRACE_VAR):  # upstream's own decisions, as the app's engines trace theirs
            env[PASS_TRACE_VAR] = trace
        logs = [out / f"{policy}.server{i}.log" for i in range(2)]
        with local_servers(model, engine, [env, env], logs) as servers:
            if renice:
                renice_devices([psutil.Process(s.proc.pid) for s in servers if s.proc], DEVICE_NICENESS)
            workers = [f"http://127.0.0.1:{s.port}" for s in servers]
            if pools is not None:
                pools.extend(kv_pool_tokens(w) for w in workers)
            with launch_router(policy, workers, out) as url:
                yield url, model_id(workers[0])  # the router lists no models: a worker does

    return start


@contextlib.contextmanager
def local_servers(
    model: Path, engine: EngineSettings, envs: list[dict[str, str]], logs: list[Path]
) -> Iterator[list[LocalServer]]:
    """sglang servers of `model` with `engine`'s settings, one per environment (and log), started side by side and
    stopped on the way out."""
    servers = [LocalServer(model, engine.server_args(), env, log) for env, log in zip(envs, logs, strict=True)]
    try:
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(LocalServer.start, servers))
        yield servers
    finally:
        for server in servers:
            server.stop()


@contextlib.contextmanager
def launch_router(policy: str, workers: list[str], out: Path, timeout_s: float = 120) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *workers, "--policy", policy]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(free_port()), "--log-level", "warn"]
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        return requests.get(f"{url}/health", timeout=5).status_code == 200

    with service(cmd, out / f"{policy}.router.log", ready, timeout_s, poll_s=1):
        yield url


def warm_up(url: str, model: str, timeout_s: float = 300) -> None:
    """Requests through the front: every lazy path (tokenizer, first pass) is taken before the clock starts. A front
    may answer 503 until it has seen its engines healthy (sglang-router checks its workers): asked again."""
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
    deadline, answered = time.monotonic() + timeout_s, 0
    while answered < 2:
        r = requests.post(f"{url}/v1/chat/completions", json=body, timeout=300)
        if r.status_code == 200:
            answered += 1
        elif r.status_code != 503 or time.monotonic() > deadline:
            r.raise_for_status()
        else:
            time.sleep(1)


IDLE_PROBES = 20
"""Chats sent one at a time to each front before its load (`idle_chat_ttfts`)."""
IDLE_PROBE_TOKENS = 40


def first_content_s(url: str, model: str, content: str | list[dict[str, str]], max_tokens: int) -> float:
    """Seconds from sending one streamed chat completion to its first content, as the client sees it; `content`:
    the user's one message, or the whole conversation."""
    messages = [{"role": "user", "content": content}] if isinstance(content, str) else content
    body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens}
    sent = time.perf_counter()
    with requests.post(f"{url}/v1/chat/completions", json={**body, "stream": True}, stream=True, timeout=600) as r:
        r.raise_for_status()
        for chunk in r.iter_content(chunk_size=None):
            if b'"content"' in chunk:
                return time.perf_counter() - sent
    raise RuntimeError("a stream without content")


def idle_chat_ttfts(
    url: str, model: str, cpt: float, seed: int, n: int = IDLE_PROBES, gap_s: float = 0.0
) -> list[float]:
    """TTFTs of `n` new chats sent one after another (`gap_s` apart) to a front whose engines do nothing else: the
    path's own latency (front, engine hops, a chat's passes), apart from what the load adds. The same questions for
    every front (`seed`), each new (no cached prefix beyond the chat template)."""
    rng = random.Random(seed)
    ttfts = []
    for _ in range(n):
        question = prompts.question(IDLE_PROBE_TOKENS, cpt, rng)
        time.sleep(gap_s)
        ttfts.append(first_content_s(url, model, question, 4))
    return ttfts


def model_id(url: str) -> str:
    return str(requests.get(f"{url}/v1/models", timeout=60).json()["data"][0]["id"])


def kv_pool_tokens(server_url: str) -> int:
    """The tokens a stock sglang server's KV pool holds, as it reports them (`max_total_num_tokens`)."""
    return int(requests.get(f"{server_url}/server_info", timeout=60).json()["max_total_num_tokens"])


@dataclass
class WorkloadResult:
    """One workload's run: each round's fronts that ran, and why any other did not."""

    load: Load
    rounds: list[list[Front]] = field(default_factory=list)
    broken: dict[str, str] = field(default_factory=dict)

    @property
    def fronts(self) -> list[Front]:
        """Each front's rounds pooled."""
        return pool_rounds(self.rounds)

    @property
    def clean(self) -> bool:
        return not self.broken and all(f.failures == 0 for f in self.fronts)


def round_order(fronts: list[str], round_index: int) -> list[str]:
    """The fronts in the order round `round_index` runs them: forwards, then backwards, in turn."""
    return list(fronts) if round_index % 2 == 0 else fronts[::-1]


def run_workload(
    load: Load, args: argparse.Namespace, model: Path, engine: EngineSettings, out: Path, cpt: float
) -> WorkloadResult:
    """Every front in turn, each started afresh (cold caches), in `args.rounds` rounds under the workload `load`."""
    pools: dict[str, list[int]] = {"cache_aware": [], "round_robin": []}
    starts = front_starters(model, engine, out, renice=args.renice, pools=pools, variants=args.variants)
    result = WorkloadResult(load)
    for r in range(args.rounds):
        result.rounds.append([])
        for name in round_order(args.fronts, r):
            if name in result.broken:
                continue
            tag = f"{load.name} / {name} / round {r + 1} of {args.rounds}"
            try:
                front = run_front(starts[name], tag, name, f"{name}.round{r + 1}", load, args, out, cpt)
            except Exception as e:  # the other fronts still run; the result file says which one did not
                result.broken[name] = f"{type(e).__name__}: {str(e)[:300]}"
                print(f"{tag}: did not run: {result.broken[name]}", flush=True)
                continue
            reported = pools.get(name, [])  # appended to by this start alone: the next start's is its own
            front.kv_pool_tokens = list(reported)
            reported.clear()
            result.rounds[-1].append(front)
    return result


def run_front(
    start: FrontStarter, tag: str, name: str, stem: str, load: Load, args: argparse.Namespace, out: Path, cpt: float
) -> Front:
    """One window of `load` on the front `name`, started afresh; its samples and log are `stem` in `out`."""
    print(f"{tag}: starting", flush=True)
    with start() as (url, model_name):
        warm_up(url, model_name)
        idle = idle_chat_ttfts(url, model_name, cpt, args.seed)
        print(f"{tag}: {args.duration_s:.0f} s of load", flush=True)
        flags = [*load.flags, "--model", model_name]
        front = run_locust(url, name, flags, out, args.duration_s, load.locustfile, idle, stem=stem)
    print(f"{tag}: {len(front.samples)} requests", flush=True)
    return front


def variant_notes(variants: Mapping[str, Variant]) -> list[str]:
    """A line for each variant front: what it changes, and that it is not as shipped."""
    return [f"- `{f}`: **not as shipped**, this app with {v.describe()}.\n" for f, v in variants.items()]


def report(results: list[WorkloadResult], engine: EngineSettings, cpt: float, args: argparse.Namespace) -> str:
    """The headline figures of every workload, then a section a workload (its settings, table and verdict)."""
    summary = headline([(r.load.name, r.rounds) for r in results])
    parts = [f"Each workload's headline figures, {APP} against {REFERENCE}:", "", summary, ""]
    for r in results:
        body = markdown(
            r.fronts,
            engine,
            cpt,
            args.duration_s,
            args.seed,
            reniced=args.renice,
            workload=r.load.description,
            rounds=args.rounds,
        )
        parts += [f"## Workload `{r.load.name}`", "", body, *variant_notes(args.variants)]
        if r.broken:
            parts.append("Fronts that did not run:\n" + "".join(f"- {n}: `{why}`\n" for n, why in r.broken.items()))
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = BenchmarkRun("peers")
    engine = EngineSettings()
    results: list[WorkloadResult] = []
    with tempfile.TemporaryDirectory(prefix="peers-model-") as tmp:
        model = args.model or build_model(Path(tmp), engine.context_tokens)
        cpt = chars_per_token(model)
        for name in args.workloads:
            out = args.out / name  # each workload's samples, workload file and logs
            out.mkdir(parents=True, exist_ok=True)
            load = load_of(name, args.seed, cpt, args.duration_s, engine, out)
            results.append(run_workload(load, args, model, engine, out, cpt))
    body = report(results, engine, cpt, args)
    print(body)
    title = TITLE if args.workloads == [SESSIONS] else f"{TITLE}, workloads {', '.join(args.workloads)}"
    path = run.write(title, body)
    links = []
    for r in results:
        png = path.with_name(f"{path.stem}-{r.load.name}.png")
        plot(r.fronts, png)
        links.append(f"\n![{r.load.name}: chat TTFT and document throughput by front]({png.name})\n")
    for written in (path, path.parent / LATEST_NAME):  # the pictures after the tables, linked from both
        written.write_text(written.read_text() + "".join(links))
    print(f"written: {path} and {len(links)} PNG beside it")
    return 0 if all(r.clean for r in results) else 1


def build_model(directory: Path, context_tokens: int) -> Path:
    """The engines' tiny model: byte-level tokenizer over ASCII (`chars_per_token`), positions up to
    `context_tokens`."""
    from harness.tiny_model import TinyModelSpec, build_tiny_model

    spec = TinyModelSpec(byte_level=True, ascii_only=True, max_position_embeddings=context_tokens)
    return build_tiny_model(directory, spec)


if __name__ == "__main__":
    sys.exit(main())
