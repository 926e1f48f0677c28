"""fairshare-serve's scheduling policy core: engine-agnostic, no engine imports.

The package map is in the README (one map, kept current there).
"""

from scheduler.config import PolicyConfig
from scheduler.planner import PassPlanner
from scheduler.snapshot import Candidate, Grant, PassPlan, QueueSnapshot

__all__ = ["Candidate", "Grant", "PassPlan", "PassPlanner", "PolicyConfig", "QueueSnapshot"]
