"""The sim engine's OpenAI serving, in the engine replica: what sglang's serving classes are for sglang.

The client's body is validated against the sim's documented subset of fields (`openai_models`: a 400 names any
other), its prompt rendered and counted with the sim's tokenizer, checked against the context window, and
generated; the engine's `Chunk`s are written as OpenAI's response: a whole JSON body, or SSE events (one
write per chunk, `[DONE]` last). A request the engine refuses is an error response with its status.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable

from pydantic import BaseModel

from serve_app.api.request_rules import check_context_window, parse_request
from serve_app.engines.sim.formats import FORMATS, ResponseFormat, ResponseIds
from serve_app.engines.sim.generation import Chunk, GenerateRequest, RequestError
from serve_app.off_loop import off_loop
from serve_app.protocol.errors import OpenAIError
from serve_app.protocol.openai_models import SamplingRequest, Usage, now_s
from serve_app.protocol.sse import EventTemplate, sse
from serve_app.replica.backend import (
    JSON,
    SSE,
    OpenAIRequest,
    ResponseBody,
    ResponsePart,
    ResponseStart,
    error_response,
)
from serve_app.tokenizer import PromptTokenizer

Generate = Callable[[GenerateRequest], AsyncGenerator[Chunk, None]]


def json_bytes(model: BaseModel) -> bytes:
    """`model` as Starlette's `JSONResponse` writes it (compact, UTF-8), the bytes every JSON answer has."""
    return json.dumps(
        model.model_dump(), ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
    ).encode()


class _Answer:
    """One request's answer as it is written: its ids, the prompt's size, the usage so far."""

    def __init__(self, fmt: ResponseFormat, ids: ResponseIds, prompt_tokens: int, first: Chunk) -> None:
        self.fmt = fmt
        self.ids = ids
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = first.cached_tokens or 0

    def usage(self, completion_tokens: int) -> Usage:
        return Usage.of(self.prompt_tokens, completion_tokens, self.cached_tokens)


class SimServing:
    def __init__(
        self,
        model_id: str,
        tokenizer: PromptTokenizer,
        context_limit_tokens: int | None,
        default_max_tokens: int,
        generate: Generate,
    ) -> None:
        self.model_id = model_id
        self.tokenizer = tokenizer
        self.context_limit_tokens = context_limit_tokens
        self.default_max_tokens = default_max_tokens
        self._generate = generate

    async def respond(self, request: OpenAIRequest) -> AsyncGenerator[list[ResponsePart], None]:
        fmt = FORMATS[request.kind]
        try:
            body: SamplingRequest = parse_request(fmt.request_model, request.body, f"{request.kind} on the sim backend")
            generate_request = await self._generate_request(fmt, body, request)
        except OpenAIError as e:
            yield error_response(e)
            return
        chunks = self._generate(generate_request)
        async with contextlib.aclosing(chunks):
            try:
                first = await anext(chunks)
            except RequestError as e:
                yield error_response(OpenAIError.of_status(e.status, e.message))
                return
            ids = ResponseIds(request.rid, now_s(), self.model_id)
            answer = _Answer(fmt, ids, generate_request.prompt_tokens, first)
            if body.stream:
                parts = self._events(answer, first, chunks, body.include_usage)
            else:
                parts = self._whole(answer, first, chunks)
            async for batch in parts:
                yield batch

    async def _generate_request(
        self, fmt: ResponseFormat, body: SamplingRequest, request: OpenAIRequest
    ) -> GenerateRequest:
        """The engine's request: the prompt rendered and counted, its output limit within the context window."""
        prompt = fmt.prompt(body, self.tokenizer)
        prompt_ids = await off_loop(self.tokenizer.count(prompt), self.tokenizer.text_ids, prompt)
        max_tokens = body.output_limit or self.default_max_tokens
        check_context_window(len(prompt_ids), max_tokens, self.context_limit_tokens, fmt.endpoint.prompt_param)
        return GenerateRequest(
            rid=request.rid,
            prompt_text=prompt,
            prompt_ids=prompt_ids,
            max_tokens=max_tokens,
            session_id=request.session_id,
            stop=body.stop_sequences,
            traffic_class=request.traffic_class,
            tenant=request.tenant,
            tenant_weight=request.tenant_weight,
        )

    async def _whole(
        self, answer: _Answer, first: Chunk, chunks: AsyncIterator[Chunk]
    ) -> AsyncIterator[list[ResponsePart]]:
        parts, last = [first.text], first
        try:
            async for chunk in _rest(first, chunks):
                parts.append(chunk.text)
                last = chunk
        except RequestError as e:
            yield error_response(OpenAIError.of_status(e.status, e.message))
            return
        usage = answer.usage(last.completion_tokens)
        response = answer.fmt.response(answer.ids, "".join(parts), last.finish_reason, usage)
        yield [ResponseStart(200, JSON), ResponseBody(json_bytes(response))]

    async def _events(
        self, answer: _Answer, first: Chunk, chunks: AsyncIterator[Chunk], include_usage: bool
    ) -> AsyncIterator[list[ResponsePart]]:
        """One write per chunk: its SSE events together (the first with the stream's head and opening events)."""
        fmt, ids = answer.fmt, answer.ids
        # Chunks carry `usage: null` only when the client asked for usage (OpenAI's shape).
        exclude = None if include_usage else {"usage"}
        delta = EventTemplate(fmt.delta(ids, EventTemplate.SLOT), exclude=exclude)
        head: list[ResponsePart] = [ResponseStart(200, SSE)]
        events = [sse(e, exclude=exclude) for e in fmt.opening(ids)]
        chunk: Chunk | None = first
        while chunk is not None:
            if chunk.text:
                events.append(delta(chunk.text))
            if chunk.finish_reason is not None:
                events.append(sse(fmt.finish(ids, chunk.finish_reason), exclude=exclude))
                if include_usage:
                    events.append(sse(fmt.usage(ids, answer.usage(chunk.completion_tokens))))
                events.append(sse("[DONE]"))
            yield [*head, ResponseBody("".join(events).encode())]
            head, events = [], []
            if chunk.finish_reason is not None:
                return
            try:
                chunk = await anext(chunks, None)
            except RequestError as e:
                # Headers are sent: the error goes in the stream, and the stream still ends properly.
                error = OpenAIError.of_status(e.status, e.message).stream_end()
                yield [ResponseBody(error, error_status=e.status)]
                return


async def _rest(first: Chunk, chunks: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
    """The chunks after `first`, up to the one that finishes (none when `first` does)."""
    if first.finish_reason is not None:
        return
    async for chunk in chunks:
        yield chunk
        if chunk.finish_reason is not None:
            return
