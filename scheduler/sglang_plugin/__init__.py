"""The policy core inside sglang 0.5.23's own scheduler, as a general plugin (sglang itself unmodified).

Module map: `loading` (entry point, version guard, Ray worker hook), `env` (the plugin's switches),
`hooks` (targets and hook functions), `attach` (the policy attached to one scheduler: config from its
values, start-up log), `translate` (sglang state -> `QueueSnapshot`), `adder` (a `PassPlan` applied
through sglang's `PrefillAdder`), `server_args` (mixed decode and decode interval onto sglang's arguments).
"""

from scheduler.sglang_plugin.loading import load, setup_ray_worker

__all__ = ["load", "setup_ray_worker"]
