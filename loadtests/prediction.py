"""The simulator's prediction for a load test: the same users, closed loop, on `scheduler.sim`'s engine.

Locust's users are closed loop (a user sends its next request a think time after the previous
answer), so the offline prediction replays that loop on a virtual clock rather than a fixed arrival
list: chat users and document users of the shape's stages, the same document lengths, follow-ups,
`max_tokens` and think times, on `SimEngine` with a rule set (`baseline` = upstream, `fairshare`).
Requests still running when the shape ends are dropped, as Locust drops them. One engine replica
(the benchmark's setup); prompts are counted as the `sim` backend's tokenizer counts them.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

from loadtests.recording import Sample
from loadtests.settings import LoadSettings
from loadtests.stages import Stage
from scheduler.interleave import PassKind
from scheduler.sim.engine import SimEngine
from scheduler.sim.presets import Preset
from scheduler.sim.request import SimRequest, TrafficClass
from scheduler.sim.rules import make_scheduler

CACHE_BLOCK_TOKENS = 64
"""The sim backend caches a session's context in blocks of this many tokens."""
TEMPLATE_CHARS = len("<|user|>\n\n<|assistant|>\n")
QUESTION_JOIN_CHARS = len("\n\nQuestion: ")


@dataclass
class Ask:
    """One request a simulated user sends."""

    prompt_tokens: int
    cached_tokens: int
    output_tokens: int


class _User:
    """A simulated user: `script()` yields requests and receives each one's finished `SimRequest`."""

    kind = ""

    def __init__(self, s: LoadSettings, rng: random.Random, doc_index: Iterator[int]) -> None:
        self.s, self.rng, self.doc_index = s, rng, doc_index
        self.context_chars = 0

    def think_s(self) -> float:
        return self.rng.uniform(*self.s.think_s)

    def question_chars(self) -> int:
        return round(self.s.question_tokens.pick(next(_questions), self.rng) * self.s.chars_per_token)

    def turn(self, new_chars: int, max_tokens: int, new_session: bool) -> Ask:
        """A turn of a conversation: the transcript so far (cached in blocks) plus the new user message."""
        cpt = self.s.chars_per_token
        if new_session:
            self.context_chars = 0
        cached_chars = self.context_chars
        self.context_chars += new_chars + TEMPLATE_CHARS
        prompt = max(1, math.ceil(self.context_chars / cpt))
        cached = min(prompt - 1, int(cached_chars / cpt) // CACHE_BLOCK_TOKENS * CACHE_BLOCK_TOKENS)
        return Ask(prompt, max(0, cached), max_tokens)

    def answered(self, output_tokens: int) -> None:
        # The answer joins the transcript; the sim's synthetic words average ~6 characters a token.
        self.context_chars += output_tokens * 6


class _Chat(_User):
    kind = "chat"

    def script(self) -> Iterator[tuple[float, Ask | None]]:
        """(think time before, request) pairs."""
        while True:
            for i in range(self.s.chat_turns):
                ask = self.turn(self.question_chars(), self.s.chat_max_tokens, new_session=i == 0)
                yield self.think_s(), ask


class _Doc(_User):
    kind = "doc"

    def script(self) -> Iterator[tuple[float, Ask | None]]:
        docs = 0
        first = True
        while not self.s.docs_per_user or docs < self.s.docs_per_user:
            tokens = self.s.doc_tokens.pick(next(self.doc_index), self.rng)
            chars = round(tokens * self.s.chars_per_token) + QUESTION_JOIN_CHARS + self.question_chars()
            yield (0.0 if first else self.think_s()), self.turn(chars, self.s.doc_max_tokens, new_session=True)
            first, docs = False, docs + 1
            for _ in range(self.s.doc_followups):
                yield self.think_s(), self.turn(self.question_chars(), self.s.doc_max_tokens, new_session=False)


_questions = itertools.count()


def population(stage: Stage, s: LoadSettings, chat_users_fixed: int | None) -> tuple[int, int]:
    """(chat users, document users) in a stage, as Locust's dispatcher fills it."""
    if chat_users_fixed is not None:
        chats = min(stage.users, chat_users_fixed)
        return chats, stage.users - chats
    # Classes sorted by name (ChatUser, DocumentUser), as Locust sorts them.
    picks = itertools.islice(_weighted_order([("chat", s.chat_weight), ("doc", s.doc_weight)]), stage.users)
    counts = collections.Counter(picks)
    return counts["chat"], counts["doc"]


def _weighted_order(weights: list[tuple[str, int]]) -> Iterator[str]:
    """The order in which Locust's dispatcher picks weighted user classes (`locust.dispatch._kl_generator`:
    next is the class whose pick lowers the Kullback-Leibler divergence from the weights most). Written out
    here because importing Locust into this process would monkey-patch it with gevent."""
    heap = [(w * math.log2(w / (w + 1.0)), w + 1.0, w, name) for name, w in weights if w > 0]
    heapq.heapify(heap)
    while True:
        _, x, w, name = heap[0]
        yield name
        heapq.heapreplace(heap, (w * math.log2(x / (x + 1.0)), x + 1.0, w, name))


def predict(
    s: LoadSettings,
    stages: list[Stage],
    preset: Preset,
    spec: str,
    chat_users_fixed: int | None = None,
    long_prompt_tokens: int = 2048,
    seed: int = 0,
) -> list[Sample]:
    """Run the shape's users on the simulated engine; the requests that finished, as client samples
    (engine seconds; `sent_at_s` from the start of the run). `long_prompt_tokens` classes them as the
    router does: uncached prompt above it = long."""
    rng = random.Random(seed)
    doc_index = itertools.count()
    engine = SimEngine(preset.cost, make_scheduler(spec, preset))
    end_s = stages[-1].until_s
    ready: list[tuple[float, int, Iterator, _User]] = []  # (time, tie-break, script, user)
    seq = itertools.count()
    inflight: dict[str, tuple[SimRequest, _User, Iterator]] = {}
    finished: list[tuple[SimRequest, _User]] = []
    have = {"chat": 0, "doc": 0}
    start_s = 0.0
    for stage in stages:
        want = dict(zip(("chat", "doc"), population(stage, s, chat_users_fixed), strict=True))
        for kind, cls in (("chat", _Chat), ("doc", _Doc)):
            for _ in range(want[kind] - have[kind]):
                user = cls(s, rng, doc_index)
                script = user.script()
                think, ask = next(script)
                # A chat user thinks before its first question; a document user sends at once.
                heapq.heappush(ready, (start_s + think, next(seq), (think, ask), script, user))
            have[kind] = max(have[kind], want[kind])
        start_s = stage.until_s

    now = 0.0
    last_doc_s = -math.inf
    while True:
        while ready and ready[0][0] <= now:
            t, order, (think, ask), script, user = heapq.heappop(ready)
            if t >= end_s or ask is None:
                continue
            if user.kind == "doc" and ask.cached_tokens == 0:  # a new document keeps --doc-gap-s from the last
                if t < last_doc_s + s.doc_gap_s:
                    heapq.heappush(ready, (last_doc_s + s.doc_gap_s, order, (think, ask), script, user))
                    continue
                last_doc_s = t
            req = SimRequest(
                rid=f"{user.kind}-{next(seq)}",
                prompt_tokens=ask.prompt_tokens,
                output_tokens=ask.output_tokens,
                arrival_s=t,
                cached_tokens=ask.cached_tokens,
            )
            req.traffic_class = (
                TrafficClass.LONG if req.prompt_tokens - req.cached_tokens > long_prompt_tokens else TrafficClass.SHORT
            )
            engine.add(req)
            inflight[req.rid] = (req, user, script)
        if now >= end_s:
            break
        if engine.idle:
            if not ready:
                break
            now = ready[0][0]
            continue
        res = engine.step(now)
        if res.kind is PassKind.IDLE:
            if not ready:
                break
            now = ready[0][0]
            continue
        now = res.end_s
        for rid in res.finished:
            req, user, script = inflight.pop(rid)
            finished.append((req, user))
            user.answered(req.num_generated)
            nxt = next(script, None)
            if nxt is not None:
                heapq.heappush(ready, (now + nxt[0], next(seq), nxt, script, user))
    return [_sample(r, u) for r, u in finished if r.finish_s is not None and r.finish_s <= end_s]


def _sample(r: SimRequest, user: _User) -> Sample:
    t = r.token_times_s
    return Sample(
        user=user.kind,
        intent=r.traffic_class.value,
        traffic_class=r.traffic_class.value,
        status=200,
        sent_at_s=r.arrival_s,
        ttft_s=r.ttft_s,
        e2e_s=r.finish_s - r.arrival_s,
        itl_s=[b - a for a, b in itertools.pairwise(t)],
        output_tokens=r.num_generated,
        prompt_tokens=r.prompt_tokens,
        cached_tokens=r.cached_tokens,
    )
