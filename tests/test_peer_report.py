"""The peer benchmark's figures and verdict (`loadtests.peer_report`) on made-up samples: what decides the
acceptance of the comparison with sglang's router."""

from __future__ import annotations

import json
import warnings
from dataclasses import asdict, replace
from types import SimpleNamespace

import pytest

from loadtests.cpu_share import CpuSampler
from loadtests.peer_report import Front, front_cpu_ms, markdown, meets_slo, plot, process_table, table, verdict
from loadtests.peers import EngineSettings, front_of
from loadtests.recording import Sample, response_meta


def chat(ttft_s: float, sent_s: float = 0.0, gaps=(0.02,), status: int = 200) -> Sample:
    return Sample("chat", "short", "short", status, sent_s, ttft_s=ttft_s, itl_s=list(gaps), error=None)


def document(sent_s: float, ttft_s: float, tokens: int = 10_000) -> Sample:
    return Sample("doc", "long", "long", 200, sent_s, ttft_s=ttft_s, prompt_tokens=tokens, cached_tokens=0)


def front(
    name: str, chat_ttfts: list[float], doc_ttft_s: float, extra: list[Sample] = (), idle: list[float] = ()
) -> Front:
    # One document at a time, back to back: tokens / TTFT is the document rate.
    docs = [document(10.0 * i, doc_ttft_s) for i in range(5)]
    chats = [chat(t, i) for i, t in enumerate(chat_ttfts)]
    return Front(name, [*chats, *docs, *extra], 0.0, 1.0, 1.0, idle_ttft_s=list(idle))


def test_a_chat_meets_the_slo_only_with_its_first_token_and_every_gap_within_target():
    assert meets_slo(chat(0.5)) and not meets_slo(chat(0.51)) and not meets_slo(chat(0.1, gaps=(0.01, 0.31)))


def test_the_verdict_judges_the_app_against_the_best_peer_of_each_figure():
    peers = [front("cache_aware", [2.0] * 100, 1.0), front("round_robin", [4.0] * 100, 2.0)]
    # Chat TTFT p99 0.5 s against the best peer's 2.0 s (0.25x); documents at 10,000 tok/s against 10,000.
    app = front("fairshare", [0.1] * 98 + [0.5, 0.5], 1.0)
    assert verdict([app, *peers]) == [
        "- chat TTFT p99 0.250x the best peer's (≤ 0.25x): met",
        "- document prompt tokens/s 1.000x the best peer's (≥ 0.9x): met",
        "- failures: none in any front",
    ]
    failed = chat(0.1, status=500)
    failed.error = "HTTP 500"
    slower = front("fairshare", [0.1] * 98 + [0.6, 0.6], 1.2, extra=[failed])
    lines = verdict([slower, *peers])
    assert lines[0] == "- chat TTFT p99 0.300x the best peer's (≤ 0.25x): missed"
    assert lines[1] == "- document prompt tokens/s 0.833x the best peer's (≥ 0.9x): missed"
    assert lines[2] == "- failures: fairshare 1"


def test_no_verdict_without_a_peer_and_the_table_says_which_front_is_best():
    app = front("fairshare", [0.1] * 10, 1.0)
    assert verdict([app]) == ["No verdict: the run needs this app and at least one peer."]
    rows = table([app, front("cache_aware", [1.0] * 10, 2.0)]).splitlines()
    p99 = next(r for r in rows if r.startswith("| chat TTFT p99"))
    assert p99.split(" | ")[1:] == ["0.1", "1", "0.10x |"]
    rate = next(r for r in rows if r.startswith("| document prompt tokens/s"))
    assert rate.endswith("| 2.00x |")
    assert not any(r.startswith("| CPU cores used") for r in rows)  # none sampled


def test_the_table_splits_the_document_rate_into_each_ones_own_and_how_many_went_at_once():
    # The app's two documents overlap (0-2 s and 1-3 s: 4 s of waits in 3 s); the peer's go one at a time.
    app = Front("fairshare", [document(0.0, 2.0), document(1.0, 2.0)], 0.0, 1.0, 1.0)
    rows = {r.split(" | ")[0][2:]: r.split(" | ")[1:] for r in table([app, front("cache_aware", [], 1.0)]).splitlines()}
    rate, own, at_once = (rows[k] for k in (
        "document prompt tokens/s (tok/s)", "document prompt tokens/s, over each one's own wait (tok/s)",
        "at once, while any waited for a first token (documents)",
    ))  # fmt: skip
    assert [float(x.replace(",", "")) for x in rate[:2]] == pytest.approx([20_000 / 3, 10_000], rel=1e-2)
    assert [float(x.replace(",", "")) for x in own[:2]] == pytest.approx([5_000, 10_000], rel=1e-2)
    assert [float(x) for x in at_once[:2]] == pytest.approx([4 / 3, 1.0], rel=1e-2)


def test_the_table_shows_the_cpu_each_role_used_where_it_was_sampled():
    app, peer = front("fairshare", [0.1] * 10, 1.0), front("cache_aware", [1.0] * 10, 2.0)
    app.cpu_cores = {"engines": 1.1, "front": 0.35, "load generator": 0.02}
    peer.cpu_cores = {"engines": 1.2, "front": 0.01, "load generator": 0.02}
    app.cpu_waiting = {"engines": 0.36, "front": 0.3}
    rows = table([app, peer]).splitlines()
    assert "| CPU cores used: engines | 1.10 | 1.20 | |" in rows
    assert "| CPU cores used: front | 0.35 | 0.01 | |" in rows
    assert "| CPU cores waited for: engines | 0.36 | — | |" in rows  # the kernel said nothing for the peer


def test_the_table_sets_each_fronts_idle_chat_ttft_beside_the_loads(tmp_path):
    app = front("fairshare", [0.3] * 10, 1.0, idle=[0.05, 0.04, 0.06])
    peer = front("cache_aware", [0.1] * 10, 2.0, idle=[0.02, 0.03, 0.01])
    rows = table([app, peer]).splitlines()
    assert "| chat TTFT p50, engines idle (s) | 0.05 | 0.02 | 2.50x |" in rows
    # The probe's TTFTs reach the result as measured; a front with none says so rather than a figure.
    samples = tmp_path / "fairshare.samples.jsonl"
    samples.write_text(json.dumps(asdict(chat(0.2, 0))) + "\n")
    probed = front_of("fairshare", samples, 1.0, 0, CpuSampler(), [0.07])
    assert probed.figures["chat TTFT p50, engines idle"] == pytest.approx(0.07)
    unprobed = front_of("fairshare", samples, 1.0, 0, CpuSampler())
    assert "| chat TTFT p50, engines idle (s) | — | — |" in table([unprobed])


@pytest.mark.parametrize("shed", [True, False])
def test_a_shed_chat_is_no_failure_and_counts_against_no_attainment(shed):
    refused = chat(0.0, status=429 if shed else 500)
    refused.ttft_s, refused.shed, refused.error = None, shed, "refused"
    f = front("fairshare", [0.1] * 3, 1.0, extra=[refused])
    assert f.failures == (0 if shed else 1)
    assert f.figures["chat SLO attainment"] == (100.0 if shed else 75.0)


def test_a_fronts_result_carries_the_cpu_its_roles_used_and_waited_for(tmp_path):
    samples = tmp_path / "fairshare.samples.jsonl"
    samples.write_text(json.dumps(asdict(chat(0.2, 0))) + "\n")
    cpu = CpuSampler(roles={1: "engines", 2: "front"}, elapsed_s=10.0)
    cpu.first, cpu.last = {1: 5.0, 2: 0.0}, {1: 17.0, 2: 2.5}
    cpu.first_wait, cpu.last_wait = {1: 1.0, 2: 0.0}, {1: 4.0, 2: 3.0}
    rows = table([front_of("fairshare", samples, 1.0, 0, cpu)]).splitlines()
    assert "| CPU cores used: engines | 1.20 | |" in rows and "| CPU cores used: front | 0.25 | |" in rows
    assert "| CPU cores waited for: engines | 0.30 | |" in rows and "| CPU cores waited for: front | 0.30 | |" in rows


def test_the_result_gives_each_kind_of_process_some_front_used_and_every_fronts_total():
    app, peer = front("fairshare", [0.1] * 3, 1.0), front("cache_aware", [0.2] * 3, 1.0)
    app.cpu_by_process = {"sglang schedulers": 0.96, "Serve's controller": 0.03, "sglang-router": 0.0, "GCS": 0.001}
    peer.cpu_by_process = {"sglang schedulers": 0.98, "Serve's controller": 0.0, "sglang-router": 0.011, "GCS": 0.0}
    rows = markdown([app, peer], EngineSettings(), 4.0, 60.0, 1).splitlines()
    assert "| sglang schedulers | 0.960 | 0.980 |" in rows and "| Serve's controller | 0.030 | 0.000 |" in rows
    assert "| sglang-router | 0.000 | 0.011 |" in rows and "| all processes | 0.991 | 0.991 |" in rows
    assert not any(r.startswith("| GCS |") for r in rows)  # under SHOWN_CORES in every front
    # A front sampled by role only (an older result's shape) gives no process table at all.
    assert "by kind of process" not in markdown([front("fairshare", [0.1] * 3, 1.0)], EngineSettings(), 4.0, 60.0, 1)


def test_the_process_table_gives_each_kinds_wait_for_a_core_beside_its_cores_where_the_kernel_said():
    app, peer = front("fairshare", [0.1] * 3, 1.0), front("cache_aware", [0.2] * 3, 1.0)
    app.cpu_by_process = {"sglang schedulers": 0.96, "Ray's agents, dashboard and log monitor": 0.02}
    peer.cpu_by_process = {"sglang schedulers": 0.98, "sglang-router": 0.011}
    # The agents are the rest of the machine: their wait is not read, which the table says as "—", not 0.
    app.cpu_waiting_by_process = {"sglang schedulers": 0.21}
    peer.cpu_waiting_by_process = {"sglang schedulers": 0.12, "sglang-router": 0.004}
    rows = process_table([app, peer]).splitlines()
    assert rows[0] == "| process | fairshare: used | waited for | cache_aware: used | waited for |"
    assert "| sglang schedulers | 0.960 | 0.210 | 0.980 | 0.120 |" in rows
    assert "| Ray's agents, dashboard and log monitor | 0.020 | — | 0.000 | — |" in rows
    assert "| sglang-router | 0.000 | — | 0.011 | 0.004 |" in rows
    assert rows[-1] == "| all processes | 0.980 | 0.210 | 0.991 | 0.124 |"


def test_the_table_gives_the_fronts_cpu_per_request_over_the_span_of_its_requests():
    chats = [Sample("chat", "short", "short", 200, float(i), ttft_s=0.1, e2e_s=1.0) for i in range(10)]
    app = Front("fairshare", chats, 0.0, 1.0, 1.0)
    app.cpu_cores = {"front": 0.5, "engines": 1.0}
    unsampled = Front("cache_aware", list(chats), 0.0, 1.0, 1.0)
    # 10 requests from 0 s to 10 s (the last sent at 9 s, answered 1 s later): 0.5 cores * 10 s / 10 = 500 ms.
    assert front_cpu_ms(app) == pytest.approx(500.0) and front_cpu_ms(unsampled) is None
    assert "| front CPU ms per request | 500.0 | — | |" in table([app, unsampled]).splitlines()


@pytest.mark.parametrize("reniced", [False, True])
def test_the_result_says_whether_the_fronts_ran_as_shipped(reniced):
    text = markdown([front("fairshare", [0.1] * 3, 1.0)], EngineSettings(), 4.0, 60.0, 1, reniced=reniced)
    settings = text.splitlines()[0]
    assert ("not as shipped" in settings) is reniced and ("as shipped: this app's replicas" in settings) is not reniced


def test_a_sample_reads_its_class_replica_route_and_first_token_inside_the_app_from_the_headers():
    app = SimpleNamespace(
        status_code=200,
        headers={
            "X-Traffic-Class": "short",
            "X-Lane": "chat",
            "X-Replica": "r1",
            "X-Route": "gave-way",
            "Server-Timing": "route;dur=1.5, ttft;dur=42",
        },
    )
    assert response_meta(app, "long") == dict(
        intent="long", traffic_class="short", status=200, lane="chat", replica="r1", route="gave-way", app_ttft_s=0.042
    )
    stock = SimpleNamespace(status_code=200, headers={})  # a front that says none of it
    assert response_meta(stock, "long") == dict(
        intent="long", traffic_class="long", status=200, lane="", replica="", route="", app_ttft_s=None
    )
    # The table gives the app's share of a chat's first token where a front said it, and nothing for one that did not.
    said = front(
        "fairshare", [0.1] * 10, 1.0, extra=[replace(chat(0.08, 20.0 + i), app_ttft_s=0.05) for i in range(11)]
    )
    rows = table([said, front("cache_aware", [1.0] * 10, 2.0)]).splitlines()
    inside = next(r for r in rows if r.startswith("| chat TTFT p50 inside the app"))
    assert inside.split(" | ")[1:3] == ["0.05", "—"]


def test_a_workload_of_documents_alone_plots_and_judges_without_a_warning(tmp_path):
    fronts = [front("fairshare", [], 1.2), front("cache_aware", [], 1.0)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "no artists with labels" for the empty chat CDF
        plot(fronts, tmp_path / "documents.png")
    assert (tmp_path / "documents.png").stat().st_size > 0
    lines = verdict(fronts)
    assert not any("chat" in line for line in lines)
    assert any("document prompt tokens/s 0.833x" in line and "missed" in line for line in lines)
