"""The slot ceiling (`scheduler.sim.ceiling`): a bound on document throughput beside streaming chats that no run
exceeds, and that puts 0.95x the baseline out of reach on `kv-burst` at the h100 preset's 32 running slots for a
policy that serves the chats as they arrive."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.sim.ceiling import slot_ceiling
from scheduler.sim.experiments import long_tok_per_s, run_spec
from scheduler.sim.presets import H100_8B
from scheduler.sim.workload import Group, TokenDist, Workload, scenario
from scheduler.traffic import TrafficClass

STATIC = "fairshare:slo_sizing=false,interactive_pass_tokens={},quiet_pass_tokens=8192"


def ratio_and_ceiling(workload: Workload, spec: str, preset=H100_8B) -> tuple[float, float | None]:
    base, run = run_spec(workload, "baseline", preset), run_spec(workload, spec, preset)
    return long_tok_per_s(run) / long_tok_per_s(base), slot_ceiling(preset, base, run)


def test_on_kv_burst_no_policy_that_serves_the_chats_reaches_095x_baseline():
    workload = scenario("kv-burst", H100_8B)
    for spec in ("fairshare", STATIC.format(1536)):
        ratio, ceiling = ratio_and_ceiling(workload, spec)
        assert ceiling is not None and ratio <= ceiling < 0.95


def test_a_run_that_leaves_chats_waiting_until_the_documents_are_done_gets_a_higher_bound():
    # baseline itself (first come, first served: chats wait behind the burst) serves few chat tokens in the windows.
    workload = scenario("kv-burst", H100_8B)
    _, served = ratio_and_ceiling(workload, "fairshare")
    _, starved = ratio_and_ceiling(workload, "baseline")
    assert served is not None and starved is not None and starved > served


@settings(max_examples=12, deadline=None)
@given(
    slots=st.integers(3, 8),
    docs=st.integers(2, 4),
    chat_rate=st.floats(0.5, 6.0),
    output=st.integers(8, 64),
    pass_tokens=st.sampled_from([256, 1024, 4096]),
    seed=st.integers(0, 1000),
)
def test_no_run_beats_its_ceiling(slots, docs, chat_rate, output, pass_tokens, seed):
    """Documents arriving together, chats streaming among them: whatever the policy's pass size, its document
    throughput stays within the ceiling (slots few enough that the chats often queue past the documents)."""
    preset = H100_8B.model_copy(update={"max_running_requests": slots})
    workload = Workload(
        name="saturated",
        duration_s=8.0,
        seed=seed,
        groups=[
            Group(
                name="doc",
                traffic_class=TrafficClass.LONG,
                count=docs,
                prompt_tokens=TokenDist(low=30_000, high=60_000),
                output_tokens=4,
            ),
            Group(name="chat", count=1_000, prompt_tokens=200, output_tokens=output, rate_per_s=chat_rate),
        ],
    )
    for spec in ("fairshare", STATIC.format(pass_tokens)):
        ratio, ceiling = ratio_and_ceiling(workload, spec, preset)
        assert ceiling is not None and ratio <= ceiling * (1 + 1e-9)
