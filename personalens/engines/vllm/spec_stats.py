"""The spec-decode counters of one in-process engine (engines/spec_decode.py), counted by the engine
itself rather than read from Prometheus.

vLLM 0.32's `LLM` has its stats off unless `disable_log_stats=False` (entrypoints/llm.py), which
vllm/local.py passes for a speculative model only. With them on, the scheduler puts each step's
SpecDecodingStats (drafts, draft tokens, accepted tokens of that step) in its SchedulerStats
(v1/core/sched/scheduler.py `make_stats`), and `LLMEngine.step` hands those to every stat logger of
its `logger_manager` (v1/engine/llm_engine.py, v1/metrics/loggers.py `StatLoggerManager.record`); the
stats are only collected, never read by the scheduler, so they change nothing that is generated.
`count_spec_decode` adds one more logger there, which sums the steps' counters for this engine alone.
vLLM's own `LLM.get_metrics()` is not used: it reads the process's global Prometheus registry, from
which each engine that starts with stats on unregisters the earlier engines' collectors
(v1/metrics/prometheus.py `unregister_vllm_metrics`), so two speculative engines in one process would
report only the last one's."""

from __future__ import annotations

import logging
import threading

from vllm.v1.metrics.loggers import AggregateStatLoggerBase

from personalens.engines.spec_decode import SpecCounts

log = logging.getLogger(__name__)


class SpecDecodeCounter(AggregateStatLoggerBase):
    """A stat logger that sums the spec-decode counters of the steps it is given."""

    def __init__(self) -> None:  # unlike vLLM's loggers, made here, not by the engine from its config
        self._counts = SpecCounts()
        self._lock = threading.Lock()

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
        step = getattr(scheduler_stats, "spec_decoding_stats", None)
        if step is not None:
            with self._lock:
                self._counts += SpecCounts(step.num_drafts, step.num_draft_tokens, step.num_accepted_tokens)

    def log_engine_initialized(self) -> None:
        pass

    @property
    def counts(self) -> SpecCounts:
        with self._lock:
            return self._counts


def count_spec_decode(llm, name: str) -> SpecDecodeCounter | None:
    """The counter added to `llm`'s stat loggers; None (and a warning) where the engine keeps none (its
    stats off, or a vLLM release without `logger_manager.stat_loggers`)."""
    loggers = getattr(getattr(llm.llm_engine, "logger_manager", None), "stat_loggers", None)
    if not isinstance(loggers, list):
        log.warning(f"{name}: its vLLM engine keeps no stat loggers, so its spec-decode counters are not recorded")
        return None
    counter = SpecDecodeCounter()
    loggers.append(counter)
    return counter
