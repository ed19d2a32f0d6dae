"""A per-role thinking budget (`protocol.<role>.thinking_budget`, or the role's model's
`sampling.thinking_budget`): read and checked before anything loads, refused for a model without a
reasoning parser, carried by each request beside the answer's own max_tokens, held by the engines in two
requests (tests/test_answer_budget.py), part of a run's fingerprint only when set.
tests/test_reasoning_vllm.py runs it through a real `vllm serve`."""

from __future__ import annotations

import pytest
from engine_fixtures import chat
from omegaconf import OmegaConf
from test_fidelity import PromptRecorder, config

from personalens.config import run as R
from personalens.config import sampling_identity
from personalens.engines.base import sampling_from
from personalens.engines.serving.engine import chat_body
from personalens.errors import PersonalensError
from personalens.simulate import command as simulate_command

R1 = ("reasoning_parser=deepseek_r1",)


def _roles(*overrides: str):
    return config(*(f"{role}.{o}" for role in ("user_agent", "assistant", "judge") for o in R1), *overrides)


def test_a_roles_budget_is_read_checked_and_needs_a_reasoning_parser():
    assert sampling_from({"temperature": 0, "max_tokens": 8}).thinking_budget is None
    cfg = _roles("protocol.assistant.thinking_budget=64", "protocol.judge.thinking_budget=0")
    assert R.sampling(cfg, "assistant")[0].thinking_budget == 64
    assert R.sampling(cfg, "judge")[0].thinking_budget == 0  # answer at once
    assert R.sampling(cfg, "user_agent")[0].thinking_budget is None
    # the request carries the budget beside the answer's max_tokens (quick protocol: 96)
    assert R.sampling(cfg, "assistant")[0].max_tokens == 96
    assert R.sampling(cfg, "assistant")[0].reply_tokens == 64 + 96
    for bad in ("-1", "true", "'many'"):
        with pytest.raises(
            PersonalensError, match="protocol.assistant.thinking_budget: expected a whole number >= 0 or null"
        ):
            R.sampling(_roles(f"protocol.assistant.thinking_budget={bad}"), "assistant")
    # SmolLM2's config names no reasoning parser: vLLM would refuse every request
    with pytest.raises(
        PersonalensError, match="protocol.user_agent.thinking_budget=32: model SmolLM2.* no reasoning_parser"
    ):
        R.sampling(config("protocol.user_agent.thinking_budget=32"), "user_agent")


def test_the_budget_reaches_each_roles_requests_and_the_fingerprint_only_when_set(tmp_path):
    engine = PromptRecorder()
    cfg = _roles(f"run.out_dir={tmp_path / 'run'}", "protocol.assistant.thinking_budget=48")
    assert simulate_command.generate(cfg, lambda: {"user_agent": engine, "assistant": engine}) == 0
    user_agent = [r.messages[-1]["content"].startswith("<user_profile>") for r in engine.requests]
    budgets = {
        (user, r.sampling.thinking_budget, r.sampling.max_tokens) for user, r in zip(user_agent, engine.requests)
    }
    assert budgets == {(False, 48, 96), (True, None, 64)}  # the assistant's requests, the user agent's
    # a budget left at null is no part of the fingerprint, so runs saved before the setting resume
    plain = config()
    assert R.sampling(plain, "assistant")[1].identity() == {"temperature": 0.0, "max_tokens": 96, "top_p": 1.0}
    assert sampling_identity(cfg.protocol.assistant)["thinking_budget"] == 48
    saved = OmegaConf.load(tmp_path / "run" / "generate.yaml")
    # the rule is part of the identity: a reply of at most 48 + 96 tokens, its answer at most 96
    assert (saved.parts.protocol.assistant.request_max_tokens, saved.parts.protocol.assistant.answer_max_tokens) == (
        48 + 96,
        96,
    )
    assert saved.resolved.sampling.assistant.origins == {"temperature": "paper", "top_p": "paper"} | {
        "thinking_budget": "config"
    }
    with pytest.raises(PersonalensError, match="thinking_budget=8: model SmolLM2"):
        simulate_command.generate(
            config(f"run.out_dir={tmp_path / 'no'}", "protocol.assistant.thinking_budget=8"), lambda: pytest.fail()
        )
    assert not (tmp_path / "no").exists()


def test_no_request_asks_vllm_for_its_thinking_token_budget():
    """The budget is held by the thinking request's max_tokens (engines/chat/budget.py), so it works where
    vLLM's own cannot (gpt-oss, a server without --reasoning-parser): vLLM's field is never sent."""
    from personalens.engines.vllm.local import sampling_params

    budgeted = chat("Hi", max_tokens=64, thinking_budget=16)
    assert "thinking_token_budget" not in chat_body("m", budgeted, system_role=True)
    assert sampling_params(budgeted).thinking_token_budget is None
    thinking = sampling_params(budgeted, ("</think>",))
    assert (thinking.max_tokens, thinking.stop, thinking.skip_special_tokens) == (16, ["</think>"], False)
