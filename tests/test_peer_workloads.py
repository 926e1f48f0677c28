"""The peer benchmark's plain workloads (`loadtests.workloads`): what a plain OpenAI client sends (no session id),
how each workload's conversations grow, and how the report counts the engines' cache hits. No server: the users'
scripts are played with made-up answers."""

from __future__ import annotations

import itertools

import pytest

from loadtests.peer_report import Front, cache_counts, headline, hit_rate, table
from loadtests.peers import (
    DOCUMENTS,
    LOCUSTFILES,
    SESSIONS,
    WORKLOADS,
    EngineSettings,
    load_of,
    parse_args,
    workload_flags,
)
from loadtests.recording import Sample
from loadtests.workloads import (
    PLAIN,
    SYSTEM_PROMPT_TOKENS,
    PlainRequest,
    PlainWorkload,
    overflow,
    plain_workload,
    script,
    set_document,
)

CPT = 1.12  # the tiny model's characters a token
SEED = 23
POOL = 2 * EngineSettings().max_total_tokens


def played(w: PlainWorkload, kind: str, n: int, index: int = 0) -> list[tuple[PlainRequest, str]]:
    """The first `n` requests of a user's script, each with the answer it was given (`answer-<i>`)."""
    user, out, answer = script(w, kind, index, CPT, SEED), [], None
    for i in range(n):
        request = user.send(answer)
        answer = f"answer-{i}"
        out.append((request, answer))
    return out


def workload(name: str) -> PlainWorkload:
    return plain_workload(name, SEED, POOL)


@pytest.mark.parametrize("name", PLAIN)
def test_a_plain_client_names_no_session_in_any_request(name):
    w = workload(name)
    for kind in ("chat", "doc"):
        for request, _ in played(w, kind, 12):
            body, headers = request.body("tiny"), request.headers()
            assert "user" not in body and not any(h.lower() == "x-session-id" for h in headers)
            assert body["stream"] and body["stream_options"] == {"include_usage": True}  # the engines' counts
            assert body["messages"] == request.messages and body["model"] == "tiny"


@pytest.mark.parametrize("name", ["followups", "overflow"])
def test_a_follow_up_resends_its_document_prompt_and_the_conversation_so_far(name):
    requests = played(workload(name), "doc", 30)
    document = requests[0][0]
    assert document.kind == "doc" and len(document.messages) == 1
    for (before, answer), (after, _) in itertools.pairwise(requests):
        if after.kind == "doc":
            document = after
            continue
        # The document's prompt first, character for character, then the conversation so far and the question.
        assert after.messages[0] == document.messages[0]
        assert after.messages[0]["content"].startswith("Document ")
        assert after.messages[:-2] == before.messages
        assert after.messages[-2:] == [{"role": "assistant", "content": answer}, after.messages[-1]]
        assert after.messages[-1]["role"] == "user"
    kinds = [r.kind for r, _ in requests]
    runs = [len(list(g)) for k, g in itertools.groupby(kinds) if k == "followup"]
    assert set(runs) == {1, 2} and len(runs) == kinds.count("doc") - (kinds[-1] == "doc")  # 1-2 after each
    assert all(r.intent == ("long" if r.kind == "doc" else "short") for r, _ in requests)


def test_a_multi_turn_chat_extends_the_previous_turns_messages_with_the_servers_answer():
    w = workload("multiturn")
    requests = played(w, "chat", 2 * w.chat_turns)
    for i, ((before, answer), (after, _)) in enumerate(itertools.pairwise(requests)):
        if (i + 1) % w.chat_turns == 0:  # a new chat
            assert len(after.messages) == 1 and after.messages[0]["role"] == "user"
            continue
        assert after.messages[: len(before.messages)] == before.messages
        assert after.messages[len(before.messages) :] == [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": after.messages[-1]["content"]},
        ]
    assert len(requests[w.chat_turns - 1][0].messages) == 2 * w.chat_turns - 1
    assert w.chat_turns >= 8 and all(r.kind == "chat" for r, _ in requests)


def test_every_system_prompt_chat_is_new_and_starts_with_the_one_shared_system_prompt():
    w = workload("system_prompt")
    assert SYSTEM_PROMPT_TOKENS[0] <= w.system_prompt_tokens <= SYSTEM_PROMPT_TOKENS[1]
    chats = [r for i in range(3) for r, _ in played(w, "chat", 5, index=i)]
    systems = {r.messages[0]["content"] for r in chats}
    assert len(systems) == 1 and all(r.messages[0]["role"] == "system" and len(r.messages) == 2 for r in chats)
    assert len(systems.pop()) == pytest.approx(w.system_prompt_tokens * CPT, abs=1)
    assert len({r.messages[1]["content"] for r in chats}) == len(chats)  # distinct questions


def test_the_overflow_documents_outgrow_the_pools_and_come_back():
    w = overflow(SEED, POOL)
    assert sum(w.document_set) > 2 * POOL and all(10_000 <= t <= 14_000 for t in w.document_set)
    assert sum(w.document_set[:-1]) <= 2.5 * POOL  # sized to the factor, not beyond
    assert w.kv_pool_tokens == POOL and "2.6x the engines' KV pools together" in w.describe()
    texts = {set_document(SEED, k, t, CPT): k for k, t in enumerate(w.document_set)}
    drawn = [
        texts[r.messages[0]["content"].split("\n\nQuestion: ")[0]]
        for i in range(2)
        for r, _ in played(w, "doc", 60, index=i)
        if r.kind == "doc"
    ]
    assert len(drawn) > len(set(drawn))  # documents come back


def test_other_workloads_send_new_documents_and_every_user_its_own_texts():
    w = workload("followups")
    docs = [r.messages[0]["content"] for i in range(2) for r, _ in played(w, "doc", 12, index=i) if r.kind == "doc"]
    assert len(docs) == len(set(docs))
    lengths = [len(d.split("\n\nQuestion: ")[0]) / CPT for d in docs]
    assert all(10_000 - 1 <= n <= 14_000 + 1 for n in lengths)
    assert played(w, "chat", 3) == played(w, "chat", 3)  # seeded: the same workload for every front


@pytest.mark.parametrize("name", PLAIN)
def test_a_plain_workload_crosses_to_the_load_generator_whole(name, tmp_path):
    load = load_of(name, SEED, CPT, 30.0, EngineSettings(), tmp_path)
    w = workload(name)
    assert PlainWorkload.model_validate_json((tmp_path / "workload.json").read_text()) == w
    flags = dict(itertools.pairwise(load.flags))
    assert flags["--workload-file"] == str(tmp_path / "workload.json") and flags["-u"] == str(w.users)
    assert load.locustfile == LOCUSTFILES["plain"] and "no `X-Session-ID`" in load.description


def test_the_default_workload_is_todays():
    args = parse_args([])
    assert args.workloads == [SESSIONS]
    flags = dict(itertools.pairwise(workload_flags(SEED, CPT, 150)))
    assert {k: flags[k] for k in ("--chat-weight", "--doc-weight", "--doc-followups", "--chat-turns", "-u")} == {
        "--chat-weight": "4",
        "--doc-weight": "2",
        "--doc-followups": "1",
        "--chat-turns": "4",
        "-u": "6",
    }


def test_the_default_workload_runs_the_session_users(tmp_path):
    load = load_of(SESSIONS, SEED, CPT, 150, EngineSettings(), tmp_path)
    assert load.locustfile == LOCUSTFILES[SESSIONS] and not (tmp_path / "workload.json").exists()


def as_options(flags: list[str]) -> dict[str, str]:
    """Locust flags as option -> value (every flag of these workloads takes one)."""
    return dict(zip(flags[::2], flags[1::2], strict=True))


def test_the_documents_workload_is_the_session_document_users_alone(tmp_path):
    load = load_of(DOCUMENTS, SEED, CPT, 150, EngineSettings(), tmp_path)
    flags, sessions = as_options(load.flags), as_options(workload_flags(SEED, CPT, 150))
    assert load.locustfile == LOCUSTFILES[SESSIONS] and "no chat users" in load.description
    assert (flags["--chat-weight"], flags["-u"]) == ("0", "2")
    # everything else as the sessions workload: its documents, follow-ups and pacing
    assert {k: v for k, v in flags.items() if k not in ("--chat-weight", "-u")} == {
        k: v for k, v in sessions.items() if k not in ("--chat-weight", "-u")
    }
    assert DOCUMENTS in parse_args(["--workload", "all"]).workloads


def test_workload_all_runs_each_in_turn_and_an_unknown_one_is_refused(capsys):
    assert parse_args(["--workload", "all"]).workloads == list(WORKLOADS)
    assert parse_args(["--workload", "overflow,followups"]).workloads == ["overflow", "followups"]
    with pytest.raises(SystemExit):
        parse_args(["--workload", "sessions,nope"])
    assert "unknown ['nope']" in capsys.readouterr().err


# -- the engines' cache hits in the report ----------------------------------------------------------------------


def sample(user: str, intent: str, prompt: int | None, cached: int | None, status: int = 200) -> Sample:
    error = None if status == 200 else f"HTTP {status}"
    return Sample(
        user, intent, intent, status, 0.0, ttft_s=0.1, prompt_tokens=prompt, cached_tokens=cached, error=error
    )


def test_the_hit_rate_is_cached_over_prompt_tokens_of_the_answered_requests_that_report_both():
    samples = [
        sample("doc", "long", 12_000, 0),
        sample("doc", "short", 12_100, 11_990),
        sample("chat", "short", 100, 60),
        sample("chat", "short", 500, None),  # no cache report: not counted
        sample("chat", "short", None, None, status=500),  # failed
    ]
    assert cache_counts(samples) == (12_050, 24_200)
    assert hit_rate(samples) == pytest.approx(100 * 12_050 / 24_200)
    assert hit_rate(samples[3:]) is None and cache_counts([]) is None
    assert hit_rate([sample("chat", "short", 0, 0)]) is None  # nothing sent


def front(name: str, cached_followup: int, ttft_s: float = 0.1) -> Front:
    samples = [
        Sample("doc", "long", "long", 200, 0.0, ttft_s=1.0, prompt_tokens=10_000, cached_tokens=0),
        Sample("doc", "short", "short", 200, 2.0, ttft_s=ttft_s, prompt_tokens=10_000, cached_tokens=cached_followup),
        Sample("chat", "short", "short", 200, 3.0, ttft_s=0.05, prompt_tokens=100, cached_tokens=0),
    ]
    return Front(name, samples, 0.0, 1.0, 1.0)


def test_the_table_and_the_headline_give_the_hit_rates_and_this_app_against_cache_aware():
    app, peer = front("fairshare", 9_900, ttft_s=0.2), front("cache_aware", 0, ttft_s=0.8)
    peer.kv_pool_tokens = [65_536, 65_536]
    rows = table([app, peer]).splitlines()
    # fairshare: 9,900 of 20,100 prompt tokens from cache; cache_aware none.
    assert "| engine prefix-cache hit rate (%) | 49.3 | 0.0 | — |" in rows
    assert "| hit rate: follow-ups (%) | 99.0 | 0.0 | — |" in rows
    assert "| prompt tokens (engines' count) | 20,100 | 20,100 | — |" in rows
    assert "| KV pool per engine (tokens, sglang's count) | — | 65,536 / 65,536 | |" in rows
    lines = headline([("followups", [[app, peer]]), ("overflow", [[peer]])]).splitlines()
    assert lines[0] == "| workload | figure | fairshare | cache_aware | fairshare / cache_aware | each round |"
    assert "| followups | follow-up TTFT p50 (s) | 0.2 | 0.8 | 0.25x | 0.25x |" in lines
    assert "| followups | engine prefix-cache hit rate (%) | 49.3 | 0.0 | — | — |" in lines
    assert "| followups | failures | 0 | 0 | — | — |" in lines
    assert "| overflow | chat TTFT p99 (s) | — | 0.05 | — | — |" in lines  # this app did not run
    assert len(lines) == 2 + 2 * 8  # eight figures a workload
