"""A tiny random-weight Llama and a tokenizer built in code: what the CPU tests and benchmarks serve.

Nothing is downloaded. `build_tiny_model` writes a random-weight Llama (transformers) and, optionally, a
word-level tokenizer (``w0 w1 ...``, one token per word, a plain chat template) or a byte-level BPE one, so
sglang can serve text and the OpenAI endpoints. `TinyModelSpec.max_position_embeddings` is the context length:
a long one (32,768) makes a 12,000-token document take seconds to prefill on one core, the regime the project
is about.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {{ eos_token }} {% endfor %}"
    "{% if add_generation_prompt %}assistant : {% endif %}"
)
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>", ":")


@dataclass(frozen=True)
class TinyModelSpec:
    vocab_size: int = 1_000
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    max_position_embeddings: int = 8_192
    tokenizer: bool = True
    byte_level: bool = False
    """A byte-level BPE tokenizer instead of the word-level one: every string has tokens, so grammar-constrained
    output (JSON, tool calls) can be generated; token counts of text are then not one per word."""
    ascii_only: bool = False
    """With `byte_level`: the 128 ASCII bytes instead of all 256, any other character `<unk>`. Every token the model
    can emit is then whole characters, as a trained model's tokens nearly always are in English text. With all 256,
    random weights emit a partial character (a byte of 0x80 or more) about a third of the time, which sglang holds
    back until the character completes: about a third of new chats' first text came a token or more late
    (`benchmarks.first_text`), and beside a prefilling document each of those tokens waits for a pass."""
    seed: int = 0


def build_tokenizer(directory: Path, vocab_size: int) -> None:
    """A word-level tokenizer: the special tokens, then ``w0 .. w{n}``; unknown words map to ``<unk>``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = [f"w{i}" for i in range(vocab_size - len(SPECIAL_TOKENS))]
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *words])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(directory)


BYTE_CORPUS = (
    'w1 w2 w3 {"ok": true, "size": "small"} [{"name": "lookup", "parameters": {"ok": false}}] '
    "the quick brown fox jumps over the lazy dog 0123456789 , . : ; ! ? ( ) [ ] { } \" ' - _ / \\"
)


def build_byte_tokenizer(directory: Path, vocab_size: int, ascii_only: bool = False) -> int:
    """A byte-level BPE tokenizer trained in-process on a few lines (no download): all 256 bytes (the 128 ASCII ones
    with `ascii_only`) plus merges, at most `vocab_size` tokens. Returns its size (the model's vocabulary must match
    it: no id without a token)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if ascii_only:  # each ASCII byte as the pre-tokenizer spells it
        alphabet = [core.pre_tokenizer.pre_tokenize_str(chr(b))[0][0] for b in range(128)]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[t for t in SPECIAL_TOKENS if t != ":"],  # a special ":" would vanish from decoded JSON
        initial_alphabet=alphabet,
        show_progress=False,
    )
    core.train_from_iterator([BYTE_CORPUS] * 50, trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(directory)
    return len(tok)


def build_tiny_model(directory: Path, spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """A random-weight Llama (bf16) saved with transformers in seconds; with a local tokenizer if asked."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(spec.seed)
    directory.mkdir(parents=True, exist_ok=True)
    vocab_size = spec.vocab_size
    if spec.tokenizer and spec.byte_level:
        vocab_size = build_byte_tokenizer(directory, spec.vocab_size, spec.ascii_only)
    elif spec.tokenizer:
        build_tokenizer(directory, spec.vocab_size)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_attention_heads,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        dtype="bfloat16",
    )
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(directory)
    return directory


def main(argv: list[str] | None = None) -> int:
    """`python -m harness.tiny_model --build-tiny-model DIR`: the tiny model `config.sglang-cpu.yaml` serves."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m harness.tiny_model")
    parser.add_argument("--build-tiny-model", type=Path, required=True, metavar="DIR", help="where to write it")
    parser.add_argument(
        "--context-tokens", type=int, default=TinyModelSpec.max_position_embeddings, help="the model's context length"
    )
    args = parser.parse_args(argv)
    spec = TinyModelSpec(byte_level=True, max_position_embeddings=args.context_tokens)
    print(build_tiny_model(args.build_tiny_model, spec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
