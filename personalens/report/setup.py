"""What produced a run: its fidelity option and models, read from the resolved configs that
`generate` and `judge` save in the run directory (personalens/config/core.py), and the paper's
published Table 3 rows (paper_table3.csv, keyed by model name as conf/model/*.yaml names them)."""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from personalens.config.fidelity import Fidelity
from personalens.config.saved import read_saved
from personalens.report.errors import ReportError

PUBLISHED_TABLE3 = Path(__file__).with_name("paper_table3.csv")


@dataclass(frozen=True)
class RunSetup:
    run_dir: Path
    option: Fidelity
    user_agent: str | None  # model names; None when the run's config does not say
    judge: str | None
    reproducible: tuple[str, ...] = ()  # the steps ("generate", "judge") saved with `reproducible: true`
    # per role, its sampling as it ran with each value's origin (config, model card, paper; protocol and
    # override in runs saved before config/sampling.py's rule); none in runs saved before origins were recorded
    sampling: tuple[tuple[str, str], ...] = ()

    @property
    def engines(self) -> str:
        """Whether the run's engines ran reproducibly: batch-invariant kernels on GPUs, the same batches
        on vLLM's CPU build (docs/reproducibility.md)."""
        if not self.reproducible:
            return "engines not batch-invariant"
        return f"reproducible engines (reproducible: true) in {' and '.join(self.reproducible)}"

    def line(self) -> str:
        sampling = "".join(f"; {role.replace('_', ' ')} sampling {said}" for role, said in self.sampling)
        return (
            f"`{self.run_dir}`: fidelity option **{self.option.name}**, user agent {self.user_agent or 'unknown'}, "
            f"judge {self.judge or 'unknown'}, {self.engines}{sampling}"
        )


def read_setup(run_dir: Path) -> RunSetup:
    """The run's setup from `generate.yaml` and `judge.yaml` (either may be missing)."""
    steps = read_saved(run_dir)
    saved = {step: saved.config for step, saved in steps.items()}
    # a step saved before the option existed says nothing; one saved since says which
    options = [Fidelity.from_saved(cfg) for cfg in saved.values() if "fidelity" in cfg] or [Fidelity.from_saved({})]
    names = {option.name for option in options}
    if len(names) > 1:
        raise ReportError(f"{run_dir}: generate and judge ran with different fidelity options ({sorted(names)})")

    def model(step: str, role: str) -> str | None:
        return saved.get(step, {}).get(role, {}).get("name")

    return RunSetup(
        run_dir=run_dir,
        option=options[0],
        user_agent=model("generate", "user_agent"),
        judge=model("judge", "judge"),
        reproducible=tuple(step for step, cfg in saved.items() if cfg.get("reproducible", False)),
        sampling=tuple(
            (role, _said(recorded))
            for step in steps.values()
            for role, recorded in (step.resolved.get("sampling") or {}).items()
        ),
    )


def _said(recorded: Mapping) -> str:
    """A role's sampling as it ran: each value with where it came from, the card named."""
    origins = recorded.get("origins") or {}
    values = ", ".join(f"{k} {recorded[k]} ({origin})" for k, origin in origins.items())
    return values + (f", from {recorded['source']}" if recorded.get("source") else "")


def common_fidelity(setups: Sequence[RunSetup]) -> RunSetup:
    """The setup the runs share for reporting; runs of different fidelity options are not comparable."""
    options = sorted({s.option.name for s in setups})
    if len(options) > 1:
        raise ReportError(
            "the runs were made with different fidelity options ("
            + "; ".join(f"{s.run_dir}: {s.option.name}" for s in setups)
            + "); report them separately"
        )
    return setups[0]


def published_table3(path: Path = PUBLISHED_TABLE3) -> Mapping[str, Mapping[str, float]]:
    """model name -> column key (SD_TCR, ...) -> the value printed in the paper's Table 3."""
    with path.open(newline="") as f:
        return {row.pop("model"): {k: float(v) for k, v in row.items()} for row in csv.DictReader(f)}
