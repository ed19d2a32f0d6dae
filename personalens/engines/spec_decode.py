"""What an invocation's speculative decoding did: vLLM's spec-decode counters of each model whose config
sets `speculative:` (models/speculative.py), over that invocation, one record per model. `generate` and
`judge` append the records to `<out_dir>/logs/summaries/spec_decode[.shard-KKK-of-NNN].jsonl`, which
`personalens plan plan.calibrate=<run>` reads (plan/speculative.py).

An engine of such a model has `speculative = True` and `spec_decode()`, its counters so far (summed over
its copies and servers, replicated.py), or None where they cannot be read: an in-process engine counts
them itself since it loaded (vllm/spec_stats.py), a server's come from its /metrics, which count since
the server started (`from_metrics`). So the invocation's share is a difference: `SpecDecodeWatch` reads
each engine when the invocation first gets it and again at the end."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger(__name__)

COUNTERS = ("drafts", "draft_tokens", "accepted_tokens")  # vLLM's counters vllm:spec_decode_num_<counter>

E = TypeVar("E", bound=Mapping[str, Any])


@dataclass(frozen=True)
class SpecCounts:
    """vLLM's spec-decode counters: `drafts`, verifying steps of a sequence that drafted; `draft_tokens`
    drafted in them; `accepted_tokens` of those the model accepted."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0

    def __add__(self, other: SpecCounts) -> SpecCounts:
        return SpecCounts(*(getattr(self, k) + getattr(other, k) for k in COUNTERS))

    def __sub__(self, other: SpecCounts) -> SpecCounts:
        return SpecCounts(*(getattr(self, k) - getattr(other, k) for k in COUNTERS))


@dataclass(frozen=True)
class SpecDecodeRecord:
    """One model's counters over one invocation of `command`, as the summaries keep them."""

    model: str
    command: str
    drafts: int
    draft_tokens: int
    accepted_tokens: int


def from_metrics(text: str) -> SpecCounts | None:
    """The counters in a vLLM server's /metrics text (Prometheus counters, `..._total` samples), summed
    over its engines (one label set each); None where any is missing (a server without speculative
    decoding, not vLLM, or not Prometheus text)."""
    names = {f"vllm:spec_decode_num_{k}": k for k in COUNTERS}
    found: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            if family.name in names:
                total = [s.value for s in family.samples if s.name.endswith("_total")]
                if total:
                    found[names[family.name]] = found.get(names[family.name], 0.0) + sum(total)
    except ValueError:
        return None
    if len(found) < len(COUNTERS):
        return None
    return SpecCounts(*(int(found[k]) for k in COUNTERS))


class SpecDecodeWatch:
    """The counters of an invocation's speculative engines: `seen` is given every mapping of engines the
    invocation gets (role to engine; an engine shared by roles counts once) and reads each speculative
    engine the first time; `records` reads them again and gives the differences, per model. An engine
    whose counters could not be read at either end, or went back (its server restarted), gives no
    record, and one warning line."""

    def __init__(self, command: str):
        self.command = command
        self._start: dict[int, tuple[Any, SpecCounts | None]] = {}

    def seen(self, engines: E) -> E:
        for engine in engines.values():
            if getattr(engine, "speculative", False) and id(engine) not in self._start:
                self._start[id(engine)] = (engine, engine.spec_decode())
        return engines

    def records(self) -> list[SpecDecodeRecord]:
        out = []
        for engine, start in self._start.values():
            end = engine.spec_decode() if start is not None else None
            if start is None or end is None:
                log.warning(
                    f"{engine.name}: no spec_decode record of this {self.command}: its spec-decode counters could not "
                    "be read (a server's /metrics unreachable, or without vllm:spec_decode_num_* counters)"
                )
                continue
            counts = dataclasses.asdict(end - start)
            if min(counts.values()) < 0:  # a server that restarted in between counts from 0 again
                log.warning(f"{engine.name}: no spec_decode record of this {self.command}: its counters went back")
                continue
            out.append(SpecDecodeRecord(engine.name, self.command, **counts))
        return out
