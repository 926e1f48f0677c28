"""The load test's knobs: one typed object, from Locust's command line (custom arguments) or `LOCUST_*` variables.

Times are engine seconds: against the `sim` backend set `--time-scale` to the deployment's
`Engine.user_config.time_scale` and every think time and stage length is scaled by it, so a run at
time scale 0.2 is the same workload as one at 1, five times faster. Against a real engine leave it at 1.
"""

from __future__ import annotations

import argparse
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


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
            else:
                values = tuple(int(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise ValueError(f"{text!r} is not LOW:HIGH or a comma-separated list of token counts") from None
        if ":" in text:
            return cls(low=low, high=high)
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
    doc_gap_s: float = Field(0.0, ge=0, description="Least time between two documents' sends, across users (engine s).")
    doc_max_tokens: int = Field(64, ge=1, description="max_tokens of answers about documents.")
    question_tokens: TokenSpec = Field(TokenSpec(low=16, high=64), description="Chat and follow-up question lengths.")
    chat_turns: int = Field(4, ge=1, description="Questions per chat session before a new session starts.")
    chat_max_tokens: int = Field(32, ge=1, description="max_tokens of chat answers.")
    think_s: tuple[float, float] = Field((2.0, 6.0), description="Think time between a user's requests (engine s).")
    chars_per_token: float = Field(4.0, gt=0, description="Characters per token of the built prompts.")
    time_scale: float = Field(1.0, gt=0, description="Wall seconds per engine second (the sim's time_scale).")
    request_timeout_s: float = Field(900.0, gt=0, description="Client timeout of one request (wall s).")
    samples_file: str = Field("", description="Append one JSON line per request here (the bench reads them).")
    seed: int | None = Field(
        None, description="Seed of each user's random choices (lengths, think times, texts); None: unseeded."
    )
    # Load shapes (loadtests/shapes/): lengths in engine seconds.
    article_single_s: float = Field(150.0, gt=0, description="Article shape: length of the one-document stage.")
    article_four_s: float = Field(270.0, gt=0, description="Article shape: length of the four-sessions stage.")
    ramp_step_users: int = Field(2, ge=1, description="Step ramp: users added per step.")
    ramp_step_s: float = Field(60.0, gt=0, description="Step ramp: length of a step.")
    ramp_max_users: int = Field(40, ge=1, description="Step ramp: stop after the step with this many users.")
    knee_ttft_s: float = Field(2.0, gt=0, description="Step ramp: stop after a step with short TTFT p99 above this.")
    soak_users: int = Field(8, ge=1, description="Soak: steady users.")
    soak_s: float = Field(600.0, gt=0, description="Soak: how long.")

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


# (flag, field): every field is also read from LOCUST_<FIELD> (Locust's own convention).
OPTIONS: list[tuple[str, str]] = [
    ("--model", "model"),
    ("--chat-weight", "chat_weight"),
    ("--doc-weight", "doc_weight"),
    ("--doc-tokens", "doc_tokens"),
    ("--doc-followups", "doc_followups"),
    ("--docs-per-user", "docs_per_user"),
    ("--doc-gap-s", "doc_gap_s"),
    ("--doc-max-tokens", "doc_max_tokens"),
    ("--question-tokens", "question_tokens"),
    ("--chat-turns", "chat_turns"),
    ("--chat-max-tokens", "chat_max_tokens"),
    ("--think-s", "think_s"),
    ("--chars-per-token", "chars_per_token"),
    ("--time-scale", "time_scale"),
    ("--request-timeout-s", "request_timeout_s"),
    ("--samples-file", "samples_file"),
    ("--seed", "seed"),
    ("--article-single-s", "article_single_s"),
    ("--article-four-s", "article_four_s"),
    ("--ramp-step-users", "ramp_step_users"),
    ("--ramp-step-s", "ramp_step_s"),
    ("--ramp-max-users", "ramp_max_users"),
    ("--knee-ttft-s", "knee_ttft_s"),
    ("--soak-users", "soak_users"),
    ("--soak-s", "soak_s"),
]


def register(parser: argparse.ArgumentParser, env_vars: bool = True) -> None:
    """Add the knobs to a parser; `env_vars` for Locust's (a configargparse parser: `env_var` is understood)."""
    for flag, name in OPTIONS:
        f = LoadSettings.model_fields[name]
        extra = {"env_var": f"LOCUST_{name.upper()}"} if env_vars else {}
        parser.add_argument(
            flag, dest=name, type=str, default=None, help=f"{f.description} Default: {_shown(f.default)}.", **extra
        )


def to_flags(values: dict[str, Any]) -> list[str]:
    """`{"doc_tokens": "1,2"}` -> `["--doc-tokens", "1,2"]` (the locustfile's own flags)."""
    flags = {name: flag for flag, name in OPTIONS}
    return [x for name, v in values.items() for x in (flags[name], str(v))]


def _shown(default: Any) -> str:
    if isinstance(default, TokenSpec):
        return ",".join(map(str, default.cycle)) if default.cycle else f"{default.low}:{default.high}"
    if isinstance(default, tuple):
        return ":".join(f"{x:g}" for x in default)
    return repr(default)


def describe_error(e: ValidationError) -> str:
    """One line naming each bad option and why."""
    parts = []
    for err in e.errors():
        loc = "--" + ".".join(map(str, err["loc"])).replace("_", "-") + ": " if err["loc"] else ""
        parts.append(f"{loc}{err['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)


def from_options(options: Any) -> LoadSettings:
    """The settings from Locust's parsed options (unset ones keep their defaults); ValueError names a bad one."""
    given = {name: getattr(options, name) for _, name in OPTIONS if getattr(options, name, None) is not None}
    return LoadSettings.model_validate(given)
