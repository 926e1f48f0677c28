"""The load test's knobs (parsing, clear errors) and the shapes' timelines."""

from __future__ import annotations

import argparse
import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from loadtests.settings import LoadSettings, TokenSpec, from_options, register, to_flags
from loadtests.stages import KneeWatch, article_stages, percentile_of_counts, ramp_stages, stage_index


def parsed(argv: list[str]) -> LoadSettings:
    parser = argparse.ArgumentParser()
    register(parser, env_vars=False)
    return from_options(parser.parse_args(argv))


def test_flags_round_trip_into_settings() -> None:
    values = {"doc_tokens": "130000,100000", "think_s": "7.3", "chat_weight": "0", "time_scale": "0.2"}
    s = parsed(to_flags(values))
    assert s.doc_tokens.cycle == (130_000, 100_000)
    assert s.think_s == (7.3, 7.3)
    assert (s.chat_weight, s.time_scale) == (0, 0.2)
    assert s.wall_s(10) == pytest.approx(2.0)
    assert parsed([]) == LoadSettings()  # nothing given: the defaults


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--doc-tokens", "lots"], "doc_tokens"),
        (["--doc-tokens", "9:3"], "doc_tokens"),
        (["--think-s", "5:1"], "think_s"),
        (["--time-scale", "0"], "time_scale"),
        (["--chat-weight", "0", "--doc-weight", "0"], "doc_weight"),
    ],
)
def test_bad_values_are_named(argv: list[str], names: str) -> None:
    with pytest.raises(ValidationError) as e:
        parsed(argv)
    message = str(e.value)
    assert names in message or "both 0" in message


@given(st.lists(st.integers(1, 200_000), min_size=1, max_size=6), st.integers(0, 50))
def test_a_cycle_is_taken_in_turn(values: list[int], index: int) -> None:
    spec = TokenSpec.parse(",".join(map(str, values)))
    assert spec.pick(index, random.Random(0)) == values[index % len(values)]


@given(st.integers(1, 1000), st.integers(1, 1000), st.integers(0, 10**6))
def test_a_range_stays_in_range(a: int, b: int, seed: int) -> None:
    low, high = min(a, b), max(a, b)
    assert low <= TokenSpec.parse(f"{low}:{high}").pick(0, random.Random(seed)) <= high


@given(st.integers(1, 10), st.integers(1, 60), st.floats(1, 120))
def test_ramp_climbs_to_the_maximum(step_users: int, max_users: int, step_s: float) -> None:
    stages = ramp_stages(LoadSettings(ramp_step_users=step_users, ramp_max_users=max_users, ramp_step_s=step_s))
    users = [s.users for s in stages]
    assert users == sorted(users) and users[-1] == max_users and users[0] == min(step_users, max_users)
    assert all(b.until_s > a.until_s for a, b in itertools.pairwise(stages))
    assert stage_index(stages, 0.0) == 0 and stage_index(stages, stages[-1].until_s) is None


def test_article_timeline() -> None:
    stages = article_stages(LoadSettings(article_single_s=150, article_four_s=270))
    assert [(s.until_s, s.users) for s in stages] == [(150, 2), (420, 5)]
    assert stage_index(stages, 149.9) == 0 and stage_index(stages, 150) == 1


class Entry:
    def __init__(self) -> None:
        self.response_times: dict[int, int] = {}

    def add(self, ms: int, n: int = 1) -> None:
        self.response_times[ms] = self.response_times.get(ms, 0) + n


def test_knee_watch_judges_each_step_alone() -> None:
    entry, knee = Entry(), KneeWatch()
    assert not knee.crossed(0, entry, threshold_ms=1000)
    entry.add(100, 50)
    assert not knee.crossed(0, entry, 1000)
    assert not knee.crossed(1, entry, 1000)  # step 0 closed: p99 100 ms
    entry.add(100, 199)
    entry.add(5000, 1)  # 0.5% of step 1 is slow: p99 is still 100 ms
    assert not knee.crossed(2, entry, 1000)
    entry.add(3000, 10)
    assert knee.crossed(3, entry, 1000)  # step 2 was all slow
    assert knee.p99_ms == [100, 100, 3000]


@given(st.dictionaries(st.integers(0, 10_000), st.integers(1, 50), min_size=1))
def test_percentile_of_counts_is_an_observed_value_at_the_rank(counts: dict[int, int]) -> None:
    p = percentile_of_counts(counts, 0.99)
    n = sum(counts.values())
    assert p in counts
    assert sum(c for t, c in counts.items() if t > p) <= n - int(n * 0.99)
