"""`personalens merge`: every scenario of the selection present exactly once across shards."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from personalens.config import run as R


def merge(cfg: DictConfig) -> int:
    from personalens.data import assign_shards, scenario_counts
    from personalens.merge.check import merge as check

    scenarios = R.selection(cfg)
    label = R.setting(cfg).label
    assignment = assign_shards(scenario_counts(scenarios), int(cfg.shard.count))
    expected = {
        (s.user.user_id, s.task.task_id, label, t): assignment[s.user.index]
        for s in scenarios
        for t in range(int(cfg.trials))
    }
    result = check(Path(cfg.run.out_dir), expected, list(cfg.judging.dimensions), int(cfg.shard.count))
    print(result.format())
    return 0 if result.ok else 1
