"""Two pass traces of the same mixes compared, mix by mix and prefill pass by prefill pass: sglang's and the
simulator's (`sim_vs_sglang`).

Two prefill passes are identical when they admit the same requests with the same prefill tokens, cut the same
request, carry as many decoding rows, reject the same requests for KV capacity and leave as many requests waiting
(`pass_view`). The first differing pass of a mix is explained when its reason is a known one (`explain`); the
mix's later differing passes follow from it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.workload_mixes import Mix


def prefill_passes(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["admitted"]]


def pass_view(record: dict[str, Any]) -> dict[str, Any]:
    """What is compared for one prefill pass."""
    return {
        "admitted": [tuple(a) for a in record["admitted"]],
        "cut": [g[0] for g in record["grants"] if g[2]],
        "decode_rows": record["decode_rows"],
        "rejected": [r[0] for r in record["rejections"]],
        "num_waiting_after": record["num_waiting"] - len(from_queue(record)),
    }


KV_BOOKKEEPING = "KV bookkeeping"
"""sglang's admission counts KV a few tokens apart from the simulator's: a request's need one page more
(`PrefillAdder.per_req_token_overhead`), free KV only below its remaining total, the half-prefilled request's
remainder one page more, one token per row of the running batch when mixed chunk is on (`num_mixed_decode_tokens`),
and one token less for a stream the pass in flight does not decode (its next token needs no KV yet). A request
judged within `kv_window` tokens of fitting can fit on one side and not on the other."""
AFTER = "after "
"""Prefix of the reason of a later differing pass of a mix whose first difference has a known reason."""


def kv_window(record: dict[str, Any], num_admitted_before: int) -> int:
    """How far apart sglang's and the simulator's margins (free KV less need) of one request can be: the page of its
    need and of each request admitted before it in the pass, the strict comparison, the continuing request's page,
    and a token per stream of the running batch."""
    return 3 + num_admitted_before + record["num_decoding"]


def from_queue(record: dict[str, Any]) -> list[str]:
    continuing = {c[0] for c in record["continuing"]}
    return [rid for rid, _ in record["admitted"] if rid not in continuing]


def margins(record: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Each judged request's free KV less its need when the scan reached it (the free KV of the pass less what the
    requests admitted before it took), in the record's own figures, and how many were admitted before it."""
    admitted = set(from_queue(record))
    free, before = record["free_kv_tokens"], 0
    out = {}
    for rid, _, need in record["judged"]:
        out[rid] = (free - need, before)
        if rid in admitted:
            free, before = free - need, before + 1
    return out


def explain(real: dict[str, Any], sim: dict[str, Any]) -> str | None:
    """Why the first differing pass of a mix differs, when the reason is a known one; None otherwise. Both records
    are the passes' raw records. `KV_BOOKKEEPING`: the first request in sglang's scan that one side admits, the other
    rejected for KV capacity, and it was within `kv_window` tokens of fitting in the simulator's figures."""
    fate_real = {rid: rid in set(from_queue(real)) for rid, *_ in real["judged"]}
    fate_sim = {rid: rid in set(from_queue(sim)) for rid, *_ in sim["judged"]}
    first = next((rid for rid in fate_real if rid in fate_sim and fate_real[rid] != fate_sim[rid]), None)
    if first is None:
        return None
    refused = real if fate_sim[first] else sim
    if first not in {r[0] for r in refused["rejections"]}:
        return None
    margin, before = margins(sim)[first]
    if abs(margin) <= max(kv_window(real, before), kv_window(sim, before)):
        return KV_BOOKKEEPING
    return None


@dataclass
class MixComparison:
    mix: str
    real_records: list[dict[str, Any]]
    """sglang's prefill passes of the mix (raw pass records)."""
    sim_records: list[dict[str, Any]]

    @property
    def real(self) -> list[dict[str, Any]]:
        return [pass_view(r) for r in self.real_records]

    @property
    def sim(self) -> list[dict[str, Any]]:
        return [pass_view(r) for r in self.sim_records]

    @property
    def pairs(self) -> list[tuple[dict[str, Any] | None, dict[str, Any] | None]]:
        return [(a and pass_view(a), b and pass_view(b)) for a, b in self.record_pairs]

    @property
    def record_pairs(self) -> list[tuple[dict[str, Any] | None, dict[str, Any] | None]]:
        longer = max(len(self.real_records), len(self.sim_records))
        pad = [None] * longer
        return list(zip([*self.real_records, *pad][:longer], [*self.sim_records, *pad][:longer], strict=True))

    @property
    def num_passes(self) -> int:
        """The passes compared: sglang's, or the simulator's where it took more."""
        return max(len(self.real_records), len(self.sim_records))

    @property
    def num_identical(self) -> int:
        return sum(a == b for a, b in self.pairs)

    def differences(self) -> list[tuple[int, dict[str, Any] | None, dict[str, Any] | None, str | None]]:
        """(pass of the mix, sglang's view, the simulator's, the reason or None) for every differing pass. The first
        difference of a mix is judged by `explain`; the passes after it differ because of it (``after ...``), or
        stay unexplained with it."""
        out: list[tuple[int, dict[str, Any] | None, dict[str, Any] | None, str | None]] = []
        cause: str | None = None
        for i, (a, b) in enumerate(self.record_pairs):
            va, vb = a and pass_view(a), b and pass_view(b)
            if va == vb:
                continue
            if not out:
                cause = explain(a, b) if a is not None and b is not None else None
                out.append((i, va, vb, cause))
            else:
                out.append((i, va, vb, None if cause is None else AFTER + cause))
        return out

    def margin_gaps(self) -> list[tuple[int, int]]:
        """For each request judged by both sides in an identical pass: how far sglang's margin (free KV less need)
        is from the simulator's, and the `kv_window` that `KV_BOOKKEEPING` assumes it within."""
        out = []
        for a, b in self.record_pairs:
            if a is None or b is None or pass_view(a) != pass_view(b):
                continue
            ours = margins(b)
            out += [(m - ours[rid][0], kv_window(a, k)) for rid, (m, k) in margins(a).items() if rid in ours]
        return out


@dataclass
class Agreement:
    setup: str
    mixes: list[MixComparison] = field(default_factory=list)
    num_busy_arrivals: int = 0
    """Requests that arrived while their mix ran (staggered batches sent to a busy engine)."""

    @property
    def num_passes(self) -> int:
        return sum(m.num_passes for m in self.mixes)

    @property
    def num_identical(self) -> int:
        return sum(m.num_identical for m in self.mixes)

    @property
    def share_identical(self) -> float:
        return self.num_identical / self.num_passes if self.num_passes else 1.0

    @property
    def explained(self) -> Counter[str]:
        return Counter(reason for m in self.mixes for *_, reason in m.differences() if reason is not None)

    @property
    def unexplained(self) -> list[tuple[str, int, dict[str, Any] | None, dict[str, Any] | None]]:
        return [(m.mix, i, a, b) for m in self.mixes for i, a, b, reason in m.differences() if reason is None]

    def summary(self, max_listed: int = 10) -> str:
        reasons = "".join(f"differing only by {r}: {n}; " for r, n in sorted(self.explained.items()))
        lines = [
            f"{self.setup}: {len(self.mixes)} mixes ({self.num_busy_arrivals} requests arrived mid-mix), "
            f"prefill passes compared {self.num_passes} "
            f"(sglang {sum(len(m.real) for m in self.mixes)}, simulator {sum(len(m.sim) for m in self.mixes)}); "
            f"identical {self.num_identical} ({100 * self.share_identical:.1f}%); {reasons}"
            f"unexplained {len(self.unexplained)}"
        ]
        for mix, i, a, b in self.unexplained[:max_listed]:
            lines.append(f"  {mix} pass {i}: sglang {a}\n  {' ' * len(mix)}        sim    {b}")
        return "\n".join(lines)


def compare(
    name: str, mixes: Sequence[Mix], real_records: Sequence[dict[str, Any]], sim_records: Sequence[dict[str, Any]]
) -> Agreement:
    """Pair the prefill passes of each mix (a pass belongs to the mix of the requests it admits; passes of other
    mixes are left out)."""
    mix_of = {r.rid: mix.name for mix in mixes for r in mix.requests}

    def by_mix(records: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {mix.name: [] for mix in mixes}
        for record in prefill_passes(records):
            if (mix := mix_of.get(record["admitted"][0][0])) is not None:
                out[mix].append(record)
        return out

    real, sim = by_mix(real_records), by_mix(sim_records)
    return Agreement(name, [MixComparison(mix.name, real[mix.name], sim[mix.name]) for mix in mixes])
