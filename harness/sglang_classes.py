"""Drive sglang 0.5.23's real prefill scheduling on CPU: real `Req`s, a real KV allocator and
`RadixCache.create_simulated`, the real `Scheduler._get_new_batch_prefill_raw` and `PrefillAdder`, with a
light stand-in for the `Scheduler` object (no model, no GPU).

`Harness(..., patched=True)` routes the two scheduler methods the plugin hooks through the plugin's hook
functions explicitly (the same functions `load_plugins()` installs), so the pytest process never patches
sglang's classes and an unpatched run next to it is upstream's exact behaviour. Between passes it does
what sglang does before the next one (checkpoint the chunked request, merge prefilled requests into the
running batch, release requests whose decode is over); no forward pass runs.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch
from sglang.srt.managers import scheduler as scheduler_mod
from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import SchedulePolicy
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.sampling.sampling_params import SamplingParams

from scheduler.sglang_plugin import hooks
from scheduler.sglang_plugin.attach import SchedulerPolicy, attach_policy, policy_of

Scheduler = scheduler_mod.Scheduler
UPSTREAM_PREFILL_RAW = Scheduler._get_new_batch_prefill_raw
UPSTREAM_ADDER_CLASS = Scheduler.get_prefill_adder_class


def sglang_is_unpatched() -> bool:
    return not any(hasattr(m, "__wrapped__") for m in (UPSTREAM_PREFILL_RAW, UPSTREAM_ADDER_CLASS, Scheduler.__init__))


@dataclass(frozen=True)
class ReqSpec:
    rid: str
    prompt_tokens: int
    max_new_tokens: int = 32
    arrive_pass: int = 0
    decode_passes: int = 2
    """Passes it stays in the running batch after its prefill completes."""
    prefix_of: str | None = None
    """Share the first `prefix_tokens` prompt tokens with this request (a prefix-cache hit)."""
    prefix_tokens: int = 0
    priority: int | None = None
    routing_key: str | None = None
    """sglang's routing key (the plugin reads the request's tenant there: `scheduler.tenants.tenant_key`)."""


@dataclass(frozen=True)
class EngineSpec:
    pool_tokens: int = 4096
    page_size: int = 1
    chunk_tokens: int | None = 512
    max_running: int = 16
    max_prefill_tokens: int = 16384
    req_rows: int = 64
    new_token_ratio: float = 0.5
    priority_scheduling: bool = False
    truncation_align_size: int | None = None
    mixed_chunk: bool = False
    """sglang's --enable-mixed-chunk: decoding rows ride along in prefill passes."""


def token_ids(spec: ReqSpec, specs_by_rid: dict[str, ReqSpec]) -> array:
    base = 1 + 100_000 * (sum(map(ord, spec.rid)) % 997 + 1)
    own = list(range(base, base + spec.prompt_tokens))
    if spec.prefix_of is not None:
        parent = token_ids(specs_by_rid[spec.prefix_of], specs_by_rid)
        own[: spec.prefix_tokens] = parent[: spec.prefix_tokens]
    return array("q", own)


def make_req(spec: ReqSpec, specs_by_rid: dict[str, ReqSpec]) -> Req:
    params = SamplingParams(max_new_tokens=spec.max_new_tokens)
    req = Req(spec.rid, "", token_ids(spec, specs_by_rid), params, routing_key=spec.routing_key)
    if spec.priority is not None:
        req.priority = spec.priority
    return req


class StandInScheduler(SimpleNamespace):
    """The attributes `_get_new_batch_prefill_raw` reads; the real methods are looked up on the class."""

    _get_new_batch_prefill_raw = UPSTREAM_PREFILL_RAW
    get_prefill_adder_class = UPSTREAM_ADDER_CLASS

    def get_num_allocatable_reqs(self, running_bs, beam_width=None, running_batch=None, num_held_rows=0):
        # upstream: min(pipeline micro-batch budget, free req_to_token rows + rows held by counted requests)
        return min(self.max_running_requests - running_bs, self.req_to_token_pool.available_size() + num_held_rows)

    def _add_request_to_queue(self, req):
        self.waiting_queue.append(req)

    _reqs_finishing_inflight = Scheduler._reqs_finishing_inflight


class PatchedStandInScheduler(StandInScheduler):
    """The same stand-in with the plugin's hooks on the two methods, as `load_plugins()` installs them."""

    def _get_new_batch_prefill_raw(self, *args, **kwargs):
        return hooks.around_get_new_batch_prefill_raw(UPSTREAM_PREFILL_RAW, self, *args, **kwargs)

    def get_prefill_adder_class(self):
        return hooks.around_get_prefill_adder_class(UPSTREAM_ADDER_CLASS, self)


def make_allocator(spec: EngineSpec):
    if spec.page_size == 1:
        return TokenToKVPoolAllocator(spec.pool_tokens, torch.float16, "cpu", None, False)
    return PagedTokenToKVPoolAllocator(spec.pool_tokens, spec.page_size, torch.float16, "cpu", None, False)


def build_scheduler(spec: EngineSpec, patched: bool, scheduler_cls: type | None = None) -> StandInScheduler:
    alloc = make_allocator(spec)
    tree = RadixCache.create_simulated(mock_allocator=alloc, page_size=spec.page_size)
    req_to_token_pool = ReqToTokenPool(
        size=spec.req_rows, max_context_len=65536, device="cpu", enable_memory_saver=False
    )
    tree.req_to_token_pool = req_to_token_pool
    cls = scheduler_cls or (PatchedStandInScheduler if patched else StandInScheduler)
    policy_name = "fcfs"
    return cls(
        grammar_manager=SimpleNamespace(has_waiting_grammars=lambda: False),
        enable_priority_preemption=False,
        enable_priority_scheduling=spec.priority_scheduling,
        is_hybrid_swa=False,
        waiting_queue=[],
        chunked_req=None,
        min_free_slots_delayer=None,
        policy=SchedulePolicy(policy_name, tree, False, spec.priority_scheduling, False),
        processed_tokens_counter=0,
        chunked_prefill_size=spec.chunk_tokens,
        dynamic_chunk_sizer=None,
        tp_worker=SimpleNamespace(
            model_runner=SimpleNamespace(attn_backend=SimpleNamespace(), prefill_aware_swa=False)
        ),
        page_size=spec.page_size,
        tree_cache=tree,
        token_to_kv_pool_allocator=alloc,
        new_token_ratio_tracker=SimpleNamespace(current=spec.new_token_ratio),
        max_prefill_tokens=spec.max_prefill_tokens,
        is_mixed_chunk=spec.mixed_chunk and spec.chunk_tokens is not None,
        enable_skip_finishing_decode=False,
        result_queue=[],
        prefill_decode_interval=0,
        priority_scheduling_preemption_threshold=0,
        max_prefill_bs=0,
        max_running_requests=spec.max_running,
        dllm_config=None,
        enable_lora=False,
        req_to_token_pool=req_to_token_pool,
        enable_hicache_storage=False,
        enable_lmcache=False,
        truncation_align_size=spec.truncation_align_size,
        model_config=SimpleNamespace(vocab_size=32000, is_encoder_decoder=False),
        enable_overlap=False,
        spec_algorithm=scheduler_mod.SpeculativeAlgorithm.NONE,
        hisparse_coordinator=None,
        enable_hierarchical_cache=False,
        enable_unified_cache_external_linker=False,
        load_inquirer=SimpleNamespace(_get_num_pending_tokens=lambda chunk_deduct=0: 0),
        device="cpu",
        forward_ct=0,
    )


@dataclass
class PassRecord:
    admitted: list[tuple[str, int]]
    """(rid, prefill tokens) of the batch, continuing request first, as sglang built it."""
    chunked: str | None
    waiting: list[str]
    batch_is_full: bool


@dataclass
class Harness:
    engine: EngineSpec
    reqs: list[ReqSpec]
    patched: bool = True
    scheduler_cls: type | None = None
    sched: StandInScheduler = field(init=False)
    running: ScheduleBatch = field(init=False)
    pass_index: int = 0
    decode_left: dict[str, int] = field(default_factory=dict)
    history: list[PassRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sched = build_scheduler(self.engine, self.patched, self.scheduler_cls)
        if self.patched:
            attach_policy(self.sched)
        self.running = ScheduleBatch(reqs=[])
        by_rid = {s.rid: s for s in self.reqs}
        self._req = {s.rid: make_req(s, by_rid) for s in self.reqs}
        if self.engine.priority_scheduling:
            for req in self._req.values():
                req.priority = req.priority if req.priority is not None else 0
        self._spec = by_rid

    @property
    def policy(self) -> SchedulerPolicy:
        policy = policy_of(self.sched)
        assert policy is not None
        return policy

    def req(self, rid: str) -> Req:
        return self._req[rid]

    def step(self) -> PassRecord:
        for spec in self.reqs:
            if spec.arrive_pass == self.pass_index:
                self.sched._add_request_to_queue(self._req[spec.rid])
        batch, self.running = self.sched._get_new_batch_prefill_raw(
            prefill_delayer_single_pass=None, running_batch=self.running
        )
        decoding = set(batch.decoding_reqs or []) if batch is not None else set()
        record = PassRecord(
            admitted=[(r.rid, r.extend_len) for r in batch.reqs if r not in decoding] if batch is not None else [],
            chunked=self.sched.chunked_req.rid if self.sched.chunked_req is not None else None,
            waiting=[r.rid for r in self.sched.waiting_queue],
            batch_is_full=self.running.batch_is_full,
        )
        self._after_pass(batch)
        self.history.append(record)
        self.pass_index += 1
        self.sched.forward_ct += 1  # each step is one forward pass (prefill, or the running batch's decode)
        return record

    def run(self, num_passes: int) -> list[PassRecord]:
        return [self.step() for _ in range(num_passes)]

    def _after_pass(self, batch: ScheduleBatch | None) -> None:
        """What sglang does before the next pass (no forward pass runs here): the chunked request is
        checkpointed into the radix tree and kept out of the running batch, prefilled requests join it,
        and requests that have decoded for their `decode_passes` finish and release their KV."""
        joined: set[str] = set()
        if batch is not None:
            exclude = []
            if self.sched.chunked_req is not None:
                self.sched.chunked_req.inflight_middle_chunks -= 1
                checkpoint_kv_cache(self.sched.chunked_req, self.sched.tree_cache)
                exclude.append(self.sched.chunked_req)
            batch.filter_batch(reqs_to_exclude=exclude)
            if not batch.is_empty():
                joined = {r.rid for r in batch.reqs if r.rid not in self.decode_left}
                if self.running.is_empty():
                    self.running = batch
                else:
                    self.running.merge_batch(batch)
        finished = []
        for req in self.running.reqs:
            if req.rid in joined:
                self.decode_left[req.rid] = self._spec[req.rid].decode_passes
                continue
            self.decode_left[req.rid] -= 1
            if self.decode_left[req.rid] <= 0:
                req.finished_reason = FINISH_LENGTH(length=req.sampling_params.max_new_tokens)
                release_kv_cache(req, self.sched.tree_cache, checkpoint=True)
                finished.append(req)
        if finished:
            self.running.filter_batch()
            self.running.batch_is_full = False
