"""A stream's delta events from `EventTemplate` are byte for byte what serializing each chunk model writes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from serve_app.api.endpoints import CHAT
from serve_app.engines.sim.formats import FORMATS, ResponseIds
from serve_app.protocol.sse import EventTemplate, sse

IDS = ResponseIds('chatcmpl-ab"c\\d', 1700000000, "model/é")


@pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=lambda f: f.endpoint.name)
@pytest.mark.parametrize("exclude", [None, {"usage"}], ids=["usage", "no-usage"])
@given(text=st.text())
def test_template_event_equals_the_model_event(fmt, exclude, text: str) -> None:
    template = EventTemplate(fmt.delta(IDS, EventTemplate.SLOT), exclude=exclude)
    expected = sse(fmt.delta(IDS, text), exclude=exclude)
    assert template(text) == expected
    payload = json.loads(expected.removeprefix("data: "))
    got = payload["choices"][0]["delta"]["content"] if fmt.endpoint is CHAT else payload["choices"][0]["text"]
    assert got == text


def test_a_model_without_the_slot_is_refused() -> None:
    with pytest.raises(ValueError, match="SLOT exactly once"):
        EventTemplate(FORMATS["chat"].delta(IDS, "no slot here"))
