"""Locust users of the deployed service: short chat sessions and long-document sessions, streamed.

    locust -f loadtests/locustfile.py --host http://127.0.0.1:8000                 # web UI
    locust -f loadtests/locustfile.py --headless -u 8 -r 2 -t 2m --host URL         # fixed users
    locust -f loadtests/locustfile.py,loadtests/shapes/article.py --headless --host URL  # a load shape

Knobs (`locust --help`, section "Custom arguments", or `LOCUST_<NAME>` variables): see
`loadtests/settings.py`. Every request streams (`stream: true`, usage included); its SSE events are
timed as they arrive (`loadtests/sse.py`) and recorded per traffic class (`loadtests/recording.py`).
Note: Locust's own row for each HTTP request (`POST chat`, `POST document`, ...) times the response
headers only; the `TTFT`/`ITL`/`E2E` rows are the streamed timings.
"""

from __future__ import annotations

import itertools
import logging
import random
import sys
import time
import uuid
from typing import Any

import gevent
import requests
from locust import HttpUser, events, task
from locust.env import Environment
from pydantic import ValidationError

from loadtests import prompts
from loadtests.recording import SHED_STATUSES, Sample, SampleLog, fire_metrics, response_meta
from loadtests.settings import LoadSettings, describe_error, from_options, register
from loadtests.sse import SseParser, StreamOutcome, content_of, outcome

logger = logging.getLogger("loadtests")

SESSION_HEADER = "X-Session-ID"
IDLE_POLL_S = 1.0
_doc_index = itertools.count()
"""Documents started in this process: the index into a `--doc-tokens` cycle."""
_last_doc_send_s = -float("inf")
_users: dict[str, itertools.count] = {"chat": itertools.count(), "doc": itertools.count()}
"""Users started in this process, by kind: each one's seed."""


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any) -> None:
    register(parser)


@events.init.add_listener
def _on_init(environment: Environment, **_: Any) -> None:
    try:
        settings = from_options(environment.parsed_options)
    except ValidationError as e:
        sys.stderr.write(f"loadtests: bad option: {describe_error(e)}\n")
        sys.exit(2)
    environment.loadtest_settings = settings  # type: ignore[attr-defined]
    log = SampleLog(settings.samples_file)
    environment.loadtest_log = log  # type: ignore[attr-defined]
    environment.events.quit.add_listener(lambda **_: log.close())
    ChatUser.weight, DocumentUser.weight = settings.chat_weight, settings.doc_weight
    # A shape may fix how many chat users run (the article's scenario: one chat session beside the documents).
    fixed = getattr(environment.shape_class, "chat_users_fixed", None)
    if fixed is not None:
        ChatUser.fixed_count = fixed


@events.test_start.add_listener
def _resolve_model(environment: Environment, **_: Any) -> None:
    settings: LoadSettings = environment.loadtest_settings  # type: ignore[attr-defined]
    if settings.samples_file:  # where the run's clock starts: the shapes' stages count from here
        with open(f"{settings.samples_file}.start", "w", encoding="utf-8") as f:
            f.write(f"{time.time()}\n")
    model = settings.model
    if not model:
        try:
            r = requests.get(f"{environment.host}/v1/models", timeout=30)
            r.raise_for_status()
            model = r.json()["data"][0]["id"]
        except (requests.RequestException, KeyError, IndexError, ValueError) as e:
            sys.stderr.write(f"loadtests: no model from {environment.host}/v1/models ({e}); give --model\n")
            environment.process_exit_code = 2
            if environment.runner is not None:
                environment.runner.quit()
            return
    environment.loadtest_model = model  # type: ignore[attr-defined]


def record_stream(environment: Any, resp: Any, parser: SseParser, sent: float, meta: dict[str, Any]) -> str:
    """Record one streamed answer (`resp`, read through `parser`, sent at `perf_counter` `sent`) as a `Sample` in the
    run's log and Locust's stats: shed on its own row, an error as a failure. The answer's text (empty if none)."""
    log = environment.loadtest_log
    if resp.status_code in SHED_STATUSES:
        resp.request_meta["request_type"] = "SHED"  # its own row: load shed, not a failure
        resp.success()
        log.write(Sample(shed=True, **meta))
        return ""
    if resp.status_code != 200:
        resp.failure(f"HTTP {resp.status_code}: {(resp.text or '')[:200]}")
        log.write(Sample(error=f"HTTP {resp.status_code}", **meta))
        return ""
    sample = Sample.of(read_stream(resp, parser, sent), **meta)
    if sample.error:
        resp.failure(sample.error)
    else:
        resp.success()
    log.write(sample)
    fire_metrics(environment.events.request, sample)
    return "".join(content_of(p) for ev in parser.events if (p := ev.json()))


class StreamingUser(HttpUser):
    """Sends streamed chat completions and records what each stream gave."""

    abstract = True
    kind = ""

    def on_start(self) -> None:
        self.settings: LoadSettings = self.environment.loadtest_settings  # type: ignore[attr-defined]
        seed = self.settings.seed
        # Seeded per user (its kind and its order among users of that kind): one workload for every front.
        self.rng = random.Random(None if seed is None else f"{seed}-{self.kind}-{next(_users[self.kind])}")
        self.session = ""
        self.messages: list[dict[str, str]] = []

    def wait_time(self) -> float:
        low, high = self.settings.think_s
        return self.settings.wall_s(self.rng.uniform(low, high))

    def new_session(self) -> None:
        self.session = f"{self.kind}-{uuid.uuid4().hex[:12]}"
        self.messages = []

    def ask(self, content: str, max_tokens: int, intent: str, label: str) -> None:
        """One user turn: send the conversation so far, stream the answer, keep it in the conversation."""
        self.messages.append({"role": "user", "content": content})
        answer = self.stream(max_tokens, intent, label)
        self.messages.append({"role": "assistant", "content": answer})

    def stream(self, max_tokens: int, intent: str, label: str) -> str:
        body = {
            "model": getattr(self.environment, "loadtest_model", self.settings.model),
            "messages": self.messages,
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        sent_at_s, sent = time.time(), time.perf_counter()
        parser = SseParser()
        with self.client.post(
            "/v1/chat/completions",
            json=body,
            headers={SESSION_HEADER: self.session},
            stream=True,
            catch_response=True,
            name=label,
            timeout=self.settings.request_timeout_s,
        ) as resp:
            meta = dict(user=self.kind, sent_at_s=sent_at_s, session=self.session, **response_meta(resp, intent))
            return record_stream(self.environment, resp, parser, sent, meta)

    def question(self) -> str:
        n = self.settings.question_tokens.pick(next(self._questions), self.rng)
        return prompts.question(n, self.settings.chars_per_token, self.rng)

    _questions = itertools.count()


def read_stream(resp: requests.Response, parser: SseParser, sent: float) -> StreamOutcome:
    """Read the body as it arrives, timing each network chunk; a connection cut mid-stream is its failure."""
    cut_error = None
    try:
        for chunk in resp.iter_content(chunk_size=None):
            parser.feed(chunk, time.perf_counter())
    except requests.RequestException as e:
        cut_error = f"stream cut: {type(e).__name__}"
    parser.close(time.perf_counter())
    result = outcome(parser.events, sent)
    if cut_error and result.error:
        result.error = cut_error
    return result


class ChatUser(StreamingUser):
    """A person chatting: sessions of `--chat-turns` questions, thinking before each one."""

    kind = "chat"

    def on_start(self) -> None:
        super().on_start()
        self.turns_left = 0
        self.wait()  # a person reads and thinks before the first question too

    @task
    def turn(self) -> None:
        if self.turns_left == 0:
            self.new_session()
            self.turns_left = self.settings.chat_turns
        self.turns_left -= 1
        self.ask(self.question(), self.settings.chat_max_tokens, "short", "chat")


class DocumentUser(StreamingUser):
    """An agent working on long documents: sends one with a question, then `--doc-followups` follow-ups on it
    in the same session (its prefix is cached there), then the next document."""

    kind = "doc"

    def on_start(self) -> None:
        super().on_start()
        self.followups_left = 0
        self.docs_sent = 0

    @task
    def turn(self) -> None:
        s = self.settings
        if self.followups_left > 0:
            self.followups_left -= 1
            self.ask(self.question(), s.doc_max_tokens, "short", "document follow-up")
            return
        if s.docs_per_user and self.docs_sent >= s.docs_per_user:
            gevent.sleep(IDLE_POLL_S)  # done: the shape decides when this user stops
            return
        self.keep_doc_gap()
        index = next(_doc_index)
        self.new_session()
        doc = prompts.document(self.session, s.doc_tokens.pick(index, self.rng), s.chars_per_token, self.rng)
        self.docs_sent += 1
        self.followups_left = s.doc_followups
        self.ask(f"{doc}\n\nQuestion: {self.question()}", s.doc_max_tokens, "long", "document")

    def keep_doc_gap(self) -> None:
        """Documents leave this process `--doc-gap-s` apart, in a fixed order: users that start together
        would otherwise race, and which document the engine sees first changes what it does."""
        global _last_doc_send_s
        while (wait := _last_doc_send_s + self.settings.wall_s(self.settings.doc_gap_s) - time.perf_counter()) > 0:
            gevent.sleep(wait)
        _last_doc_send_s = time.perf_counter()
