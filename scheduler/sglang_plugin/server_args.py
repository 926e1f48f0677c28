"""Decode interleave and the event loop are sglang's own: map the policy's switches onto its server arguments.

The policy core's ``mixed_decode`` is sglang's ``--enable-mixed-chunk`` (decoding rows ride along in a
prefill pass, each taking one token of the chunk budget) and ``decode_steps_per_prefill`` is
``--prefill-decode-interval`` (decode-only rounds after each prefill batch). The plugin does not
re-implement either: when ``FAIRSHARE_MIXED_DECODE`` / ``FAIRSHARE_DECODE_STEPS_PER_PREFILL`` is set, the
value is written onto the raw `ServerArgs` just before sglang resolves them, as if it had been passed on
the command line, so sglang's own resolution validates it (speculative decoding, for example, turns mixed
chunk off) and every process sees the same value. Unset, sglang's arguments stand, except mixed decode: the
policy's default (on, measured in the simulator against decode-only interleave) is written unless
``FAIRSHARE_MIXED_DECODE=false``; where sglang resolves it off anyway, the policy's short-decode interleave
keeps short streams moving.

``FAIRSHARE_CPU_OVERLAP_SCHEDULE=false`` writes ``--disable-overlap-schedule`` the same way, on a CPU device only:
there a launch runs the pass, so sglang's overlap loop overlaps no work, and it sends each pass's tokens only after
the next pass has run. Unset or true, sglang's choice stands.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from scheduler.config import PolicyConfig, env_var_name
from scheduler.sglang_plugin.env import explicit_policy_env

logger = logging.getLogger("fairshare.sglang_plugin")

POLICY_FIELD_TO_SERVER_ARG = {
    "mixed_decode": "enable_mixed_chunk",
    "decode_steps_per_prefill": "prefill_decode_interval",
}
CPU_OVERLAP_SERVER_ARG = "disable_overlap_schedule"
"""Written true on a CPU device when the policy's `cpu_overlap_schedule` is false."""
POLICY_DEFAULT_FIELDS = frozenset({"mixed_decode"})
"""Fields whose policy default is written onto sglang's arguments when the operator leaves them unset."""
SCHEDULER_FIELDS = frozenset({"chunk_budget_tokens", "max_running_requests"})
"""Fields the plugin reads from sglang's scheduler when the environment leaves them unset (`attach`)."""
SGLANG_OWNED_FIELDS = SCHEDULER_FIELDS | (POLICY_FIELD_TO_SERVER_ARG.keys() - POLICY_DEFAULT_FIELDS)
"""Fields whose default inside sglang is the value sglang's own arguments give (upstream's, on a stock server)."""

if TYPE_CHECKING:
    from sglang.srt.server_args import ServerArgs


def policy_server_args(explicit: Mapping[str, object]) -> dict[str, tuple[object, str]]:
    """sglang argument -> (value, where it comes from) that the plugin writes for the operator's `explicit` policy
    values (`env.explicit_policy_env`): each switch the operator set, and the policy's default for
    `POLICY_DEFAULT_FIELDS` left unset."""
    written: dict[str, tuple[object, str]] = {}
    for field, arg in POLICY_FIELD_TO_SERVER_ARG.items():
        value, source = explicit.get(field), env_var_name(field)
        if value is None and field in POLICY_DEFAULT_FIELDS:
            value, source = PolicyConfig.model_fields[field].default, f"{source} unset, policy default"
        if value is not None:
            written[arg] = (value, source)
    return written


def apply_policy_env(server_args: ServerArgs) -> None:
    """BEFORE hook on `ServerArgs.resolve_once`: the record is still the operator's input here."""
    if getattr(server_args, "_resolution_finished", False) or getattr(server_args, "_resolution_failed", False):
        return  # already resolved (e.g. a copy pickled into a child process): the record is sealed
    explicit = explicit_policy_env()
    for arg, (value, source) in policy_server_args(explicit).items():
        old = getattr(server_args, arg)
        if old != value:
            setattr(server_args, arg, value)
        logger.info("fairshare: %s=%s -> sglang %s=%s (was %s)", source, value, arg, value, old)
    if explicit.get("cpu_overlap_schedule") is False and getattr(server_args, "device", None) == "cpu":
        arg, source = CPU_OVERLAP_SERVER_ARG, env_var_name("cpu_overlap_schedule")
        old = getattr(server_args, arg)
        setattr(server_args, arg, True)  # grouped fields: set by name, as the switches above
        logger.info("fairshare: %s=false on cpu -> sglang %s=True (was %s)", source, arg, old)
