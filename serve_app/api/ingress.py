"""The OpenAI-compatible ingress: validate, tokenize the prompt, read the session, route to the engine lanes, relay.

Chat and completions run one path (`Ingress._respond`), whatever the backend: the ingress names the request's
tenant (`tenants.tenancy`: its API key's, else `X-Tenant`, else `user`, else the default one), checks what does
not depend on the engine (the body is a JSON object, the model, the session id, if any), tokenizes the prompt as
the engine will and hashes its prefix pages for routing (`endpoints`, `routing.prefix_pages`), and sends the
client's body unchanged to an engine replica, whose backend validates it against what it implements and writes
the OpenAI response (sglang: sglang's own serving classes; sim: `engines.sim.serving`, a documented subset of
fields, a 400 naming any other). The ingress relays those bytes (`relay`): errors,
cancellation and TTFT/ITL are handled there once. `/v1/embeddings` goes to the `Embedder` deployment, chosen
by model name; `/v1/models` lists each model with its kind.

Every error is an OpenAI error body (400 bad input, 404 unknown model or route, 429 + Retry-After when the
engine lanes are full (the lane router sheds when every replica its lanes allow is over a backpressure limit;
a replica over its limit on arrival answers the same) or the tenant is over its own limit, 503 with no replica,
the engine's status when it refuses a request, 500 otherwise, never a stack trace); once a stream has started, an
error is an SSE error event followed by `[DONE]`. Every answered request, errors included, is counted in
`fairshare_requests_total`. Responses the engine wrote carry `X-Lane`, `X-Replica`, `X-Session-ID`, `X-Route`,
`X-Traffic-Class`, `X-Tenant` and `Server-Timing` (an error answered once the tenant is named carries `X-Tenant`
too); every response carries `X-Request-ID` (`http_app`: the middlewares and error handlers). An engine replica
that dies under a request fails only that request: before its first token nothing has reached the client (not
even the status line), so it is routed again once, transparently (503 if that replica is lost too); once tokens
are streaming, an SSE error event then `[DONE]`.
"""

# No `from __future__ import annotations` here: Serve rebuilds the routes in the replica, and FastAPI must read
# their annotations as classes (a string `Request` would become a query parameter).
import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any, cast

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from ray import serve
from ray.serve.handle import DeploymentHandle

from serve_app.api.auth import process_key_table
from serve_app.api.endpoints import CHAT, COMPLETIONS, Endpoint
from serve_app.api.http_app import CHAT_PATH, COMPLETIONS_PATH, EMBEDDINGS_PATH, api
from serve_app.api.relay import EngineCall, call_error, cancel, relay, response_of, start, whole_body
from serve_app.api.request_count import Outcome, counting
from serve_app.api.request_log import configure_logging
from serve_app.api.request_rules import SESSION_HEADER, body_bytes, parse_session_id, parsed_body
from serve_app.api.routed_call import RoutedCall
from serve_app.config import AppConfig, RoutingKnobs, validate
from serve_app.metrics import IngressMetrics, TenantLabels
from serve_app.protocol.errors import OpenAIError
from serve_app.replica.backend import SSE, OpenAIRequest
from serve_app.routing.prefix_pages import TokenIds, page_hashes
from serve_app.routing.records import RouteHint, RouteTicket
from serve_app.tenants.tenancy import TENANT_HEADER, Tenant, request_tenant
from serve_app.tokenizer import make_tokenizer

logger = logging.getLogger(__name__)

CHAT_KIND, EMBEDDING_KIND = "chat", "embedding"
INLINE_TOKENIZE_BYTES = 4096
"""The largest body whose prompt the ingress tokenizes on its event loop: about a millisecond with the model's
tokenizer and chat template (1.4 ms for a 4 kB chat, 5 ms for 16 kB, on one core of the CPU test machine)."""


# Module functions the Ingress class uses are defined above it: Serve pickles the class when it is
# decorated, and a name defined below it would be missing in the replica.
def _session_of(request: Request, user: Any) -> str | None:
    """The session header, else the `user` field, else none (placement follows the prompt's prefix; a session is a
    hint)."""
    # A `user` that is not a string is the engine's to refuse: it names no session.
    user_session = parse_session_id(user, "user") if isinstance(user, str) else None
    return parse_session_id(request.headers.get(SESSION_HEADER)) or user_session


@contextlib.contextmanager
def _tenant_named(tenant: Tenant) -> Iterator[None]:
    """An error answered for the request names its tenant (`X-Tenant`), as its other answers do."""
    try:
        yield
    except OpenAIError as e:
        e.headers.setdefault(TENANT_HEADER, tenant.name)
        raise


@serve.deployment(name="Ingress")
@serve.ingress(api)
class Ingress:
    def __init__(
        self,
        engine: DeploymentHandle[Any],
        app_config: dict[str, Any],
        embedder: DeploymentHandle[Any] | None = None,
    ) -> None:
        self.cfg: AppConfig = validate(AppConfig, app_config, "args")
        self.model_id = self.cfg.served_model_id
        self.embedder = embedder
        self.model_kinds = {self.model_id: CHAT_KIND}
        if self.cfg.embeddings is not None:
            self.model_kinds[self.cfg.embeddings.served_model_id] = EMBEDDING_KIND
        self.tokenizer = make_tokenizer(self.cfg)
        self.engine_stream = engine.options(stream=True)
        self.engine = engine
        self.knobs = RoutingKnobs()
        self.metrics = IngressMetrics(TenantLabels(self.cfg.tenant_metric_labels))
        api.state.metrics = self.metrics  # the exception handlers count the requests they answer
        api.state.max_body_bytes = self.cfg.request_bytes_limit
        process_key_table()  # a bad FAIRSHARE_API_KEY[S_FILE|_FILE] stops the replica at start, naming the variable
        configure_logging()

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        self.knobs = validate(RoutingKnobs, user_config, "Ingress.user_config")
        logger.info("routing knobs: %s", self.knobs.model_dump())

    # -- routes ----------------------------------------------------------------------------
    @api.get("/health")
    async def health(self) -> dict[str, str]:
        return {"status": "ok", "model": self.model_id}

    @api.get("/v1/models")
    async def models(self) -> dict[str, Any]:
        cards = [
            {"id": model, "object": "model", "created": 0, "owned_by": "fairshare-serve", "kind": kind}
            for model, kind in self.model_kinds.items()
        ]
        return {"object": "list", "data": cards}

    @api.get("/admin/replicas/{replica_id}")
    async def replica(self, replica_id: str) -> dict[str, Any]:
        hint = RouteHint(session_id=None, prompt_tokens=1, knobs=self.knobs, target_replica=replica_id)
        info: dict[str, Any] = await self.engine.describe.remote(route=RouteTicket(hint))
        if info.get("replica") != replica_id:
            raise OpenAIError(404, f"no engine replica {replica_id!r}", type="not_found_error")
        return info

    @api.post(CHAT_PATH)
    async def chat_completions(self, request: Request) -> Response:
        return await self._respond(CHAT, request)

    @api.post(COMPLETIONS_PATH)
    async def completions(self, request: Request) -> Response:
        return await self._respond(COMPLETIONS, request)

    @api.post(EMBEDDINGS_PATH)
    async def embeddings(self, request: Request) -> Response:
        with counting(self.metrics, "embeddings") as outcome:
            raw = parsed_body(request)
            tenant = request_tenant(request.scope, raw)
            with _tenant_named(tenant):
                self._check_model(raw.get("model"), EMBEDDING_KIND)
                assert self.embedder is not None  # a model of kind embedding exists only with an Embedder
                try:
                    parts = await self.embedder.embed.remote(raw, f"embd-{uuid.uuid4().hex}")
                except BaseException as e:
                    raise call_error(e, self.metrics, tenant.name, "embedding replicas") from None
            response = response_of(parts)
            response.headers[TENANT_HEADER] = tenant.name
            outcome.status = str(response.status_code)
            return response

    # -- the one path ------------------------------------------------------------------------
    def _check_model(self, model: Any, kind: str) -> None:
        if not isinstance(model, str):
            raise OpenAIError(400, "model: a model id (string) is required.", param="model")
        served = self.model_kinds.get(model)
        if served is None:
            raise OpenAIError(
                404,
                f"The model {model!r} does not exist; this server serves {sorted(self.model_kinds)}.",
                type="not_found_error",
                code="model_not_found",
                param="model",
            )
        if served != kind:
            raise OpenAIError(
                400,
                f"The model {model!r} is a {served} model; this endpoint needs a {kind} model.",
                param="model",
                code="wrong_model_kind",
            )

    async def _routing_prompt(
        self, endpoint: Endpoint, raw: dict[str, Any], size_bytes: int
    ) -> tuple[TokenIds, tuple[int, ...]]:
        """The prompt's token ids and prefix pages for routing. The model's tokenizer runs on a worker thread for a
        body over `INLINE_TOKENIZE_BYTES` (`size_bytes`): inline, it held this replica's event loop, which serves
        every other stream here, for ~1 s on an 800k-character document. A chat's is tokenized inline, without the
        hop to a thread and back (receipt to the engine call, an idle CPU app: 0.55 ms inline against 0.8)."""
        if self.tokenizer.blocking and size_bytes > INLINE_TOKENIZE_BYTES:
            return await asyncio.to_thread(self._read_prompt, endpoint, raw)
        return self._read_prompt(endpoint, raw)

    def _read_prompt(self, endpoint: Endpoint, raw: dict[str, Any]) -> tuple[TokenIds, tuple[int, ...]]:
        ids = endpoint.prompt_ids(raw, self.tokenizer)
        return ids, page_hashes(ids)

    async def _respond(self, endpoint: Endpoint, request: Request) -> Response:
        """Route the client's request as it came and relay the response the engine wrote (status, JSON or SSE
        bytes), for the request's tenant."""
        received_s = time.perf_counter()
        with counting(self.metrics, endpoint.name) as outcome:
            raw = parsed_body(request)
            tenant = request_tenant(request.scope, raw)
            with _tenant_named(tenant):
                return await self._route_and_relay(endpoint, request, raw, tenant, received_s, outcome)

    async def _route_and_relay(
        self,
        endpoint: Endpoint,
        request: Request,
        raw: dict[str, Any],
        tenant: Tenant,
        received_s: float,
        outcome: Outcome,
    ) -> Response:
        """Client disconnect cancels the engine call, which aborts the request in the engine."""
        stream: EngineCall | None = None
        consumed = False  # the engine's whole answer was read: nothing left to cancel
        try:
            self._check_model(raw.get("model"), CHAT_KIND)
            ids, pages = await self._routing_prompt(endpoint, raw, body_bytes(request))
            prompt_tokens = max(1, len(ids))
            session_id = _session_of(request, raw.get("user"))
            rid = f"{endpoint.id_prefix}-{uuid.uuid4().hex}"
            call = RoutedCall(session_id, received_s, tenant.name)
            # sglang takes the ids the ingress made (its own tokenizer and template): tokenized once.
            passed_ids = list(ids) if self.cfg.backend == "sglang" and ids else None
            engine_request = OpenAIRequest(
                endpoint.name,
                raw,
                rid,
                session_id,
                prompt_tokens,
                prompt_ids=passed_ids,
                tenant=tenant.name,
                tenant_weight=tenant.weight,
            )
            hint = RouteHint(
                session_id,
                prompt_tokens,
                pages,
                self.knobs,
                request_id=rid,
                tenant=tenant.name,
                tenant_max_queued_prefill_tokens=tenant.max_queued_prefill_tokens,
            )
            stream, head, first, ticket = await start(
                # A handle with `stream=True` answers with a generator.
                lambda t: cast(EngineCall, self.engine_stream.respond.remote(engine_request, route=t)),
                RouteTicket(hint),
                self.metrics,
                endpoint.text_field,
            )
            call.routed(ticket)
            if head.media_type == SSE and head.status < 400:
                outcome.status = Outcome.STREAMING
                events = relay(stream, first, call, endpoint, self.metrics)
                return StreamingResponse(
                    events, status_code=head.status, media_type=head.media_type, headers=call.headers()
                )
            body = await whole_body(stream, first, call, endpoint, self.metrics, timed=head.status < 400)
            consumed = True
            outcome.status = str(head.status)
            return Response(body, status_code=head.status, media_type=head.media_type, headers=call.headers())
        finally:
            if stream is not None and not consumed and not outcome.handed_over:
                cancel(stream)
