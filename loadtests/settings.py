"""The load test's knobs: one typed object, from Locust's command line (custom arguments) or `LOCUST_*` variables.

Times are engine seconds: against the `sim` backend set `--time-scale` to the deployment's
`Engine.user_config.time_scale` and every think time and stage length is scaled by it, so a run at
time scale 0.2 is the same workload as one at 1, five times faster. Against a real engine leave it at 1.
"""

from __future__ import annotations

import argparse
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class TokenSpec(BaseModel):
    """Prompt lengths: `LOW:HIGH` (uniform) or `A,B,C` (taken in turn, one per document, then again)."""

    model_config = ConfigDict(frozen=True)
    low: int = Field(ge=1)
    high: int = Field(ge=1)
    cycle: tuple[int, ...] = ()

    @classmethod
    def parse(cls, text: str | TokenSpec) -> TokenSpec:
        if isinstance(text, TokenSpec):
            return text
        try:
            if ":" in text:
                low, high = (int(x) for x in text.split(":"))
                return cls(low=low, high=high)
            values = tuple(int(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise ValueError(f"{text!r} is not LOW:HIGH or a comma-separated list of token counts") from None
        if not values:
            raise ValueError(f"{text!r} names no token count")
        return cls(low=min(values), high=max(values), cycle=values)

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.low > self.high:
            raise ValueError(f"low {self.low} > high {self.high}")
        if any(v < 1 for v in self.cycle):
            raise ValueError(f"token counts must be >= 1, got {list(self.cycle)}")
        return self

    def pick(self, index: int, rng) -> int:
        """The `index`-th document's length (a cycle is deterministic; a range is drawn from `rng`)."""
        if self.cycle:
            return self.cycle[index % len(self.cycle)]
        return rng.randint(self.low, self.high)


class LoadSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field("", description="Model name sent in requests; empty = the first of GET /v1/models.")
    chat_weight: int = Field(4, ge=0, description="Locust weight of short chat users.")
    doc_weight: int = Field(1, ge=0, description="Locust weight of long-document users.")
    doc_tokens: TokenSpec = Field(TokenSpec(low=30_000, high=130_000), description="Document lengths.")
    doc_followups: int = Field(2, ge=0, description="Follow-up questions on a document, same session.")
    docs_per_user: int = Field(0, ge=0, description="Documents a user sends before it idles (0 = no limit).")
    doc_max_tokens: int = Field(64, ge=1, description="max_tokens of answers about documents.")
    question_tokens: TokenSpec = Field(TokenSpec(low=16, high=64), description="Lengths of chat and follow-up questions.")
    chat_turns: int = Field(4, ge=1, description="Questions per chat session before a new session starts.")
    chat_max_tokens: int = Field(32, ge=1, description="max_tokens of chat answers.")
    think_s: tuple[float, float] = Field((2.0, 6.0), description="Think time between a user's requests (engine s).")
    chars_per_token: float = Field(4.0, gt=0, description="Characters per token of the built prompts.")
    time_scale: float = Field(1.0, gt=0, description="Wall seconds per engine second (the sim's time_scale).")
    request_timeout_s: float = Field(900.0, gt=0, description="Client timeout of one request (wall s).")
    samples_file: str = Field("", description="Append one JSON line per request here (the bench reads them).")

    @field_validator("doc_tokens", "question_tokens", mode="before")
    @classmethod
    def _tokens(cls, v: Any) -> TokenSpec:
        return TokenSpec.parse(v)

    @field_validator("think_s", mode="before")
    @classmethod
    def _think(cls, v: Any) -> Any:
        if isinstance(v, str):
            low, _, high = v.partition(":")
            try:
                return (float(low), float(high or low))
            except ValueError:
                raise ValueError(f"{v!r} is not SECONDS or MIN:MAX") from None
        return v

    @model_validator(mode="after")
    def _check(self) -> Self:
        low, high = self.think_s
        if not 0 <= low <= high:
            raise ValueError(f"think_s: need 0 <= min <= max, got {low}:{high}")
        if self.chat_weight + self.doc_weight == 0:
            raise ValueError("chat_weight and doc_weight are both 0: no user would run")
        return self

    def wall_s(self, engine_s: float) -> float:
        return engine_s * self.time_scale


# (flag, field, help): every field is also read from LOCUST_<FIELD> (Locust's own convention).
OPTIONS: list[tuple[str, str]] = [
    ("--model", "model"),
    ("--chat-weight", "chat_weight"),
    ("--doc-weight", "doc_weight"),
    ("--doc-tokens", "doc_tokens"),
    ("--doc-followups", "doc_followups"),
    ("--docs-per-user", "docs_per_user"),
    ("--doc-max-tokens", "doc_max_tokens"),
    ("--question-tokens", "question_tokens"),
    ("--chat-turns", "chat_turns"),
    ("--chat-max-tokens", "chat_max_tokens"),
    ("--think-s", "think_s"),
    ("--chars-per-token", "chars_per_token"),
    ("--time-scale", "time_scale"),
    ("--request-timeout-s", "request_timeout_s"),
    ("--samples-file", "samples_file"),
]


def register(parser: argparse.ArgumentParser) -> None:
    """Add the knobs to Locust's parser (a configargparse parser: `env_var` is understood)."""
    for flag, name in OPTIONS:
        f = LoadSettings.model_fields[name]
        parser.add_argument(
            flag,
            dest=name,
            type=str,
            default=None,
            env_var=f"LOCUST_{name.upper()}",
            help=f"{f.description} Default: {_shown(f.default)}.",
        )


def _shown(default: Any) -> str:
    if isinstance(default, TokenSpec):
        return ",".join(map(str, default.cycle)) if default.cycle else f"{default.low}:{default.high}"
    if isinstance(default, tuple):
        return ":".join(f"{x:g}" for x in default)
    return repr(default)


def from_options(options: Any) -> LoadSettings:
    """The settings from Locust's parsed options (unset ones keep their defaults); ValueError names a bad one."""
    given = {name: getattr(options, name) for _, name in OPTIONS if getattr(options, name, None) is not None}
    return LoadSettings.model_validate(given)
