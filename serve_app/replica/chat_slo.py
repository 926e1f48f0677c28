"""Whether this replica's chats meet the chat SLO, judged on each response as it leaves the replica: the share of
the latest ones that did is the replica's `chat_slo_attainment`, which the SLO autoscaling policy scales up on
(`serve_app.autoscaling`).

One rule with the ingress: a response's TTFT and gaps are `scheduler.slo.StreamLatency`'s, counted from the events that
carry generated output (text, reasoning text or a tool call: `protocol.sse.output_events`), and judged by `meets_slo`
against the targets the router gave it (`RouteDecision.slo`, which the ingress judges by: chats by this replica's TTFT
and TBT targets, documents not at all). The clock starts when the replica receives the request and the bytes are timed
as they leave it, paced: what the replica and its engine add, and what more replicas can take away (the network and the
ingress are not in it). Only responses that end normally are judged, as at the ingress: a request refused at admission
(429) is not, and the queue that refused it is what the backlog and TTFT rules read.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from scheduler.slo import SloTargets, StreamLatency
from serve_app.autoscaling.signals import ATTAINMENT_WINDOW_S
from serve_app.protocol.sse import TEXT_FIELDS, output_events
from serve_app.replica.backend import EngineKind, ResponseBody, ResponseItem, ResponseStart

MIN_JUDGED = 10
"""Fewer verdicts in the window say nothing: no attainment (at 10, one miss is exactly the default floor, 0.9)."""
MAX_JUDGED = 4096


class ChatJudge:
    """One response on its way out of the replica, timed from its receipt (`started_s`, `time.perf_counter()`)."""

    def __init__(self, kind: EngineKind, targets: SloTargets, started_s: float) -> None:
        self._text_field = TEXT_FIELDS[kind]
        self._targets = targets
        self._latency = StreamLatency(started_s)
        self._failed = False

    def sent(self, items: Sequence[ResponseItem], at_s: float) -> None:
        """`items` left the replica at `at_s`."""
        for item in items:
            if isinstance(item, ResponseBody) and item.error_status is None:
                self._latency.tokens(output_events(item.data, self._text_field), at_s)
            elif not isinstance(item, ResponseStart) or item.status >= 400:
                self._failed = True  # a refusal, an error response or an error ending the stream: not a normal end

    def verdict(self) -> bool | None:
        """Whether the response met its targets; None when it did not end normally (not judged)."""
        return None if self._failed else self._latency.meets(self._targets)


class RecentAttainment:
    """The share of the verdicts of the latest `window_s` that were met."""

    def __init__(self, window_s: float = ATTAINMENT_WINDOW_S, min_judged: int = MIN_JUDGED) -> None:
        self.window_s = window_s
        self.min_judged = min_judged
        self._verdicts: deque[tuple[float, bool]] = deque(maxlen=MAX_JUDGED)

    def add(self, met: bool, at_s: float) -> None:
        """One response's verdict, at `at_s` (`time.monotonic()`)."""
        self._verdicts.append((at_s, met))

    def share(self, now_s: float) -> float | None:
        """The share met among the window's verdicts; None with fewer than `min_judged`."""
        while self._verdicts and self._verdicts[0][0] < now_s - self.window_s:
            self._verdicts.popleft()
        if len(self._verdicts) < self.min_judged:
            return None
        return sum(met for _, met in self._verdicts) / len(self._verdicts)
