"""fairshare-serve's scheduling policy core: engine-agnostic, no engine imports.

Package map: `config` (the one typed config), `snapshot` (what the policy sees and decides),
`admission` (skip-ahead scan, anti-starvation), `fair_share` (chunk shares), `pass_budget`
(pass size from short-request activity), `interleave` (decode interleave), `diagnostics`
(log lines), `planner` (one pass, tying them together), `sim` (the simulator),
`sglang_plugin` (the same policy inside sglang).
"""

from scheduler.config import PolicyConfig
from scheduler.planner import PassPlanner
from scheduler.snapshot import Candidate, Grant, PassPlan, QueueSnapshot

__all__ = ["Candidate", "Grant", "PassPlan", "PassPlanner", "PolicyConfig", "QueueSnapshot"]
