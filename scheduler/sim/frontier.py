"""The pass-size trade-off as a frontier: lone-document speed against a short arrival's wait.

A pass in flight cannot be interrupted, so the pass size a lone document runs at sets both its
prefill speed and how long a question arriving mid-prefill waits. The article's patch has the knob F; ours is
the static quiet pass size (`quiet_pass_tokens` with SLO sizing off, the interactive pass staying at its default;
SLO sizing picks a point of this curve from the TTFT target). Each
point: lone throughput as a fraction of unchunked prefill (`doc-lone`), and the question's
mean TTFT in `doc-question`, next to the cost model's floor for that pass size: a question arriving at
a random moment waits on average half the pass in flight, then runs in one near-empty pass of its own
(`floor_s`); no policy with passes of that size can do better on average.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from pydantic import BaseModel
from tqdm import tqdm

from scheduler.config import default_interactive_pass_tokens
from scheduler.pass_cost import chunk_ctx_pairs
from scheduler.sim.experiments import QUESTION_TIMES_S, UNCHUNKED, long_tok_per_s, run_spec, single_session
from scheduler.sim.presets import Preset
from scheduler.sim.workload import QUESTION_TOKENS, doc_lone

PATCH_CAPS = [4096, 2048, 1024, 768, 512, 409, 300]
OUR_QUIET_PASSES = [8192, 4096, 3072, 2048, 1536, 1024, 768, 512, 409, 300]


class Point(BaseModel):
    policy: str
    knob: int
    lone_fraction: float
    """Lone-document prefill speed / unchunked."""
    single_fraction: float
    """The document's prefill speed in the single-session run (with the question) / unchunked."""
    short_ttft_s: float
    floor_s: float
    """Half the document's pass in flight plus one pass of the question alone, on the cost model."""

    @property
    def over_floor(self) -> float:
        return self.short_ttft_s / self.floor_s


def ttft_floor_s(preset: Preset, pass_tokens: int, doc_tok_per_s: float) -> float:
    """The cost model's floor for a question arriving mid-prefill of a document in passes of `pass_tokens`:
    half the pass in flight (at the context the document has reached) plus the question's own pass."""
    ctx = int(doc_tok_per_s * statistics.fmean(QUESTION_TIMES_S))
    in_flight = preset.cost.pass_s(pass_tokens, chunk_ctx_pairs(ctx, pass_tokens), 0, 0)
    own = preset.cost.pass_s(QUESTION_TOKENS, chunk_ctx_pairs(0, QUESTION_TOKENS), 0, 0)
    return in_flight / 2 + own


class Frontier(BaseModel):
    preset: str
    unchunked_tok_per_s: float
    points: list[Point]

    def curve(self, policy: str) -> list[Point]:
        return [p for p in self.points if p.policy == policy]

    def dominated(self, point: Point, policy: str) -> bool:
        """Does `policy` have a point at least as fast for a lone document and no slower for the question?"""
        return any(
            q.lone_fraction >= point.lone_fraction and q.short_ttft_s <= point.short_ttft_s for q in self.curve(policy)
        )


def _point(policy: str, knob: int, spec: str, preset: Preset, unchunked: float) -> Point:
    ttft, single = single_session(spec, preset)
    lone = long_tok_per_s(run_spec(doc_lone(), spec, preset))
    return Point(
        policy=policy,
        knob=knob,
        lone_fraction=lone / unchunked,
        single_fraction=single / unchunked,
        short_ttft_s=ttft,
        floor_s=ttft_floor_s(preset, knob, single),
    )


def sweep(preset: Preset) -> Frontier:
    unchunked = long_tok_per_s(run_spec(doc_lone(), UNCHUNKED, preset))
    knobs = [("article-patch", f, f"article-patch:per_request_cap_tokens={f}") for f in PATCH_CAPS]
    knobs += [
        (
            "fairshare",
            q,
            f"fairshare:slo_sizing=false,quiet_pass_tokens={q},"
            f"interactive_pass_tokens={default_interactive_pass_tokens(q)}",
        )
        for q in OUR_QUIET_PASSES
    ]
    # disable=None: a progress bar on a terminal only.
    points = [_point(policy, knob, spec, preset, unchunked) for policy, knob, spec in tqdm(knobs, disable=None)]
    return Frontier(preset=preset.name, unchunked_tok_per_s=unchunked, points=points)


def plot(frontier: Frontier, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy, marker in (("article-patch", "s"), ("fairshare", "o")):
        pts = frontier.curve(policy)
        ax.plot(
            [100 * p.lone_fraction for p in pts],
            [p.short_ttft_s for p in pts],
            marker=marker,
            label=f"{policy} (knob: {'F' if policy == 'article-patch' else 'quiet pass tokens'})",
        )
        for p in pts:
            ax.annotate(
                str(p.knob),
                (100 * p.lone_fraction, p.short_ttft_s),
                fontsize=7,
                textcoords="offset points",
                xytext=(3, 3),
            )
    ax.set(
        xlabel="lone document prefill speed (% of unchunked)",
        ylabel="question TTFT mid-prefill (s, log)",
        yscale="log",
        title=f"Pass-size frontier on {frontier.preset}",
    )
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
