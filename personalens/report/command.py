"""`personalens report`: the paper's tables and figures for one or more runs."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from personalens import console


def report(cfg: DictConfig) -> int:
    from personalens.report import build_report

    runs = [Path(r) for r in (cfg.report.runs or [cfg.run.out_dir])]
    result = build_report(
        runs,
        Path(cfg.report.out_dir),
        bootstrap=int(cfg.report.bootstrap),
        seed=int(cfg.seed),
        figure5_domains=list(cfg.report.figure5_domains),
        html_dialogues=int(cfg.report.html_dialogues),
    )
    print(result.table3_markdown(), file=console.out())
    print(result.leak_line(), file=console.out())
    print(f"\nreport written to {cfg.report.out_dir}", file=console.err())
    return 0
