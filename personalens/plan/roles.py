"""`personalens roles`: each role's model, its sampling with where each value came from, and its request
budget, as `generate` and `judge` will send them (config/roles.py), printed without loading a model, a
tokenizer or the data."""

from __future__ import annotations

from omegaconf import DictConfig

from personalens import console


def roles(cfg: DictConfig) -> int:
    from personalens.config.roles import lines
    from personalens.config.roles import roles as resolve

    resolved = resolve(cfg)
    for line in lines(resolved.as_dict()):
        print(line, file=console.out())
    for line in resolved.notes:
        print(line, file=console.err())
    return 0
