"""Locust users of the plain workloads (`loadtests.workloads`): OpenAI clients that name no session.

    locust -f loadtests/plain_users.py --headless --host URL --workload-file W.json -u 6 -t 150s ...

(`python -m loadtests.peers --workload NAME` writes the file and runs this.) The locustfile's options (think time,
seed, characters per token, request timeout, samples file, model), its sample log and its stream timing are reused:
importing it registers them. What differs is what is sent: each user's script's whole conversation, with no
`X-Session-ID` header and no `user` field.
"""

from __future__ import annotations

import itertools
import random
import sys
import time
from pathlib import Path
from typing import Any

from locust import HttpUser, events, task
from locust.env import Environment
from pydantic import ValidationError

# Registers the locustfile's options, sample log and model lookup; its own users are not this file's.
from loadtests.locustfile import record_stream
from loadtests.recording import response_meta
from loadtests.settings import LoadSettings
from loadtests.sse import SseParser
from loadtests.workloads import PlainRequest, PlainWorkload, UserKind, script


@events.init_command_line_parser.add_listener  # type: ignore[untyped-decorator]
def _add_arguments(parser: Any) -> None:
    parser.add_argument("--workload-file", default="", help="A plain workload (PlainWorkload as JSON).")


@events.init.add_listener  # type: ignore[untyped-decorator]
def _on_init(environment: Environment, **_: Any) -> None:
    try:
        workload = PlainWorkload.model_validate_json(
            Path(getattr(environment.parsed_options, "workload_file", "")).read_text()
        )
    except (OSError, ValidationError) as e:
        sys.stderr.write(f"loadtests: --workload-file: {e}\n")
        sys.exit(2)
    if environment.loadtest_settings.seed is None:  # type: ignore[attr-defined]
        sys.stderr.write("loadtests: a plain workload needs --seed (its shared texts are drawn from it)\n")
        sys.exit(2)
    environment.plain_workload = workload  # type: ignore[attr-defined]
    PlainChatUser.fixed_count, PlainDocumentUser.fixed_count = workload.chat_users, workload.doc_users


class PlainUser(HttpUser):
    """Plays its script: sends each request, gives the script the answer, thinks, sends the next."""

    abstract = True
    kind: UserKind = "chat"
    started: itertools.count[int]

    def on_start(self) -> None:
        self.settings: LoadSettings = self.environment.loadtest_settings
        workload: PlainWorkload = self.environment.plain_workload
        index = next(self.started)
        seed = self.settings.seed or 0  # set: checked at init
        self.script = script(workload, self.kind, index, self.settings.chars_per_token, seed)
        self.think_rng = random.Random(f"{seed}-{workload.name}-{self.kind}-{index}-think")
        self.answer: str | None = None

    def wait_time(self) -> float:
        return self.settings.wall_s(self.think_rng.uniform(*self.settings.think_s))

    @task
    def turn(self) -> None:
        request = self.script.send(self.answer)
        self.answer = self.send(request)

    def send(self, request: PlainRequest) -> str:
        """Stream one request and record it; the answer's text (empty when it failed)."""
        sent_at_s, sent = time.time(), time.perf_counter()
        parser = SseParser()
        with self.client.post(
            request.path,
            json=request.body(getattr(self.environment, "loadtest_model", self.settings.model)),
            headers=request.headers(),
            stream=True,
            catch_response=True,
            name=request.kind,
            timeout=self.settings.request_timeout_s,
        ) as resp:
            meta = dict(user=self.kind, sent_at_s=sent_at_s, **response_meta(resp, request.intent))
            return record_stream(self.environment, resp, parser, sent, meta)


class PlainChatUser(PlainUser):
    kind: UserKind = "chat"
    started = itertools.count()

    def on_start(self) -> None:
        super().on_start()
        self.wait()  # type: ignore[no-untyped-call]  # a person reads and thinks before the first question too


class PlainDocumentUser(PlainUser):
    kind: UserKind = "doc"
    started = itertools.count()
