"""Every judge request carries a seed (judge/run.py `judge_seed`): from its dialogue's seed, which
the run's seed decides, and its judgment key, the same whatever the judge's batches; so a judge that
samples (temperature above 0, as Qwen3's card asks) draws the same numbers for the same judgment."""

from __future__ import annotations

import shutil

from test_fidelity import PromptRecorder, config

from personalens.engines.base import derive_seed
from personalens.judge import command as judge_command
from personalens.judge.run import prompt_hash
from personalens.simulate import command as simulate_command


def seeds(engine: PromptRecorder) -> dict[tuple[str, str], tuple[int, float]]:
    """Each judge request's seed and temperature, by its dialogue and prompt."""
    return {
        (r.affinity, prompt_hash(r.messages)): (r.sampling.seed, r.sampling.temperature)
        for r in engine.requests
        if r.grammar
    }


def test_judge_requests_carry_seeds_that_do_not_depend_on_the_batches(tmp_path):
    out = tmp_path / "run"
    dialogue_engine = PromptRecorder()
    cfg = config(f"run.out_dir={out}", "protocol.judge.temperature=0.6")
    assert simulate_command.generate(cfg, lambda: {"user_agent": dialogue_engine, "assistant": dialogue_engine}) == 0
    first = PromptRecorder()
    assert judge_command.judge(cfg, lambda: {"judge": first}) == 0
    shutil.rmtree(out / "judgments")
    (out / "judge.yaml").unlink()
    second = PromptRecorder()
    assert judge_command.judge(config(f"run.out_dir={out}", "protocol.judge.temperature=0.6", "judging.chunk=5"),
                               lambda: {"judge": second}) == 0  # fmt: skip
    by_prompt = seeds(first)
    assert len(by_prompt) == len(first.requests) > 20  # every judgment its own prompt
    assert all(seed is not None and temperature == 0.6 for seed, temperature in by_prompt.values())
    assert len({seed for seed, _ in by_prompt.values()}) == len(by_prompt)  # each judgment its own
    assert seeds(second) == by_prompt  # calls of 5, not one call: the same seeds
    # from the run's seed, through the dialogue's: another run seed gives other judge seeds
    other = tmp_path / "other"
    again = PromptRecorder()
    cfg = config(f"run.out_dir={other}", "protocol.judge.temperature=0.6", "seed=1")
    assert simulate_command.generate(cfg, lambda: {"user_agent": again, "assistant": again}) == 0
    third = PromptRecorder()
    assert judge_command.judge(cfg, lambda: {"judge": third}) == 0
    assert not {s for s, _ in seeds(third).values()} & {s for s, _ in by_prompt.values()}
    assert derive_seed(0, "judge") != derive_seed(1, "judge")
