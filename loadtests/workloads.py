"""What plain OpenAI clients send in the peer benchmark (`loadtests.peers --workload NAME`): the conversation and
nothing else. No `X-Session-ID` header, no `user` field: a front that wants an engine's prefix cache must find it
from the prompt alone, as it must for any client of an OpenAI-compatible server.

Each workload is a `PlainWorkload` (chat users and document users, closed loop), played by
`loadtests.plain_users`; each user is a script (`chat_script`, `document_script`) that yields one `PlainRequest`
at a time and is sent the text the server answered, which the next turn re-sends:

- `followups`: documents (10-14k tokens), each followed by 1-2 follow-ups that re-send the conversation so far
  (the document prompt, the answer, the question), beside 4-turn chats.
- `multiturn`: 8-turn chats, each turn re-sending the history (user and assistant turns, the assistant's being
  the text the server answered), beside document users.
- `system_prompt`: every chat a new one: one long system prompt (1,500-3,000 tokens, drawn once from the seed)
  shared by all, then a short distinct question; beside document users.
- `overflow`: documents with follow-ups drawn at random from a fixed set of about `OVERFLOW_FACTOR` times the
  engines' KV pools together: caches evict, and a document comes back after its engine dropped it.

Texts are sized in the model's tokens (`chars_per_token`) and drawn from per-user seeded generators: one workload
for every front.
"""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from loadtests import prompts
from loadtests.settings import TokenSpec

PLAIN = ("followups", "multiturn", "system_prompt", "overflow")
PlainName = Literal["followups", "multiturn", "system_prompt", "overflow"]
Kind = Literal["chat", "doc", "followup"]
"""What a request is, as the report tells them apart: a chat turn, a document's first request, a follow-up."""
UserKind = Literal["chat", "doc"]
Message = dict[str, str]

OVERFLOW_FACTOR = 2.5
"""The overflow workload's distinct document tokens over the engines' KV pools together (2-3x: every document
cannot stay cached, and most come back after their engine evicted them)."""
SYSTEM_PROMPT_TOKENS = (1_500, 3_000)


@dataclass(frozen=True)
class PlainRequest:
    """One streamed chat completion as a plain client sends it: the whole conversation, no session named."""

    kind: Kind
    messages: list[Message]
    max_tokens: int
    path: ClassVar[str] = "/v1/chat/completions"

    @property
    def intent(self) -> str:
        """The traffic class the client means (`Sample.intent`): a document's first request is the long one."""
        return "long" if self.kind == "doc" else "short"

    def body(self, model: str) -> dict[str, Any]:
        # Usage in the stream: the engines' own prompt and cached-token counts (the report's hit rate).
        return {
            "model": model,
            "messages": self.messages,
            "max_tokens": self.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    def headers(self) -> dict[str, str]:
        """None: a plain client sends no `X-Session-ID`."""
        return {}


Script = Generator[PlainRequest, str | None, None]
"""A user's requests in order: `send(answer)` takes the text the server answered the last one (None at the start)
and gives the next."""


class PlainWorkload(BaseModel):
    """One plain workload: who sends what. Pacing (think time), seed and characters per token are the load
    generator's settings (`loadtests.settings.LoadSettings`), the same for every workload."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: PlainName
    chat_users: int = Field(4, ge=1)
    doc_users: int = Field(2, ge=1)
    question_tokens: TokenSpec = TokenSpec(low=20, high=60)
    chat_turns: int = Field(4, ge=1, description="Questions a chat lasts, each re-sending it; 1: every chat new.")
    chat_answer_tokens: int = Field(16, ge=1)
    system_prompt_tokens: int = Field(0, ge=0, description="A system prompt every chat starts with; 0: none.")
    doc_tokens: TokenSpec = TokenSpec(low=10_000, high=14_000)
    followups: tuple[int, int] = Field((1, 1), description="Follow-ups after each document: drawn from LOW-HIGH.")
    doc_answer_tokens: int = Field(16, ge=1)
    document_set: tuple[int, ...] = Field(
        (), description="Lengths of a fixed set of documents drawn at random, again and again; empty: each one new."
    )
    kv_pool_tokens: int = Field(0, ge=0, description="The engines' KV pools together `document_set` outgrows.")

    @model_validator(mode="after")
    def _followups_range(self) -> Self:
        low, high = self.followups
        if not 0 <= low <= high:
            raise ValueError(f"followups: need 0 <= low <= high, got {low}-{high}")
        return self

    @property
    def users(self) -> int:
        return self.chat_users + self.doc_users

    def describe(self) -> str:
        """One sentence with the numbers, for the result file."""
        q = self.question_tokens
        chats = "a new chat each question" if self.chat_turns == 1 else f"{self.chat_turns}-turn chats"
        if self.system_prompt_tokens:
            chats += f" after one {self.system_prompt_tokens:,}-token system prompt they all share"
        d = self.doc_tokens
        docs = f"a {d.low / 1000:g}-{d.high / 1000:g}k-token document"
        if self.document_set:
            tokens = sum(self.document_set)
            docs += f" drawn at random from a set of {len(self.document_set)} ({tokens:,} tokens"
            docs += (
                f", {tokens / self.kv_pool_tokens:.1f}x the engines' KV pools together)" if self.kv_pool_tokens else ")"
            )
        low, high = self.followups
        followups = "one follow-up" if low == high == 1 else f"{low}-{high} follow-ups"
        return (
            f"{self.chat_users} chat users ({chats}, {q.low}-{q.high}-token questions, {self.chat_answer_tokens} "
            f"output tokens), {self.doc_users} document users ({docs}, then {followups} re-sending the "
            f"conversation, {self.doc_answer_tokens} output tokens); plain clients: no `X-Session-ID`, no `user`"
        )


def followups() -> PlainWorkload:
    return PlainWorkload(name="followups", followups=(1, 2))


def multiturn() -> PlainWorkload:
    # Longer answers than a 4-turn chat's: the history each turn re-sends is mostly what the server said.
    return PlainWorkload(name="multiturn", chat_turns=8, chat_answer_tokens=32)


def system_prompt(seed: int) -> PlainWorkload:
    tokens = random.Random(f"{seed}-system-prompt").randint(*SYSTEM_PROMPT_TOKENS)
    return PlainWorkload(name="system_prompt", chat_turns=1, system_prompt_tokens=tokens)


def overflow(seed: int, kv_pool_tokens: int, factor: float = OVERFLOW_FACTOR) -> PlainWorkload:
    """Documents until their tokens exceed `factor` times `kv_pool_tokens` (the engines' pools together)."""
    spec, rng = PlainWorkload(name="overflow").doc_tokens, random.Random(f"{seed}-overflow")
    lengths: list[int] = []
    while sum(lengths) <= factor * kv_pool_tokens:
        lengths.append(spec.pick(len(lengths), rng))
    return PlainWorkload(name="overflow", followups=(1, 2), document_set=tuple(lengths), kv_pool_tokens=kv_pool_tokens)


def plain_workload(name: str, seed: int, kv_pool_tokens: int) -> PlainWorkload:
    """The workload `name` (one of `PLAIN`) for this seed; `kv_pool_tokens`: the engines' KV pools together."""
    builders: dict[str, Callable[[], PlainWorkload]] = {
        "followups": followups,
        "multiturn": multiturn,
        "system_prompt": lambda: system_prompt(seed),
        "overflow": lambda: overflow(seed, kv_pool_tokens),
    }
    if name not in builders:
        raise ValueError(f"unknown plain workload {name!r}; choose from {list(PLAIN)}")
    return builders[name]()


# -- the users' scripts ------------------------------------------------------------------------------------------


def system_turn(text: str) -> Message:
    return {"role": "system", "content": text}


def user_turn(text: str) -> Message:
    return {"role": "user", "content": text}


def assistant_turn(answer: str | None) -> Message:
    return {"role": "assistant", "content": answer or ""}


def chat_script(w: PlainWorkload, rng: random.Random, chars_per_token: float, seed: int) -> Script:
    """Chats of `chat_turns` questions, each turn the chat so far (its system prompt first, if any)."""
    head = [system_turn(shared_system_prompt(w, chars_per_token, seed))] if w.system_prompt_tokens else []
    while True:
        messages = list(head)
        for turn in range(w.chat_turns):
            messages = [*messages, user_turn(question(w, rng, chars_per_token))]
            answer = yield PlainRequest("chat", messages, w.chat_answer_tokens)
            if turn + 1 < w.chat_turns:
                messages = [*messages, assistant_turn(answer)]


def document_script(w: PlainWorkload, rng: random.Random, chars_per_token: float, seed: int, user_id: str) -> Script:
    """A document with a question, then its follow-ups, each the conversation so far; then the next document."""
    for n in itertools.count():
        doc = next_document(w, rng, chars_per_token, seed, f"{w.name}-{user_id}-{n}", n)
        messages = [user_turn(f"{doc}\n\nQuestion: {question(w, rng, chars_per_token)}")]
        answer = yield PlainRequest("doc", messages, w.doc_answer_tokens)
        for _ in range(rng.randint(*w.followups)):
            messages = [*messages, assistant_turn(answer), user_turn(question(w, rng, chars_per_token))]
            answer = yield PlainRequest("followup", messages, w.doc_answer_tokens)


def script(w: PlainWorkload, kind: UserKind, index: int, chars_per_token: float, seed: int) -> Script:
    """The script of the `index`-th user of `kind`: seeded by the workload, the kind and the index alone."""
    rng = random.Random(f"{seed}-{w.name}-{kind}-{index}")
    if kind == "chat":
        return chat_script(w, rng, chars_per_token, seed)
    return document_script(w, rng, chars_per_token, seed, f"{kind}{index}")


def question(w: PlainWorkload, rng: random.Random, chars_per_token: float) -> str:
    return prompts.question(w.question_tokens.pick(0, rng), chars_per_token, rng)


def next_document(
    w: PlainWorkload, rng: random.Random, chars_per_token: float, seed: int, fresh_id: str, n: int
) -> str:
    """A new document named `fresh_id` (the user's `n`-th), or one of the fixed set (`document_set`) drawn at random."""
    if w.document_set:
        k = rng.randrange(len(w.document_set))
        return set_document(seed, k, w.document_set[k], chars_per_token)
    return prompts.document(fresh_id, w.doc_tokens.pick(n, rng), chars_per_token, rng)


@functools.cache
def set_document(seed: int, k: int, tokens: int, chars_per_token: float) -> str:
    """The `k`-th document of a fixed set: the same text whichever user draws it, every time."""
    return prompts.document(f"set-{k}", tokens, chars_per_token, random.Random(f"{seed}-set-document-{k}"))


def shared_system_prompt(w: PlainWorkload, chars_per_token: float, seed: int) -> str:
    return prompts.system_prompt(w.system_prompt_tokens, chars_per_token, random.Random(f"{seed}-system-prompt-text"))
