"""Run in a fresh process by `test_sglang_plugin_loading.py`: loading the plugin patches sglang's classes
for the rest of the process, which the pytest process must not see.

Loads the plugin the way sglang's Ray launcher needs it (Ray's own setup-hook loader calling
`scheduler.sglang_plugin.setup_ray_worker`, which is `load_plugins()`), then reports what got patched,
whether the ServerArgs hook maps the policy env, and what the *patched* `Scheduler` methods admit.
"""

import json
import logging
import os
import sys
import warnings

warnings.filterwarnings("ignore")
logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s", stream=sys.stderr)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repo root

from importlib.metadata import entry_points  # noqa: E402

from ray._private.runtime_env.setup_hook import load_and_execute_setup_hook_module  # noqa: E402

result: dict = {"entry_points": [[ep.name, ep.value] for ep in entry_points(group="sglang.srt.plugins")]}
result["setup_hook_error"] = load_and_execute_setup_hook_module("scheduler.sglang_plugin.setup_ray_worker")

from sglang.srt.arg_groups.overrides import resolving_view  # noqa: E402
from sglang.srt.managers.scheduler import Scheduler  # noqa: E402
from sglang.srt.plugins.hook_registry import HookRegistry  # noqa: E402
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler  # noqa: E402

from scheduler.sglang_plugin import hooks  # noqa: E402

result["patched"] = sorted(spec.target for spec in hooks.TARGETS if spec.target in HookRegistry._patched)
result["targets"] = sorted(spec.target for spec in hooks.TARGETS)
result["wrapped"] = {
    name: hasattr(getattr(Scheduler, name), "__wrapped__")
    for name in ("__init__", "get_prefill_adder_class", "_get_new_batch_prefill_raw")
}
args = ServerArgs(model_path="dummy", device="cpu", chunked_prefill_size=512)
args.resolve_once()
result["enable_mixed_chunk"] = resolving_view(args).enable_mixed_chunk

set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", device="cpu"))
from harness import sglang_classes  # noqa: E402

LiveScheduler = type(
    "LiveScheduler",
    (sglang_classes.StandInScheduler,),
    {
        "_get_new_batch_prefill_raw": Scheduler._get_new_batch_prefill_raw,
        "get_prefill_adder_class": Scheduler.get_prefill_adder_class,
    },
)
reqs = [
    sglang_classes.ReqSpec("holder", 2000, decode_passes=50),
    sglang_classes.ReqSpec("big", 2500, arrive_pass=1),
    sglang_classes.ReqSpec("small", 30, arrive_pass=1),
]
harness = sglang_classes.Harness(
    sglang_classes.EngineSpec(pool_tokens=4096, chunk_tokens=2048), reqs, patched=False, scheduler_cls=LiveScheduler
)
hooks.after_scheduler_init(None, harness.sched)  # what the patched Scheduler.__init__ runs at its end
result["admitted"] = [[rid for rid, _ in record.admitted] for record in harness.run(3)]
result["policy_active"] = harness.policy.inactive_reason is None
print(json.dumps(result))
