"""The simulated engine's generation: `SimGenerator.generate` takes a `GenerateRequest` and streams `Chunk`s.

`serving` turns an OpenAI request into a `GenerateRequest` and the `Chunk`s back into OpenAI's response.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

from scheduler.sim.engine import SimEngine
from scheduler.sim.request import SimRequest
from scheduler.tenants import DEFAULT_TENANT
from scheduler.traffic import TrafficClass
from serve_app.engines.sim.loop import EngineLoop
from serve_app.engines.sim.prefix_cache import PrefixCache
from serve_app.engines.sim.stop import StopMatcher
from serve_app.engines.sim.streams import Streams, next_progress
from serve_app.engines.sim.synthetic_text import synthetic_text
from serve_app.off_loop import off_loop
from serve_app.protocol.openai_models import FinishReason
from serve_app.replica.backend import EngineCounters
from serve_app.routing.prefix_pages import TokenIds


class RequestError(Exception):
    """The engine refused or aborted a request for a reason the client should hear (it can never fit in KV).
    Any other exception from the engine is a bug: a 500, never a 4xx."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    rid: str
    prompt_text: str
    prompt_ids: TokenIds
    max_tokens: int
    session_id: str | None = None
    stop: tuple[str, ...] = ()
    traffic_class: TrafficClass = TrafficClass.SHORT
    """The router's class for this request, for the engine's records."""
    tenant: str = DEFAULT_TENANT
    """Whom the request is billed to: the engine's policy shares passes among tenants."""
    tenant_weight: float | None = None
    """The tenant's weight from the key table; None: the policy's own weight for the tenant, else 1."""

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)


@dataclass(frozen=True, slots=True)
class Chunk:
    """What a stream yields: the tokens ready now, coalesced (one chunk per look, not per token)."""

    text: str = ""
    num_tokens: int = 0
    """Output tokens this chunk carries."""
    cached_tokens: int | None = None
    """Set on a stream's first chunk: prompt tokens served from the prefix cache."""
    finish_reason: FinishReason | None = None
    """Set on a stream's last chunk."""
    completion_tokens: int = 0
    """Output tokens so far, this chunk included."""


class SimGenerator:
    """Generation on the simulated engine: admit a request (its cached prefix matched), stream its chunks as the
    engine loop makes its tokens, and free its slot and KV when it ends or its consumer leaves."""

    def __init__(
        self,
        engine: SimEngine,
        loop: EngineLoop,
        streams: Streams,
        cache: PrefixCache,
        context_ids: Callable[[str, TokenIds, str], TokenIds],
        counters: EngineCounters,
        natural_output_tokens: int,
    ) -> None:
        self.engine, self.loop, self.streams, self.cache = engine, loop, streams, cache
        self.context_ids = context_ids
        """The engine's tokenizer (`ApproxTokenizer.extended_ids`): a finished request's context (prompt and answer)
        is cached as its token ids, the prompt's all but its last kept as they are."""
        self.counters = counters
        self.natural_output_tokens = natural_output_tokens

    def output_plan(self, max_tokens: int) -> tuple[int, FinishReason]:
        """How many tokens the answer has and why it ends: its natural length (`stop`) or `max_tokens` (`length`)."""
        natural = self.natural_output_tokens
        return (max_tokens, "length") if max_tokens < natural else (natural, "stop")

    def _admit(self, request: GenerateRequest, blocks: tuple[int, ...]) -> SimRequest:
        if request.rid in self.streams:
            raise RuntimeError(f"request id {request.rid!r} is already running")  # ids are unique: a bug
        cached = min(self.cache.match(request.prompt_ids, blocks), request.prompt_tokens - 1)
        num_output, _ = self.output_plan(request.max_tokens)
        sim_req = SimRequest(
            rid=request.rid,
            prompt_tokens=request.prompt_tokens,
            output_tokens=num_output,
            arrival_s=asyncio.get_running_loop().time(),
            traffic_class=request.traffic_class,
            cached_tokens=max(0, cached),
            session=request.session_id,
            tenant=request.tenant,
            tenant_weight=request.tenant_weight,
        )
        try:
            self.engine.add(sim_req)
        except ValueError as e:  # the engine's one refusal: the request can never fit in its KV pool
            raise RequestError(400, str(e)) from None
        return sim_req

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
        # The prompt is hashed once: its blocks are matched now and cached with its answer at the end. Reading a
        # 100k-token document again when it ends held this replica's event loop (every stream on it) for ~30 ms.
        blocks = await off_loop(request.prompt_tokens, self.cache.blocks, request.prompt_ids)
        sim_req = self._admit(request, blocks)
        queue = self.streams.open(request.rid)
        self.loop.wake()
        _, natural_reason = self.output_plan(request.max_tokens)
        stop = StopMatcher(request.stop)
        completed = False
        produced = 0
        output: list[str] = []
        cached_first: int | None = sim_req.cached_tokens  # reported with the first chunk
        try:
            while not completed:
                progress = await next_progress(queue)
                if progress.aborted:
                    return
                upto = produced if progress.num_generated is None else progress.num_generated
                finish: FinishReason | None = natural_reason if progress.finished else None
                text, stopped = stop.feed(synthetic_text(produced, upto))
                if stopped:
                    finish = "stop"
                    self.engine.abort(request.rid)  # the answer is complete: free its slot and KV now
                elif finish is not None:
                    text += stop.flush()
                num_new, produced = upto - produced, upto
                output.append(text)
                completed = finish is not None
                yield Chunk(text, num_new, cached_first, finish, produced)
                cached_first = None
        finally:
            self.streams.close(request.rid)
            if completed:
                self.counters.num_finished += 1
                context = self.context_ids(request.prompt_text, request.prompt_ids, "".join(output))
                whole = (request.prompt_tokens - 1) // self.cache.block_tokens  # blocks before the prompt's last token
                self.cache.store(context, known=blocks[:whole])
            elif self.engine.abort(request.rid):
                # Client went away (or the replica is stopping): free the queue slot and the KV now.
                self.counters.num_aborted += 1
                self.loop.wake()
