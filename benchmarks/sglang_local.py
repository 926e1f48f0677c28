"""A local sglang server and a tiny random-weight model: shared by the GPU check and the CPU tests.

Nothing is downloaded. `build_tiny_model` writes a random-weight Llama (transformers) and, optionally, a
word-level tokenizer built in code (``w0 w1 ...``, one token per word, a plain chat template) so sglang
can serve text and the OpenAI endpoints. `LocalServer` starts ``python -m sglang.launch_server`` in its
own process group on a free loopback port, waits for ``/health`` with a deadline, and stops the whole
group (SIGTERM, then SIGKILL) and nothing else.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {{ eos_token }} {% endfor %}"
    "{% if add_generation_prompt %}assistant : {% endif %}"
)
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>", ":")
PLUGIN_START_LINE = "long_prefill_token_threshold="
"""In the fairshare plugin's start-up line, logged once by every scheduler process it attaches to."""


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
    seed: int = 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def build_byte_tokenizer(directory: Path, vocab_size: int) -> int:
    """A byte-level BPE tokenizer trained in-process on a few lines (no download): all 256 bytes plus merges, at
    most `vocab_size` tokens. Returns its size (the model's vocabulary must match it: no id without a token)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[t for t in SPECIAL_TOKENS if t != ":"],  # a special ":" would vanish from decoded JSON
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
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
        vocab_size = build_byte_tokenizer(directory, spec.vocab_size)
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


def launch_server_command(model_path: str | Path, port: int, args: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model_path),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *args,
    ]


def http_json(port: int, method: str, path: str, body: object | None = None, timeout_s: float = 60) -> object:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        payload = None if body is None else json.dumps(body)
        conn.request(method, path, body=payload, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{method} {path}: HTTP {resp.status}: {data[:500]!r}")
        return json.loads(data) if data else None
    finally:
        conn.close()


class LocalServer:
    """``python -m sglang.launch_server`` in its own process group; a context manager."""

    def __init__(
        self,
        model_path: str | Path,
        args: list[str],
        env: dict[str, str],
        log_path: Path,
        port: int | None = None,
        startup_timeout_s: float = 600,
        cwd: Path | None = None,
    ) -> None:
        """`cwd`: the server's working directory, first on its import path (``python -m`` puts it there)."""
        self.port = port or free_port()
        self.command = launch_server_command(model_path, self.port, args)
        self.env = env
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen(
                self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.cwd
            )
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"sglang exited with code {self.proc.returncode} while starting; log tail:\n{self.log_tail()}"
                )
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(1)
        raise TimeoutError(f"sglang not ready after {self.startup_timeout_s:.0f} s; log tail:\n{self.log_tail()}")

    def stop(self, timeout_s: float = 60) -> None:
        """Stop the server's process group (the server and the children it spawned) and nothing else."""
        if self.proc is None or self.proc.poll() is not None:
            self._kill_group(signal.SIGKILL)  # children left behind by a server that died
            return
        self._kill_group(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._kill_group(signal.SIGKILL)
            self.proc.wait(timeout=30)
        self._kill_group(signal.SIGKILL)

    def _kill_group(self, sig: signal.Signals) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_text()[-chars:]

    def request(self, method: str, path: str, body: object | None = None, timeout_s: float = 120) -> object:
        return http_json(self.port, method, path, body, timeout_s)


def main(argv: list[str] | None = None) -> int:
    """`python -m benchmarks.sglang_local --build-tiny-model DIR`: the tiny model `config.sglang-cpu.yaml` serves."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks.sglang_local")
    parser.add_argument("--build-tiny-model", type=Path, required=True, metavar="DIR", help="where to write it")
    args = parser.parse_args(argv)
    print(build_tiny_model(args.build_tiny_model, TinyModelSpec(byte_level=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
