"""Loading: sglang's general-plugin entry point, the version guard, and the Ray worker hook.

sglang calls `load()` (entry point ``fairshare = "scheduler.sglang_plugin:load"`` in the group
``sglang.srt.plugins``, no arguments) from `load_plugins()` in every process it starts, then applies
the registered hooks. Fail safe: on an sglang other than the tested version, or when any hook target
does not resolve, `load()` logs one error and registers nothing, so sglang runs unpatched.
``FAIRSHARE_PLUGIN_FORCE=1`` overrides the version check (never a missing target: half a plugin is worse
than none); ``FAIRSHARE_PLUGIN_ENABLED=0`` turns the plugin off (with ``FAIRSHARE_PLUGIN_CLOCK`` set as well,
one timing hook stays: `hooks.UPSTREAM_CLOCK_TARGETS`, upstream's prefill scheduling call timed, unchanged; with
``FAIRSHARE_PASS_TRACE`` set, `hooks.UPSTREAM_TRACE_TARGETS` trace upstream's own decisions, unchanged).

The launcher checks the schedulers' start-up handshake (`check_scheduler_infos`): a scheduler process
that never loaded the plugin (sglang's Ray launcher does not call `load_plugins()` in its actors) stops
the launch with a message saying how to load it, instead of serving silently without the policy.
"""

from __future__ import annotations

import logging
import os
import pkgutil
from typing import Any

from scheduler.sglang_plugin.env import (
    PASS_TRACE_VAR,
    PLUGIN_CLOCK_VAR,
    PLUGIN_ENABLED_VAR,
    PLUGIN_FORCE_VAR,
    pass_trace_path,
    plugin_clock_path,
    plugin_enabled,
    plugin_forced,
)

logger = logging.getLogger("fairshare.sglang_plugin")

TESTED_SGLANG_VERSION = "0.5.23"

_registered = False


def installed_sglang_version() -> str:
    import sglang

    return str(getattr(sglang, "__version__", "unknown"))


def unresolved_targets(targets: list[str]) -> list[str]:
    """Targets that would not resolve the way `HookRegistry` resolves them."""
    missing = []
    for target in targets:
        owner, _, attr = target.rpartition(".")
        try:
            getattr(pkgutil.resolve_name(owner), attr)
        except Exception:
            missing.append(target)
    return missing


def load() -> None:
    """Entry point: check the version and every target, then register the hooks (sglang applies them)."""
    global _registered
    if _registered:
        return
    enabled = plugin_enabled()
    if not enabled and plugin_clock_path() is None and pass_trace_path() is None:
        value = os.environ.get(PLUGIN_ENABLED_VAR, "")
        logger.info("fairshare: plugin disabled by %s=%s; sglang runs unpatched", PLUGIN_ENABLED_VAR, value)
        return
    version = installed_sglang_version()
    if version != TESTED_SGLANG_VERSION:
        if not plugin_forced():
            logger.error(
                "fairshare: sglang %s is not the tested %s; the plugin patches nothing and sglang runs unpatched "
                "(set %s=1 to patch anyway)",
                version,
                TESTED_SGLANG_VERSION,
                PLUGIN_FORCE_VAR,
            )
            return
        logger.warning(
            "fairshare: patching sglang %s (tested: %s) because %s=1", version, TESTED_SGLANG_VERSION, PLUGIN_FORCE_VAR
        )

    from sglang.srt.plugins.hook_registry import HookRegistry

    from scheduler.sglang_plugin.hooks import TARGETS, UPSTREAM_CLOCK_TARGETS, UPSTREAM_TRACE_TARGETS

    if enabled:
        targets = TARGETS
    else:
        clock = UPSTREAM_CLOCK_TARGETS if plugin_clock_path() is not None else ()
        targets = clock + (UPSTREAM_TRACE_TARGETS if pass_trace_path() is not None else ())
    missing = unresolved_targets([spec.target for spec in targets])
    if missing:
        logger.error(
            "fairshare: hook targets not found in sglang %s: %s; the plugin patches nothing and sglang runs unpatched",
            version,
            ", ".join(missing),
        )
        return
    for spec in targets:
        HookRegistry.register(spec.target, spec.hook, spec.hook_type)
    _registered = True
    if not enabled:
        logger.info(
            "fairshare: plugin disabled by %s=0; upstream's prefill scheduling call timed -> %s (%s), its decisions "
            "traced -> %s (%s)",
            PLUGIN_ENABLED_VAR,
            plugin_clock_path(),
            PLUGIN_CLOCK_VAR,
            pass_trace_path(),
            PASS_TRACE_VAR,
        )


class PluginNotLoadedError(RuntimeError):
    pass


def check_scheduler_infos(infos: list[dict[str, Any]]) -> None:
    """Launcher side: every scheduler the launch started must report the policy's state (see
    `attach.INIT_INFO_KEY`); one that reports nothing never loaded the plugin."""
    from scheduler.sglang_plugin.attach import INIT_INFO_KEY

    missing = [i for i, info in enumerate(infos) if INIT_INFO_KEY not in info]
    if missing:
        raise PluginNotLoadedError(
            f"fairshare: the plugin is loaded in the launcher but not in scheduler process(es) {missing} of "
            f"{len(infos)}: they would serve without the policy. sglang's Ray launcher (RayEngine, --use-ray) never "
            "calls load_plugins() in its scheduler actors; start Ray with runtime_env={'worker_process_setup_hook': "
            f"'scheduler.sglang_plugin.setup_ray_worker'}}, or set {PLUGIN_ENABLED_VAR}=0 to run sglang unpatched"
        )
    for i, info in enumerate(infos):
        logger.info("fairshare: scheduler %d: policy %s", i, info[INIT_INFO_KEY])


def setup_ray_worker() -> None:
    """For sglang's Ray launcher, whose scheduler actors never call `load_plugins()`: pass
    ``runtime_env={"worker_process_setup_hook": "scheduler.sglang_plugin.setup_ray_worker"}``. Ray calls it
    with no arguments when each worker process starts, before any actor is built in it."""
    from sglang.srt.plugins import load_plugins

    load_plugins()
