"""A plain prompt is tokenized once, at the ingress: sglang's serving classes take the ingress's token ids
(`given_ids`) instead of tokenizing again, and any other request keeps sglang's own path.

These drive sglang 0.5.23's REAL `OpenAIServingChat` / `OpenAIServingCompletion` through `SglangOpenAI.respond`,
with the tiny model's real tokenizer and chat template; only the tokenizer manager's `generate_request` (the
scheduler) is a stand-in, which records what sglang would generate from. The contract that makes it safe, the
ingress's `HFTokenizer` computing exactly sglang's ids for a plain prompt, is checked against sglang's own code.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.tiny_model import TinyModelSpec, build_tiny_model
from serve_app.engines.sglang import given_ids
from serve_app.engines.sglang.openai_serving import SglangOpenAI, request_models, serving_classes
from serve_app.tokenizer import HFTokenizer

SENTINEL = [11, 12, 13, 14, 15]
"""Ids sglang could not have computed for these prompts: seeing them at generate means the ingress's were used."""

CHAT = [
    {"role": "system", "content": "You are terse. Ünïcödé — 日本語 ✓"},
    {"role": "user", "content": "w1 w2 the quick brown fox 🦊"},
    {"role": "assistant", "content": "  spaced\nnewline\t"},
    {"role": "user", "content": [{"type": "text", "text": 'one text part: </s> <s> : {"ok": true}'}]},
]


@pytest.fixture(scope="module", params=["bytes", "words"])
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama with its byte-level BPE (what `config.sglang-cpu.yaml` serves) or word-level tokenizer."""
    spec = TinyModelSpec(byte_level=request.param == "bytes")
    return build_tiny_model(tmp_path_factory.mktemp(f"tiny-{request.param}"), spec)


@pytest.fixture(scope="module")
def published(model_dir: Path) -> Iterator[Any]:
    """sglang's process-wide config for the model, as `Engine` publishes it in the replica (cleared afterwards)."""
    from sglang.srt.runtime_context import publish, publish_role, reset_context
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(model_path=str(model_dir), device="cpu")
    ours = publish_role() is None
    publish(args, role="tokenizer")
    yield args
    if ours:
        reset_context()


class StubTokenizerManager:
    """sglang's `TokenizerManager` as its serving classes use it, with the real tokenizer and model config. Its
    `generate_request` stands in for the scheduler: it records each `GenerateReqInput`, tokenizes a text prompt
    as the real manager would, and reports `prompt_tokens` from the ids it generated from."""

    def __init__(self, args: Any) -> None:
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
        from sglang.srt.utils.hf_transformers.tokenizer import get_tokenizer

        self.server_args = args
        self.model_path = self.served_model_name = args.model_path
        self.tokenizer = get_tokenizer(args.model_path)
        self.model_config = ModelConfig.from_server_args(args)
        self.processor = None
        self.request_logger = SimpleNamespace(log_requests=False, log_requests_level=0)
        self.serving_chat_class = OpenAIServingChat
        self.generated: list[Any] = []
        self.aborted: list[str] = []

    def config_value(self, name: str) -> Any:
        from sglang.srt.runtime_context import get_context

        return getattr(self, name) if name in ("model_path", "served_model_name") else get_context().config_leaf(name)

    async def generate_request(self, obj: Any, request: Any = None) -> Any:
        self.generated.append(obj)
        await asyncio.sleep(0)  # concurrent requests interleave here
        ids = obj.input_ids if obj.input_ids is not None else self.tokenizer.encode(obj.text)
        yield {
            "text": " w1",
            "output_ids": [5],
            "meta_info": {
                "id": obj.rid,
                "finish_reason": {"type": "length", "length": 1},
                "prompt_tokens": len(ids),
                "completion_tokens": 1,
                "cached_tokens": 0,
                "weight_version": "default",
            },
        }

    def create_abort_task(self, obj: Any) -> None:
        return None

    def abort_request(self, rid: str = "", **_: Any) -> None:
        self.aborted.append(rid)


def engine_for(args: Any) -> SimpleNamespace:
    from sglang.srt.parser.template_manager import TemplateManager

    tm = StubTokenizerManager(args)
    templates = TemplateManager()
    templates.initialize_templates(tm, model_path=args.model_path)  # type: ignore[arg-type]
    return SimpleNamespace(tokenizer_manager=tm, template_manager=templates)


@pytest.fixture()
def served(published: Any, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """`SglangOpenAI` over the real serving classes (built, then the tokenizer's encode calls are counted)."""
    engine = engine_for(published)
    oa = SglangOpenAI(engine)  # type: ignore[arg-type]
    oa._models, oa._serving = request_models(), serving_classes(engine)  # type: ignore[arg-type]
    tok = engine.tokenizer_manager.tokenizer
    encodes: list[str] = []
    encode = tok.encode

    def counted(text: Any, *args: Any, **kwargs: Any) -> Any:
        encodes.append(text)
        return encode(text, *args, **kwargs)

    monkeypatch.setattr(tok, "encode", counted)
    return SimpleNamespace(oa=oa, tm=engine.tokenizer_manager, encodes=encodes, model_dir=published.model_path)


async def answer(oa: SglangOpenAI, kind: str, body: dict[str, Any], rid: str, ids: Any) -> tuple[int, Any]:
    items = [item async for item in oa.respond(kind, body, rid, prompt_ids=ids)]  # type: ignore[arg-type]
    return items[0].status, json.loads(b"".join(i.data for i in items[1:]))


def run(oa: SglangOpenAI, kind: str, body: dict[str, Any], ids: Any = None, rid: str = "r1") -> tuple[int, Any]:
    return asyncio.run(answer(oa, kind, body, rid, ids))


def chat(messages: list[dict[str, Any]] = CHAT, **fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": messages, "max_tokens": 1, **fields}


def completion(prompt: Any = "w1 w2 ünïcode 🦊", **fields: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": prompt, "max_tokens": 1, **fields}


def ingress_ids(model_dir: str, kind: str, body: dict[str, Any], tokenizer: HFTokenizer | None = None) -> list[int]:
    """What the ingress sends for this body (`ChatEndpoint` / `CompletionsEndpoint.prompt_ids`); `tokenizer`: the
    ingress's, with what it remembers from earlier requests (a new one if none)."""
    from serve_app.api.endpoints import CHAT as CHAT_ENDPOINT
    from serve_app.api.endpoints import COMPLETIONS

    endpoint = CHAT_ENDPOINT if kind == "chat" else COMPLETIONS
    return list(endpoint.prompt_ids(body, tokenizer or HFTokenizer(model_dir)))


# --- the ids reach sglang's generate call; sglang's tokenizer is not called ---


def test_a_plain_chat_generates_from_the_ingress_ids_without_tokenizing(served: SimpleNamespace) -> None:
    status, body = run(served.oa, "chat", chat(), SENTINEL)
    assert status == 200
    (obj,) = served.tm.generated
    assert (obj.input_ids, obj.text) == (SENTINEL, None)
    assert served.encodes == []  # rendered (sglang's template still runs), never encoded
    assert body["usage"]["prompt_tokens"] == len(SENTINEL)  # sglang's usage: what it generated from


def test_a_plain_chat_with_the_real_ingress_ids_answers_as_sglang_alone(served: SimpleNamespace) -> None:
    ids = ingress_ids(served.model_dir, "chat", chat())
    given = run(served.oa, "chat", chat(), ids)
    alone = run(served.oa, "chat", chat())
    with_ids, own = served.tm.generated
    assert with_ids.input_ids == own.input_ids == ids
    assert len(served.encodes) == 1  # only the run without ids tokenized
    assert given[0] == alone[0] == 200
    given[1].pop("created"), alone[1].pop("created")
    assert given[1] == alone[1]


def test_a_plain_completion_generates_from_the_ingress_ids_without_tokenizing(served: SimpleNamespace) -> None:
    status, body = run(served.oa, "completions", completion(), SENTINEL)
    assert status == 200
    (obj,) = served.tm.generated
    assert (obj.input_ids, obj.text) == (SENTINEL, None)
    assert served.encodes == []
    assert body["usage"]["prompt_tokens"] == len(SENTINEL)


def test_a_plain_stream_takes_the_ids_too(served: SimpleNamespace) -> None:
    async def go() -> list[Any]:
        return [i async for i in served.oa.respond("chat", chat(stream=True), "s1", prompt_ids=SENTINEL)]

    items = asyncio.run(go())
    assert items[0].status == 200 and items[-1].data == b"data: [DONE]\n\n"
    assert served.tm.generated[0].input_ids == SENTINEL and served.encodes == []


# --- anything else takes sglang's own path ---

TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
NOT_PLAIN: dict[str, tuple[str, dict[str, Any]]] = {
    "tools": ("chat", chat(tools=[TOOL])),
    "chat_template_kwargs": ("chat", chat(chat_template_kwargs={"enable_thinking": False})),
    "reasoning_effort": ("chat", chat(reasoning_effort="low")),
    "continue_final_message": ("chat", chat(CHAT[:3], continue_final_message=True)),
    "assistant last": ("chat", chat(CHAT[:3])),
    "image": ("chat", chat([{"role": "user", "content": [{"type": "text", "text": "w1"}, IMAGE]}])),
    "two text parts": ("chat", chat([{"role": "user", "content": [{"type": "text", "text": "w1"}] * 2}])),
    "name": ("chat", chat([{"role": "user", "content": "w1", "name": "bob"}])),
    "role case": ("chat", chat([{"role": "System", "content": "w1"}, {"role": "user", "content": "w2"}])),
    "tool role": ("chat", chat([{"role": "user", "content": "w1"}, {"role": "tool", "content": "w2"}])),
    "echo": ("completions", completion(echo=True)),
    "prompt list": ("completions", completion(["w1 w2", "w3"])),
    "prompt ids": ("completions", completion([5, 6, 7])),
}


@pytest.mark.parametrize("case", list(NOT_PLAIN))
def test_a_request_that_is_not_plain_takes_sglangs_own_path(served: SimpleNamespace, case: str) -> None:
    kind, body = NOT_PLAIN[case]
    given = run(served.oa, kind, body, SENTINEL)
    alone = run(served.oa, kind, body)
    assert given[0] == alone[0]
    generated = [(obj.input_ids, obj.text) for obj in served.tm.generated]
    if given[0] == 200:
        with_ids, own = generated
        assert with_ids == own and SENTINEL not in with_ids
    else:  # sglang refused it (an image for a text model): the same answer
        assert generated == [] and given[1] == alone[1]


def test_a_template_that_refuses_the_messages_is_still_sglangs_400(served: SimpleNamespace) -> None:
    tok = served.tm.tokenizer
    tok.chat_template = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
    status, body = run(served.oa, "chat", chat(), SENTINEL)
    assert status == 400 and "no system role" in body["error"]["message"]
    assert served.tm.generated == []


def test_an_engine_with_its_own_chat_template_is_left_as_sglang_built_it(published: Any) -> None:
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat

    engine = engine_for(published)
    args = engine.tokenizer_manager.server_args = copy.copy(published)
    args.chat_template = "other.jinja"
    serving = serving_classes(engine)  # type: ignore[arg-type]
    assert "_render_and_encode_chat_template" not in vars(serving["chat"])
    assert "_convert_to_internal_request" not in vars(serving["completions"])
    assert isinstance(serving["chat"], OpenAIServingChat)


# --- concurrent requests on the shared serving objects ---


def test_concurrent_requests_do_not_see_each_others_ids(served: SimpleNamespace) -> None:
    bodies = {f"c{i}": ("chat", chat([{"role": "user", "content": f"w{i}"}])) for i in range(12)}
    bodies |= {f"p{i}": ("completions", completion(f"w{i} w{i}")) for i in range(12)}
    bodies |= {f"t{i}": ("chat", chat([{"role": "user", "content": f"w{i}"}], tools=[TOOL])) for i in range(6)}
    ids = {rid: [100 + i, 200 + i] for i, rid in enumerate(bodies)}

    async def go() -> None:
        await asyncio.gather(*(answer(served.oa, k, b, rid, ids[rid]) for rid, (k, b) in bodies.items()))

    asyncio.run(go())
    seen = {obj.rid: obj.input_ids for obj in served.tm.generated}
    assert set(seen) == set(bodies)
    for rid, got in seen.items():
        if rid.startswith("t"):  # not plain: sglang's own ids for its own prompt
            assert got not in ids.values()
        else:
            assert got == ids[rid]


# --- the contract: the ingress's ids are exactly sglang's for a plain prompt ---

PLAIN_CHATS = [
    CHAT,
    [{"role": "user", "content": "w1"}],
    [{"role": "system", "content": ""}, {"role": "user", "content": "  leading and trailing  "}],
    [
        {"role": "user", "content": "日本語のテキスト\n\n改行"},
        {"role": "assistant", "content": "é"},
        {"role": "user", "content": "ß"},
    ],
    [{"role": "user", "content": "w1 " * 500}],
]


@pytest.mark.parametrize("messages", PLAIN_CHATS, ids=range(len(PLAIN_CHATS)))
def test_the_ingress_chat_ids_are_sglangs(published: Any, messages: list[dict[str, Any]]) -> None:
    """sglang's `_process_messages` on an unwrapped serving object, with sglang's own tokenizer and template."""
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat

    engine = engine_for(published)
    serving = OpenAIServingChat(engine.tokenizer_manager, engine.template_manager)  # type: ignore[arg-type]
    body = chat(messages)
    request = ChatCompletionRequest.model_validate(body)
    assert given_ids.given_prompt("chat", body, request, [1]) is not None  # plain
    sglang_ids = serving._process_messages(request, is_multimodal=False).prompt_ids
    assert ingress_ids(published.model_path, "chat", body) == list(sglang_ids)


def test_a_conversation_sent_again_still_gets_sglangs_ids(published: Any) -> None:
    """One ingress tokenizer over a conversation's requests, each re-sending the history: the later ones take the
    earlier turns' ids from what the tokenizer remembers, and every one is still exactly sglang's."""
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat

    engine = engine_for(published)
    serving = OpenAIServingChat(engine.tokenizer_manager, engine.template_manager)  # type: ignore[arg-type]
    tokenizer = HFTokenizer(published.model_path)
    history: list[dict[str, Any]] = [{"role": "user", "content": "Document. " + "w1 w2 ünï </s> " * 300}]
    for answer, question in [("w3 w4", "and w5?"), ("<s> é", "日本語 w6"), ("", "w7")]:
        body = chat(history)
        sglang_ids = serving._process_messages(ChatCompletionRequest.model_validate(body), is_multimodal=False)
        assert ingress_ids(published.model_path, "chat", body, tokenizer) == list(sglang_ids.prompt_ids)
        history = [*history, {"role": "assistant", "content": answer}, {"role": "user", "content": question}]


class CountingBackend:
    """A tokenizers backend that records the texts it is asked to encode."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self.encoded: list[str] = []

    def encode_batch(self, texts: list[str], **kwargs: Any) -> Any:
        self.encoded += texts
        return self._backend.encode_batch(texts, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


def test_a_follow_up_on_a_document_does_not_tokenize_the_document_again(model_dir: Path) -> None:
    tokenizer = HFTokenizer(str(model_dir))
    backend = CountingBackend(tokenizer._tok._tokenizer)
    tokenizer._tok._tokenizer = backend
    document = "Document 7. " + "w1 w2 the quick brown fox " * 400
    asked = [{"role": "user", "content": document}]
    tokenizer.chat_ids(asked)
    assert any("quick brown fox" in text for text in backend.encoded)  # the first request encodes it
    backend.encoded.clear()
    follow_up = [*asked, {"role": "assistant", "content": "w3"}, {"role": "user", "content": "and w9?"}]
    ids = tokenizer.chat_ids(follow_up)
    assert backend.encoded and not any("quick brown fox" in text for text in backend.encoded)
    assert ids == tokenizer._tok.encode(tokenizer.render_chat(follow_up), add_special_tokens=False)


PIECES = ["w1", "w2", " ", "  ", "\n", "\t", "é", "日本語", "🦊", ":", "</s>", "<s>", "<unk>", "<pad>", "{", "'s"]
texts_st = st.lists(st.sampled_from(PIECES), max_size=12).map("".join)
messages_st = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": texts_st})
conversations_st = st.lists(messages_st, min_size=1, max_size=6)


@given(conversations=st.lists(conversations_st, min_size=1, max_size=3))
@settings(max_examples=60, deadline=None)
def test_the_remembered_segments_never_change_the_ids(model_dir: Path, conversations: list[Any]) -> None:
    """Whatever was tokenized before (every prefix of each conversation, in turn, on one tokenizer), a chat's ids
    are those of one encode of its whole rendered prompt."""
    tokenizer = _shared_tokenizer(model_dir)
    for conversation in conversations:
        for end in range(1, len(conversation) + 1):
            messages = conversation[:end]
            whole = tokenizer._tok.encode(tokenizer.render_chat(messages), add_special_tokens=False)
            assert tokenizer.chat_ids(messages) == whole


_TOKENIZERS: dict[Path, HFTokenizer] = {}


def _shared_tokenizer(model_dir: Path) -> HFTokenizer:
    """One tokenizer per model across the property's examples, so each example meets what earlier ones left."""
    return _TOKENIZERS.setdefault(model_dir, HFTokenizer(str(model_dir)))


@pytest.mark.parametrize("prompt", ["w1 w2", "ünïcode 🦊 日本語", "  spaced\n\ttabs  ", "</s> <s> literal specials"])
def test_the_ingress_completion_ids_are_sglangs(published: Any, prompt: str) -> None:
    """sglang's tokenizer manager's own `_tokenize_texts` for a single text prompt."""
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    stub = StubTokenizerManager(published)
    tm = object.__new__(TokenizerManager)
    tm.tokenizer, tm.model_config, tm.async_dynamic_batch_tokenizer = stub.tokenizer, stub.model_config, None
    sglang_ids, _ = asyncio.run(tm._tokenize_texts(prompt))
    assert ingress_ids(published.model_path, "completions", completion(prompt)) == list(sglang_ids)
