"""`benchmarks.front_profile`: which layer of the front a py-spy sample of a Serve process is."""

from __future__ import annotations

from benchmarks.front_profile import ENTRY, OTHER, layers

THREAD = "thread (16617): AsyncIO Thread: default;Thread.run (threading.py:982)"
ASGI = (
    "ASGIAppReplicaWrapper.__call__ (ray/serve/_private/http_util.py:670);Starlette.__call__ (starlette/routing.py:96)"
)
HANDLER = "RequestIdMiddleware.__call__ (serve_app/api/request_log.py:85);Ingress.chat (serve_app/api/ingress.py:138)"
TOKENIZE = (
    "HFTokenizer.chat_ids (serve_app/tokenizer.py:117);_SegmentEncoder._encode (openai/parallel_prompt_encode.py:396)"
)
SERVE_ROUTER = "AsyncioRouter.assign_request (ray/serve/_private/router.py:1218)"
LANE_ROUTER = "LaneRouter.choose_replicas (serve_app/routing/lane_router.py:125)"
ENGINE = "thread (16643): sglang-engine-loop;EngineThread._run (serve_app/engines/sglang/engine_thread.py:33)"
SGLANG = "OpenAIServingChat._generate_chat_stream (openai/serving_chat.py:2493);sock_send (io_struct.py:2734)"


def test_a_sample_is_its_deepest_layers():
    raw = [
        f"{THREAD};{ASGI};{HANDLER};{TOKENIZE} 5",  # the tokenizer under the handler: the tokenizer's
        f"{THREAD};{ASGI};{HANDLER};{SERVE_ROUTER};{LANE_ROUTER} 4",  # the routing policy under Serve's router
        f"{THREAD};{ASGI};{HANDLER};{SERVE_ROUTER} 3",  # Serve's router under the handler: Serve's
        f"{THREAD};{ASGI};{HANDLER} 2",
        f"{THREAD};{ASGI} 1",
        f"{ENGINE};pump (serve_app/engines/sglang/engine_thread.py:79);{SGLANG} 7",  # the engine's loop: sglang's
        f"{THREAD};_run_once (asyncio/base_events.py:1922) 6",  # Python, in no layer
        f"{THREAD} 8",  # the thread's entry frame alone: native code, or a wait py-spy took for running
        f"{ENGINE} 9",  # the engine's loop waiting: not sglang's
        "",
    ]
    assert layers(raw) == {
        "tokenizer (this app)": 5,
        "routing policy (this app)": 4,
        "Serve's request router": 3,
        "API: middlewares, handlers, relay (this app)": 2,
        "Serve's replica": 1,
        "sglang's serving classes and tokenizer manager": 7,
        OTHER: 6,
        ENTRY: 17,
    }
