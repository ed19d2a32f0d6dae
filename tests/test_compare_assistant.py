"""`compare` knows what belongs to the assistant under test: a Qwen3-8B assistant (its card's sampling,
thinking budget and enable_thinking) against a Llama-3.1-8B one, both made by the real `generate` and
`judge` (scripted engines), are compared, the differing settings named on the page, in compare.md and in
the table; a different user agent or a different cap is still refused."""

from __future__ import annotations

import pytest
from test_fidelity import PromptRecorder, config

from personalens.compare import build_comparison
from personalens.errors import PersonalensError
from personalens.judge import command as judge_command
from personalens.simulate import command as simulate_command


@pytest.fixture
def runs(tmp_path):
    engine = PromptRecorder()
    engines = lambda: {"user_agent": engine, "assistant": engine, "judge": engine}  # noqa: E731
    made = {}
    for name, extra in (
        ("llama", ("model@assistant=llama31_8b",)),
        ("qwen", ("model@assistant=qwen3_8b",)),
        ("qwen_user", ("model@assistant=qwen3_8b", "model@user_agent=qwen3_8b")),
        ("qwen_cap", ("model@assistant=qwen3_8b", "protocol.assistant.max_tokens=48")),
    ):
        cfg = config(f"run.out_dir={tmp_path / name}", *extra)
        assert simulate_command.generate(cfg, engines) == 0 and judge_command.judge(cfg, engines) == 0
        made[name] = tmp_path / name
    return made


def test_qwen3_against_llama_is_compared_with_the_assistants_settings_shown(runs, tmp_path):
    out = tmp_path / "out"
    result = build_comparison([runs["llama"], runs["qwen"]], out, bootstrap=50)
    (accepted,) = result.accepted
    assert accepted.mismatch.check == "assistant" and accepted.label == "assistants set up differently"
    assert accepted.mismatch.detail == (
        "chat_template_kwargs.enable_thinking: None vs True; sampling.min_p: None vs 0.0; sampling.temperature: 0.0 "
        "vs 0.6; sampling.thinking_budget: None vs 4096; sampling.top_k: None vs 20; sampling.top_p: 1.0 vs 0.95"
    )
    (table,) = result.tables
    assert any(note.startswith("Assistants set up differently: ") for note in table.notes)
    for page in ("compare.md", "compare.html"):
        text = (out / page).read_text()
        assert "Assistants set up differently" in text and "belong to the assistant under test" in text
        assert "Compared despite a difference" not in text


def test_a_different_user_agent_or_cap_is_still_refused(runs, tmp_path):
    with pytest.raises(
        PersonalensError, match=r"differ in user agent model: name: 'SmolLM2-135M-Instruct' vs 'Qwen3-8B'"
    ):
        build_comparison([runs["qwen"], runs["qwen_user"]], tmp_path / "a")
    with pytest.raises(PersonalensError, match=r"differ in protocol .*dialogue.assistant.max_tokens: 96 vs 48"):
        build_comparison([runs["qwen"], runs["qwen_cap"]], tmp_path / "b")


def test_the_report_says_where_each_roles_sampling_came_from(runs):
    from personalens.report import command as report_command

    assert report_command.report(config(f"run.out_dir={runs['qwen']}", "model@assistant=qwen3_8b")) == 0
    text = (runs["qwen"] / "report" / "report.md").read_text()
    assert "assistant sampling min_p 0.0 (model card), temperature 0.6 (model card)" in text
    assert "top_k 20 (model card)" in text
    assert "from Qwen/Qwen3-8B model card" in text
    assert "user agent sampling temperature 0.5 (paper)" in text and "judge sampling temperature 0.0 (paper)" in text
