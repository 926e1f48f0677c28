"""Which of the plugin's rules costs a document's prefill on a CPU sglang engine, with chats beside it?

    python -m benchmarks.doc_prefill_by_rule

One CPU sglang 0.5.23 engine per variant (the peer benchmark's settings and tiny 32,768-token model), a
12,000-token document sent while a chat (a 40-token question, 16 output tokens) is sent every 0.5 s: the
document's time to first token, its prefill rate (and its ratio to the plugin switched off), and the chats'
TTFTs while it prefilled. Variants: the plugin off, the policy as shipped for CPU engines (config.sglang-cpu.yaml's,
with the peer benchmark's class bound: what `loadtests.peers` runs), the plugin's default rules, and the default with
one rule off.
Writes docs/results/doc-prefill-by-rule/ (`harness.results`).
"""

from __future__ import annotations

import random
import tempfile
import threading
import time
from pathlib import Path

from harness.cpu_env import cpu_sglang_env
from harness.results import records
from harness.sglang_server import LocalServer
from loadtests import prompts
from loadtests.peers import EngineSettings, app_policy, build_model, chars_per_token, first_content_s

DOC_TOKENS = 12_000
CHAT_EVERY_S = 0.5
VARIANTS: dict[str, dict[str, object]] = {
    "plugin off": {"plugin_enabled": False},
    "plugin as shipped": app_policy(EngineSettings(), upstream=False),
    "plugin default": {},
    "adaptive_pass off": {"adaptive_pass": False},
    "mixed_decode off": {"mixed_decode": False},
    "fair_share off": {"fair_share": False},
}


def run_variant(model: Path, env: dict[str, object], cpt: float, log: Path) -> tuple[float, list[float]]:
    rng = random.Random(0)
    with LocalServer(model, EngineSettings().server_args(), cpu_sglang_env(**env), log) as server:
        url = f"http://127.0.0.1:{server.port}"
        for _ in range(2):
            first_content_s(url, str(model), "hello", 2)
        chats: list[float] = []
        done = threading.Event()

        def chat_loop() -> None:
            while not done.is_set():
                chats.append(first_content_s(url, str(model), prompts.question(40, cpt, rng), 16))
                time.sleep(CHAT_EVERY_S)

        chatter = threading.Thread(target=chat_loop)
        chatter.start()
        time.sleep(1.0)
        document = prompts.document("d", DOC_TOKENS, cpt, rng) + "\nQuestion?"
        doc_s = first_content_s(url, str(model), document, 1)
        done.set()
        chatter.join()
    return doc_s, sorted(chats)


@records("doc-prefill-by-rule", "A document's prefill on one CPU sglang engine, chats beside it, by plugin rule")
def main() -> int:
    with tempfile.TemporaryDirectory(prefix="doc-prefill-") as tmp:
        model = build_model(Path(tmp) / "model", EngineSettings().context_tokens)
        cpt = chars_per_token(model)
        print(f"{DOC_TOKENS}-token document; a 40-token chat every {CHAT_EVERY_S} s beside it; {EngineSettings()}")
        print(
            f"{'variant':<20} {'doc TTFT s':>10} {'doc tok/s':>10} {'vs off':>7} {'chats':>6} {'chat p50 s':>10} "
            f"{'chat max s':>10}"
        )
        off_rate = None
        for name, env in VARIANTS.items():
            doc_s, chats = run_variant(model, env, cpt, Path(tmp) / f"{name.replace(' ', '_')}.log")
            rate = DOC_TOKENS / doc_s
            off_rate = off_rate or rate
            p50, worst = (chats[len(chats) // 2], chats[-1]) if chats else (float("nan"), float("nan"))
            print(
                f"{name:<20} {doc_s:>10.2f} {rate:>10,.0f} {rate / off_rate:>6.2f}x {len(chats):>6} {p50:>10.3f} "
                f"{worst:>10.3f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
