"""The tiny model's byte-level tokenizers: every string has tokens, and over ASCII every token is whole text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.tiny_model import build_byte_tokenizer
from loadtests.peers import build_model
from tests.hypothesis_budget import examples

ASCII_TEXT = st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=200)


def load(directory: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)


@pytest.fixture(scope="module")
def all_bytes(tmp_path_factory: pytest.TempPathFactory) -> Any:
    directory = tmp_path_factory.mktemp("bytes")
    build_byte_tokenizer(directory, 1000)
    return load(directory)


@pytest.fixture(scope="module")
def ascii_bytes(tmp_path_factory: pytest.TempPathFactory) -> Any:
    directory = tmp_path_factory.mktemp("ascii")
    build_byte_tokenizer(directory, 1000, ascii_only=True)
    return load(directory)


def partial_tokens(tok: Any) -> list[int]:
    """Tokens that, emitted alone, show no whole text: nothing (a special token, skipped) or a partial character."""
    out = []
    for i in range(len(tok)):
        text = tok.decode([i], skip_special_tokens=True)
        if not text or "\ufffd" in text:
            out.append(i)
    return out


def test_over_ascii_only_the_special_tokens_are_not_whole_text(ascii_bytes: Any, all_bytes: Any) -> None:
    assert sorted(partial_tokens(ascii_bytes)) == sorted(ascii_bytes.all_special_ids)
    # All 256 bytes: the 128 of 0x80 and above are parts of characters, emitted alone.
    assert len(partial_tokens(all_bytes)) >= 128 + len(all_bytes.all_special_ids)


@settings(max_examples=examples(200), deadline=None, derandomize=True)
@given(ASCII_TEXT)
def test_ascii_text_round_trips_in_the_same_tokens_either_way(ascii_bytes: Any, all_bytes: Any, text: str) -> None:
    ids = ascii_bytes(text, add_special_tokens=False)["input_ids"]
    assert ascii_bytes.decode(ids) == text
    # Prompts are sized by characters per token: the same over ASCII with either alphabet.
    assert len(ids) == len(all_bytes(text, add_special_tokens=False)["input_ids"])


def test_other_characters_are_unknown_over_ascii_and_bytes_over_all(ascii_bytes: Any, all_bytes: Any) -> None:
    text = "ünï 🦊"
    assert ascii_bytes.unk_token_id in ascii_bytes(text, add_special_tokens=False)["input_ids"]
    assert all_bytes.decode(all_bytes(text, add_special_tokens=False)["input_ids"]) == text


def test_the_peer_benchmarks_model_emits_whole_text(tmp_path: Path) -> None:
    model = build_model(tmp_path, context_tokens=1024)
    tok = load(model)
    assert sorted(partial_tokens(tok)) == sorted(tok.all_special_ids)
