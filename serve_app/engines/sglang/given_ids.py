"""The prompt's token ids the ingress made, handed to sglang's serving classes so it does not tokenize again.

The ingress tokenizes every prompt with the model's own tokenizer and chat template, as sglang does
(`HFTokenizer.chat_ids` / `text_ids`), and the sglang backend passes those ids with the request. For a
*plain* request they are exactly what sglang would compute, and sglang takes them instead of tokenizing the
prompt again in the replica (about a second of CPU for a 100k-token document). Any other request keeps
sglang's own path, unchanged.

Plain (`given_prompt`, on the client's body and sglang's validated request):
- chat: no `tools`, `chat_template_kwargs` (also what `reasoning` / `reasoning_effort` set there),
  `reasoning_effort`, `thinking`, `task`, `continue_final_message` or client `input_ids`; every message has only
  `role` (`system`, `user`, `assistant`) and `content` (a string or a list of text parts); the last message is
  not the assistant's (sglang would prefill or re-role it).
- completions: a single string `prompt`, no `echo`.

The seam is the one step that tokenizes, wrapped on sglang's serving objects (their classes are untouched):
- chat: `OpenAIServingChat._render_and_encode_chat_template`. Everything around it (message processing, tool
  and reasoning handling, stop strings, sampling) runs as sglang's; the template is still rendered, so a template
  that refuses the messages is sglang's 400 as before, and only the encode is replaced by the ingress's ids. It
  takes them only when what sglang renders is what the ingress rendered: the same messages (`role`, `content`
  string; so one text part flattened to it, never several, which sglang joins with a space), no tools, no
  template kwargs, the generation prompt, the text round trip not lossy, no Python template, no multimodal cache,
  and an encode without added special tokens.
- completions: `OpenAIServingCompletion._convert_to_internal_request`: the `GenerateReqInput` it builds
  carries `input_ids` instead of the prompt's `text` (which sglang's tokenizer manager would encode with the
  tokenizer's defaults), when no completion template rewrote the prompt.
Both only when the engine tokenizes as the ingress does (`tokenizer_matches_ingress`: the model's own
tokenizer and template, HF backend, `auto` mode) and the model is not multimodal.

The ids ride on the Starlette request the replica builds for sglang (its scope, `SCOPE_KEY`): sglang converts the
request on an executor thread (`run_in_executor`, which does not carry context variables), passing that request
along. The chat wrapper of the conversion copies the context and sets `_given` in the copy for the render step,
so concurrent requests on the shared serving objects never see each other's ids.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sglang.srt.entrypoints.openai.serving_base import OpenAIServingBase

SCOPE_KEY = "fairshare.given_prompt"
"""Where `DisconnectableRequest` puts the request's `GivenPrompt` in the scope of the request sglang gets."""

PLAIN_ROLES = frozenset({"system", "user", "assistant"})
_PLAIN_MESSAGE_FIELDS = frozenset({"role", "content"})
_UNSET_CHAT_FIELDS = ("reasoning_effort", "thinking", "task", "input_ids")
_ENCODE_KWARGS: tuple[dict[str, bool], ...] = ({}, {"add_special_tokens": False})
"""sglang's encode of the rendered chat: without added specials, or the defaults on a tokenizer that adds none
(`_tokenizer_auto_adds_specials` is False); the ingress encodes with `add_special_tokens=False`."""


@dataclass(frozen=True, slots=True)
class GivenPrompt:
    ids: Sequence[int]
    messages: list[dict[str, str]] | None = None
    """chat: the messages as the ingress rendered them (role, content text)."""
    text: str | None = None
    """completions: the prompt the ingress encoded."""


_given: contextvars.ContextVar[GivenPrompt | None] = contextvars.ContextVar("fairshare_given_prompt", default=None)


def _content_text(content: Any) -> str | None:
    """A message's content as the ingress renders it: the string, or its text parts joined; None if not text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) and len(p) == 2
        for p in content
    ):
        return "".join(p["text"] for p in content)
    return None


def _plain_messages(raw: Any) -> list[dict[str, str]] | None:
    if not isinstance(raw, list) or not raw:
        return None
    messages = []
    for m in raw:
        if not isinstance(m, dict) or set(m) != _PLAIN_MESSAGE_FIELDS or m["role"] not in PLAIN_ROLES:
            return None
        text = _content_text(m["content"])
        if text is None:
            return None
        messages.append({"role": m["role"], "content": text})
    return messages if messages[-1]["role"] != "assistant" else None


def given_prompt(kind: str, body: dict[str, Any], request: Any, prompt_ids: Sequence[int] | None) -> GivenPrompt | None:
    """The ingress's ids for this request if it is plain (see the module), else None: sglang tokenizes it."""
    if not prompt_ids:
        return None
    if kind == "chat":
        messages = _plain_messages(body.get("messages"))
        if (
            messages is None
            or request.tools
            or request.chat_template_kwargs
            or request.continue_final_message
            or any(getattr(request, field, None) is not None for field in _UNSET_CHAT_FIELDS)
        ):
            return None
        return GivenPrompt(prompt_ids, messages=messages)
    if kind == "completions":
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt or request.echo or request.prompt != prompt:
            return None
        return GivenPrompt(prompt_ids, text=prompt)
    return None


def tokenizer_matches_ingress(serving: OpenAIServingBase) -> bool:
    """Whether the engine tokenizes as the ingress does: the tokenizer and chat template from the model's own
    files (`HFTokenizer(model_path)`), through transformers, for a text-only model."""
    tm = serving.tokenizer_manager
    args = tm.server_args
    return (
        tm.tokenizer is not None
        and not getattr(args, "skip_tokenizer_init", False)
        and getattr(args, "tokenizer_path", None) in (None, getattr(args, "model_path", None))
        and getattr(args, "tokenizer_mode", "auto") == "auto"
        and getattr(args, "tokenizer_backend", "huggingface") == "huggingface"
        and getattr(args, "chat_template", None) is None
        and getattr(args, "completion_template", None) is None
        and not tm.model_config.is_multimodal
    )


def use_given_ids(kind: str, serving: OpenAIServingBase) -> None:
    """Wrap the one tokenizing step of this serving object (instance attributes), if its engine tokenizes as the
    ingress does; otherwise leave it as sglang built it."""
    if kind not in ("chat", "completions") or not tokenizer_matches_ingress(serving):
        return
    convert = serving._convert_to_internal_request
    if kind == "chat":
        render = serving._render_and_encode_chat_template  # type: ignore[attr-defined]
        serving._convert_to_internal_request = _chat_convert(convert)  # type: ignore[method-assign]
        serving._render_and_encode_chat_template = _chat_render(serving, render)  # type: ignore[attr-defined]
    else:
        serving._convert_to_internal_request = _completion_convert(serving, convert)  # type: ignore[method-assign]


def given_of(raw_request: Any) -> GivenPrompt | None:
    scope = getattr(raw_request, "scope", None)
    given = scope.get(SCOPE_KEY) if isinstance(scope, dict) else None
    return given if isinstance(given, GivenPrompt) else None


def _chat_convert(convert: Callable[..., Any]) -> Callable[..., Any]:
    def with_given(request: Any, raw_request: Any = None) -> Any:
        given = given_of(raw_request)
        if given is None or given.messages is None:
            return convert(request, raw_request)
        context = contextvars.copy_context()  # this request's own: the executor thread's context is shared
        return context.run(_run_with, given, convert, request, raw_request)

    return with_given


def _run_with(given: GivenPrompt, convert: Callable[..., Any], *args: Any) -> Any:
    _given.set(given)
    return convert(*args)


def _chat_render(serving: Any, render: Callable[..., Any]) -> Callable[..., Any]:
    def render_with_given(
        messages: list[dict[str, Any]],
        *,
        tools: Any,
        template_kwargs: dict[str, Any],
        encode_kwargs: dict[str, Any],
        use_cache: bool,
        add_generation_prompt: bool = True,
    ) -> tuple[list[int], str | None]:
        given = _given.get()
        if (
            given is None
            or messages != given.messages
            or tools is not None
            or template_kwargs
            or encode_kwargs not in _ENCODE_KWARGS
            or use_cache
            or add_generation_prompt is not True
            or serving._prompt_text_round_trip_is_lossy
            or serving.template_manager.python_chat_template is not None
        ):
            return render(  # type: ignore[no-any-return]
                messages,
                tools=tools,
                template_kwargs=template_kwargs,
                encode_kwargs=encode_kwargs,
                use_cache=use_cache,
                add_generation_prompt=add_generation_prompt,
            )
        # Rendered as sglang renders it (a template that refuses these messages raises as before), not encoded.
        serving.tokenizer_manager.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, tools=None, return_dict=False
        )
        return list(given.ids), None

    return render_with_given


def _completion_convert(serving: Any, convert: Callable[..., Any]) -> Callable[..., Any]:
    def with_given(request: Any, raw_request: Any = None) -> Any:
        adapted, processed = convert(request, raw_request)
        given = given_of(raw_request)
        if (
            given is not None
            and given.text is not None
            and serving.template_manager.completion_template_name is None
            and adapted.text == given.text
            and adapted.input_ids is None
        ):
            adapted.text, adapted.input_ids = None, list(given.ids)
        return adapted, processed

    return with_given
