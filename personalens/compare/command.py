"""`personalens compare RUN_A RUN_B [RUN_C ...]`: paired differences between runs, and between the
prompt settings of a run (docs/compare.md)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from personalens import console


def compare(cfg: DictConfig) -> int:
    from personalens.compare import build_comparison
    from personalens.compare.power import PowerPlan
    from personalens.tables import render

    runs = [Path(r) for r in cfg.compare.runs]
    out_dir = Path(cfg.compare.out_dir) if cfg.compare.out_dir else default_out_dir(runs)
    result = build_comparison(
        runs,
        out_dir,
        bootstrap=int(cfg.compare.bootstrap),
        seed=int(cfg.seed),
        allow=list(cfg.compare.allow),
        alpha=float(cfg.compare.alpha),
        family=str(cfg.compare.family),
        power=PowerPlan(
            float(cfg.compare.power.target),
            tuple((str(k), float(v)) for k, v in (cfg.compare.power.differences or {}).items()),
        ),
        judges=[str(j) for j in cfg.compare.get("judges") or []],
    )
    for accepted in result.accepted:
        print(f"compare: {accepted.label}: {accepted.line()}", file=console.err())
    print(render.markdown(result.tables), file=console.out())
    print("\n## Power\n\n" + render.markdown(result.power_tables), file=console.out())
    print(f"\ncomparison written to {out_dir}", file=console.err())
    return 0


def default_out_dir(runs: list[Path]) -> Path:
    """runs/compare/<A>-vs-<B>[-vs-...] from the runs' folder names."""
    return Path("runs") / "compare" / "-vs-".join(r.resolve().name for r in runs)
