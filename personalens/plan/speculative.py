"""Speculative decoding as `plan` models it: only from an acceptance a run measured, never from an
assumed speedup. A run's measurement is vLLM's spec-decode counters of each model's engines (verifying
steps that drafted, tokens drafted, tokens accepted), one JSON line per model and invocation of
`generate` or `judge` in `<out_dir>/logs/summaries/spec_decode[.shard-KKK-of-NNN].jsonl`, which those
commands write (engines/spec_decode.py, store/summaries.py), read with the calibration run
(`plan.calibrate=`). A model whose `speculative:` is set and which no calibration measured is modelled
as without it, and `plan` says so."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from personalens.engines.placement.sizing import ModelNeed
from personalens.engines.spec_decode import COUNTERS, SpecCounts
from personalens.store import read_summaries


@dataclass(frozen=True)
class SpecDecode:
    """One model's spec-decode counters over a run: `drafts` verifying steps of a sequence that drafted,
    `draft_tokens` drafted in them, `accepted_tokens` of those the model accepted."""

    model: str
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    source: str = ""  # the run that measured them

    @property
    def tokens_per_step(self) -> float:
        """Tokens a sequence gains per verifying step: the accepted drafts and the model's own token."""
        return 1 + self.accepted_tokens / self.drafts

    @property
    def drafted(self) -> float:
        """Draft tokens a verifying step computes per sequence."""
        return self.draft_tokens / self.drafts

    @property
    def acceptance(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0


def read_spec_decode(run_dir: Path) -> dict[str, SpecDecode]:
    """Per model name the counters a run's spec_decode summaries hold, summed over its invocations; a
    record without whole counters is left out, as is a model that never drafted."""
    sums: dict[str, SpecCounts] = {}
    for record in read_summaries(run_dir, "spec_decode"):
        try:
            counts = SpecCounts(*(int(record[k]) for k in COUNTERS))
            model = str(record["model"])
        except (KeyError, TypeError, ValueError):
            continue
        sums[model] = sums.get(model, SpecCounts()) + counts
    return {
        m: SpecDecode(m, c.drafts, c.draft_tokens, c.accepted_tokens, source=str(run_dir))
        for m, c in sums.items()
        if c.drafts > 0
    }


def measured(need: ModelNeed, runs: Mapping[str, SpecDecode] | None) -> SpecDecode | None:
    """The counters a speculative model was measured with (`runs`: per model name); None where its
    config sets no `speculative` or no run measured it."""
    if need.config is None or not need.config.speculative:
        return None
    return (runs or {}).get(need.config.name)
