"""`personalens agreement export | score` (Table 5, docs/agreement.md)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from personalens import console


def agreement(cfg: DictConfig) -> int:
    """`agreement export`: annotation sheet and guide for a sample of run.out_dir's dialogues;
    `agreement score`: Table 5 from the filled sheets."""
    from personalens.tables.stats import Bootstrap

    out_dir, run_dir = Path(cfg.agreement.out_dir), Path(cfg.run.out_dir)
    if cfg.agreement.action == "export":
        from personalens.agreement import export
        from personalens.data import load_scenarios

        done = export(
            run_dir,
            lambda users: load_scenarios(Path(cfg.data.root), users, "both"),
            out_dir,
            dialogues=int(cfg.agreement.dialogues),
            seed=int(cfg.seed),
        )
        kinds = [item["kind"] for item in done.items]
        print(f"export {done.export_id}: {len(kinds)} dialogues ({kinds.count('SD')} SD, {kinds.count('MD')} MD)")
        print("\n".join(f"  {path}" for path in done.files))
        return 0
    from personalens.agreement import score_sheets
    from personalens.agreement.reference import with_paper
    from personalens.tables import render
    from personalens.tables.render import write_tables

    table = with_paper(
        score_sheets(
            out_dir,
            [Path(p) for p in cfg.agreement.sheets],
            run_dir,
            Bootstrap(int(cfg.report.bootstrap), int(cfg.seed)),
            [str(j) for j in cfg.agreement.get("judges") or ["judge"]],
        )
    )
    print(render.markdown([table]))
    print(f"written: {', '.join(map(str, write_tables([table], out_dir)))}", file=console.err())
    return 0
