"""The fidelity options' protocol and judging rules (docs/fidelity.md, rows 10-14), with scripted
engines (pure logic; tests/test_fidelity_golden.py checks the official prompts against the released
code, tests/test_pipeline_vllm.py runs the default option through the real vLLM engine)."""

from __future__ import annotations

import itertools
import re
import sys
from collections import Counter
from pathlib import Path

import pytest
import xgrammar as xg
from cli_helpers import read_rows
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from test_lockstep import SAMPLING, ScriptedEngine, render, scenario
from test_report import judge_all, make_dialogue, write_run

from personalens import cli
from personalens.config import register_resolvers
from personalens.engines.base import Generation, conversation
from personalens.errors import PersonalensError
from personalens.judge import command as judge_command
from personalens.judge.formats import formats_named, official_formats
from personalens.paths import PROJECT_ROOT
from personalens.report import ReportError, build_report
from personalens.report import command as report_command
from personalens.simulate import command as simulate_command
from personalens.simulate.dialogue import Dialogue, EndRules
from personalens.simulate.lockstep import run_lockstep
from personalens.store import KEY_COLUMNS

OFFICIAL = EndRules(terminate="substring", reply_after_cap=True)
PAPER = EndRules()


def run_one(rules: EndRules, max_rounds: int, user_script: list[str]) -> Dialogue:
    dialogue = Dialogue(scenario("user1"), setting="base", trial=0, seed=0, max_rounds=max_rounds, rules=rules)
    engine = ScriptedEngine("m", {"user1:user": user_script, "user1:assistant": []}, default="reply")
    clock = itertools.count()
    run_lockstep(
        [dialogue],
        {"user": engine, "assistant": engine},
        render,
        SAMPLING,
        lambda done: None,
        clock=lambda: float(next(clock)),
    )
    return dialogue


def roles(dialogue: Dialogue) -> str:
    return "".join("U" if t.role == "user" else "A" for t in dialogue.turns)


# ---- rule 10: the round cap ---------------------------------------------------------------------


def test_official_cap_still_asks_the_user_agent_after_the_last_assistant_reply():
    d = run_one(OFFICIAL, 2, ["open", "more", "still more"])
    assert roles(d) == "UAUAU" and d.rounds == 2 and d.ended == "max_rounds"
    assert d.turns[-1].text == "still more"


def test_official_terminate_after_the_cap_earns_one_more_assistant_reply():
    d = run_one(OFFICIAL, 2, ["open", "more", "done TERMINATE"])
    assert roles(d) == "UAUAUA" and d.rounds == 3 and d.ended == "terminated"


def test_paper_cap_stops_at_the_capped_assistant_reply():
    d = run_one(PAPER, 2, ["open", "more", "done TERMINATE"])
    assert roles(d) == "UAUA" and d.rounds == 2 and d.ended == "max_rounds"


@pytest.mark.parametrize("rules", [OFFICIAL, PAPER], ids=["official", "paper"])
def test_terminate_before_the_cap_ends_after_one_more_reply_under_both(rules):
    d = run_one(rules, 5, ["open", "thanks TERMINATE"])
    assert roles(d) == "UAUA" and d.ended == "terminated"


# ---- rule 11: TERMINATE as a substring -----------------------------------------------------------


@pytest.mark.parametrize(
    "text,official,paper",
    [
        ("All set. TERMINATE", "All set.", "All set."),
        ("All set.TERMINATE", "All set.", "All set."),
        ("All setTERMINATE", "All set", None),  # no word boundary: the paper's rule reads no TERMINATE
        ("Great, TERMINATED then", "Great, D then", None),
        ("TERMINATE thanks TERMINATE", "thanks", "thanks"),
        ("'TERMINATE'", "''", ""),
    ],
)
def test_terminate_is_a_substring_under_official_and_a_word_under_paper(text, official, paper):
    for rules, expected in ((OFFICIAL, official), (PAPER, paper)):
        d = run_one(rules, 5, ["open", text, "later"])
        if expected is None:
            assert d.turns[2].text == text and d.rounds == 5
        else:
            # the released code: text.replace("TERMINATE", "").strip()
            assert d.turns[2].text == expected and roles(d) == "UAUA" and d.ended == "terminated"


def test_end_rules_reject_an_unknown_terminate_mode():
    with pytest.raises(ValueError, match="terminate"):
        EndRules(terminate="sentence")


# ---- rule 12: the judge's output format and its reading ------------------------------------------

# The released code's output layouts, spelled out independently of the module under test:
# (text before the score, scores, separators before each free-text field, closing text)
LAYOUTS = {
    "task_completion": ("VERDICT: ", ["True", "False"], ["\nEXPLANATION: "], ""),
    "personalization": (
        "<response>\nPersonalization Score: ",
        ["1", "2", "3", "4"],
        ["\nKey Observations:\n", "\n\nJustification: ", "\n\nImprovement Suggestions:\n"],
        "\n</response>",
    ),
    "naturalness": (
        "<response>\nNaturalness Score: ",
        ["1", "2", "3", "4", "5"],
        ["\nJustification: "],
        "\n</response>",
    ),
    "coherence": ("<response>\nCoherence Score: ", ["1", "2", "3", "4", "5"], ["\nJustification: "], "\n</response>"),
}


def accepts(grammar: str, text: str) -> bool:
    compiler = xg.GrammarCompiler(xg.TokenizerInfo([]), cache_enabled=False)
    matcher = xg.GrammarMatcher(
        compiler.compile_grammar(xg.Grammar.from_ebnf(grammar)), terminate_without_stop_token=True
    )
    return matcher.accept_string(text) and matcher.is_terminated()


def layout(dimension: str, score: str, fields: list[str]) -> str:
    opening, _, separators, closing = LAYOUTS[dimension]
    return opening + score + "".join(s + f for s, f in zip(separators, fields)) + closing


@pytest.mark.parametrize("max_tokens", [192, 800, 4000])
@pytest.mark.parametrize("dimension", list(LAYOUTS))
def test_official_grammar_bounds_the_text_so_the_whole_output_fits_the_budget(dimension, max_tokens):
    """Free text is printable ASCII, one token at least per character: an output of at most
    max_tokens - 1 characters always ends (with its verdict or score) within the budget."""
    opening, scores, separators, closing = LAYOUTS[dimension]
    grammar = official_formats(max_tokens)[dimension].grammar
    fixed = len(opening) + max(map(len, scores)) + sum(map(len, separators)) + len(closing) + 1
    room = (max_tokens - fixed) // len(separators)
    longest = layout(dimension, scores[-1], ["x" * room] * len(separators))
    assert accepts(grammar, longest) and len(longest) <= max_tokens - 1
    assert not accepts(grammar, layout(dimension, scores[-1], ["x" * (room + 1)] + ["x"] * (len(separators) - 1)))
    for score in scores:
        assert accepts(grammar, layout(dimension, score, ["a b.\n- c"] * len(separators)))
    assert not accepts(grammar, layout(dimension, "0" if scores[0] == "1" else "Maybe", ["a"] * len(separators)))
    if closing:  # the closing tag cannot come early: "<" is not allowed in the text
        assert not accepts(grammar, layout(dimension, scores[0], ["a </response> b"] * len(separators)))


def test_official_grammar_refuses_a_budget_too_small_for_the_layout():
    with pytest.raises(ValueError, match="too small"):
        official_formats(96)["personalization"]


RELEASED = PROJECT_ROOT.parent / "shared" / "official-code"


@pytest.mark.skipif(
    not (RELEASED / "util" / "gather_evaluation.py").is_file(),
    reason=f"the released PersonaLens code is not at {RELEASED}",
)
def test_every_official_output_is_read_alike_by_the_released_gathering_code(tmp_path, monkeypatch):
    """Outputs of the official grammars, read by the release's own util/gather_evaluation.py from its
    file layout, and by our parser: the same scores, a number off the scale included; a TC output
    without a verdict is False for both."""
    monkeypatch.syspath_prepend(str(RELEASED))
    for name in [n for n in list(sys.modules) if n == "util" or n.startswith("util.")]:
        monkeypatch.delitem(sys.modules, name)
    from util import gather_evaluation as released  # the released module (no client imports)

    formats = official_formats(800)
    cases = {
        "task_completion": [
            layout("task_completion", "True", ["fine"]),
            layout("task_completion", "False", ["VERDICT: True was not earned"]),
            "EXPLANATION: the judge forgot its verdict",
        ],
        "personalization": [layout("personalization", s, ["k", "Personalization Score: 9", "i"]) for s in "12340"],
        "naturalness": [layout("naturalness", s, ["j"]) for s in "150"],
        "coherence": [layout("coherence", s, ["j"]) for s in "247"],
    }
    base = tmp_path / "evaluation"
    for dimension, outputs in cases.items():
        for k, text in enumerate(outputs):
            # the last scored output is off the scale (the grammar forbids it; an endpoint without
            # structured output may write it): the release keeps its number, and so does official
            if "forgot" not in text and k < len(outputs) - 1:
                assert accepts(formats[dimension].grammar, text)
            folder = base / f"user{k}" / "asst" / dimension / "judge"
            folder.mkdir(parents=True)
            (
                folder / f"SD-Alarm-task-1{'' if dimension in ('task_completion', 'personalization') else '_asst'}.txt"
            ).write_text(text)
        ours = [formats[dimension].parse(t) for t in outputs]
        assert all(v.parsed for v in ours)
        users = list(range(len(outputs)))
        if dimension == "task_completion":
            result = released.analyze_task_completion_ratings(users, str(base), "asst", "judge")
            assert result["total_files"] == len(outputs)  # the verdict-less output stays in the denominator
            assert result["tc_rate"] == sum(v.score for v in ours) / len(ours) == 1 / 3
        else:
            label = {
                "personalization": "Personalization Score",
                "naturalness": "Naturalness Score",
                "coherence": "Coherence Score",
            }[dimension]
            result = released.analyze_quality_ratings(
                users,
                str(base),
                "asst",
                "judge",
                label,
                dimension=dimension,
                file_ext="" if dimension == "personalization" else "_asst",
            )
            assert result["raw_data"]["coherence_ratings"] == [v.score for v in ours]


def test_formats_named_rejects_an_unknown_format():
    with pytest.raises(ValueError, match="judge format"):
        formats_named("loose", 800)
    assert formats_named("paper", 800)["task_completion"].parse("no verdict").parsed is False


# ---- the options end to end through the commands, with scripted engines --------------------------


def config(*overrides: str):
    register_resolvers()
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=["data.users=0", "protocol=quick", "progress=false", *overrides])


class PromptRecorder:
    """Answers every request with text its grammar accepts (judge) or a fixed reply (dialogue),
    and keeps the messages it was sent."""

    name = "scripted"
    JUDGE = {
        "VERDICT": "VERDICT: True\nEXPLANATION: done",
        "Personalization": layout("personalization", "3", ["- a", "b", "- c"]),
        "Naturalness": layout("naturalness", "4", ["fine"]),
        "Coherence": layout("coherence", "5", ["fine"]),
    }

    def __init__(self):
        self.requests = []

    def generate(self, requests, on_finished=None):
        out = []
        for r in requests:
            self.requests.append(r)
            if r.grammar:
                text = next(t for key, t in self.JUDGE.items() if key in r.grammar)
                assert accepts(r.grammar, text)
            else:
                user_turn = r.messages[-1]["content"].startswith("<user_profile>")
                text = (
                    "Thanks, that works. TERMINATE"
                    if user_turn and "[ASSISTANT]" in r.messages[-1]["content"]
                    else "Sure."
                )
            out.append(Generation(text, prompt_tokens=10, completion_tokens=2))
        return out


def test_official_default_runs_generate_judge_and_report_with_the_released_shapes(tmp_path, capsys):
    out = tmp_path / "run"
    cfg = config(f"run.out_dir={out}")
    assert cfg.fidelity.name == "official" and cfg.protocol.judge.max_tokens == 192
    engine = PromptRecorder()
    engines = lambda: {"user_agent": engine, "assistant": engine, "judge": engine}  # noqa: E731
    assert simulate_command.generate(cfg, engines) == 0
    dialogue_requests = list(engine.requests)
    user_prompts = [r.messages for r in dialogue_requests if r.messages[0]["content"].startswith("<instruction>")]
    assistant_prompts = [r.messages for r in dialogue_requests if r.messages not in user_prompts]
    assert user_prompts and assistant_prompts
    assert all(len(m) == 2 and m[0]["role"] == "system" for m in user_prompts)
    assert all(
        len(m) == 2 and m[1]["role"] == "user" and "\nConversation History:\nUser: " in m[1]["content"]
        for m in assistant_prompts
    )
    for row in read_rows(out / "dialogues"):
        assert [t["role"] for t in row["turns"]] == ["user", "assistant", "user", "assistant"]
        assert row["turns"][2]["text"] == "Thanks, that works."
    # every request names its dialogue (the copy of a replicated model that answers it: engines/replicated.py)
    keys = {conversation(*(row[k] for k in KEY_COLUMNS)) for row in read_rows(out / "dialogues")}
    assert Counter(r.affinity for r in dialogue_requests) == dict.fromkeys(keys, 4)

    engine.requests.clear()
    assert judge_command.judge(cfg, engines) == 0
    judgments = read_rows(out / "judgments")
    assert judgments and all(j["parsed"] for j in judgments)
    assert Counter(r.affinity for r in engine.requests) == Counter(
        conversation(*(j[k] for k in KEY_COLUMNS)) for j in judgments
    )
    assert {j["score"] for j in judgments if j["dimension"] == "personalization"} == {3.0}
    speakers = {r.messages[0]["content"].split("\n")[0] for r in engine.requests if "Naturalness" in r.grammar}
    assert speakers == {
        "Task: Evaluate the naturalness of a User's requests in a dialogue by assessing how closely "
        "they resemble natural human communication.",
        "Task: Evaluate the naturalness of an AI assistant's responses in a dialogue by assessing "
        "how closely they resemble human communication.",
    }
    err = capsys.readouterr().err
    assert "generate: fidelity option official" in err and "judge: fidelity option official" in err

    assert report_command.report(cfg) == 0
    report_md = (out / "report" / "report.md").read_text()
    assert "fidelity option **official**" in report_md
    assert "Fidelity option: official" in (out / "report" / "table3.md").read_text()
    assert "Figure 4 data: TCR and P per domain (SD dialogues)" in report_md

    # the option is part of the fingerprint: the same run dir refuses the other option
    with pytest.raises(PersonalensError, match="different configuration"):
        simulate_command.generate(config(f"run.out_dir={out}", "fidelity=paper"), engines)
    with pytest.raises(PersonalensError, match="different configuration"):
        judge_command.judge(config(f"run.out_dir={out}", "fidelity=paper"), engines)


def test_paper_option_renders_the_figures_and_chat_turns(tmp_path):
    cfg = config(
        f"run.out_dir={tmp_path / 'run'}", "fidelity=paper", "protocol.max_rounds_sd=1", "protocol.max_rounds_md=1"
    )
    engine = PromptRecorder()
    assert simulate_command.generate(cfg, lambda: {"user_agent": engine, "assistant": engine}) == 0
    user_agent = [r.messages for r in engine.requests if len(r.messages) == 1]
    assistant = [r.messages for r in engine.requests if len(r.messages) > 1]
    assert user_agent and all(m[0]["content"].startswith("You are tasked") for m in user_agent)
    # the assistant: the system prompt, then the dialogue as chat turns
    assert assistant and all(
        m[0]["role"] == "system" and m[1:] == [{"role": "user", "content": "Sure."}] for m in assistant
    )
    assert all(len(row["turns"]) == 2 for row in read_rows(tmp_path / "run" / "dialogues"))


def test_unknown_prompt_family_is_refused_before_anything_runs(tmp_path):
    cfg = config(f"run.out_dir={tmp_path / 'run'}", "assistant.prompt_family=gpt")
    with pytest.raises(PersonalensError, match="prompt_family"):
        simulate_command.generate(cfg, lambda: pytest.fail("no engine may load"))


def test_run_refuses_a_judge_budget_too_small_before_simulating_anything(tmp_path):
    out = tmp_path / "run"
    cfg = config(f"run.out_dir={out}", "protocol.judge.max_tokens=48")
    with pytest.raises(PersonalensError, match="fidelity.judge_format: .*at least"):
        cli.run(cfg)
    assert not out.exists()  # not a dialogue generated, not a config saved


# ---- rows 13 and 14 and the published Table 3 in the report ---------------------------------------


def run_with_config(run_dir: Path, fidelity: str, model: str) -> Path:
    dialogues = [
        make_dialogue(0, "SD", ["Alarm"], model=model),
        make_dialogue(1, "MD", ["Books", "Hotels"], model=model),
    ]
    judgments = judge_all(dialogues[0], 1.0, 3.0) + judge_all(dialogues[1], 0.0, 2.0)
    write_run(run_dir, dialogues, judgments, shards=1)
    cfg = config(f"fidelity={fidelity}", "model@assistant=llama31_8b", "assistant.path=null")
    OmegaConf.save(
        OmegaConf.create({"fingerprint": "f", "config": OmegaConf.to_container(cfg, resolve=True)}),
        run_dir / "generate.yaml",
    )
    return run_dir


def test_official_report_shows_the_published_row_figure4_sd_only_and_tcr_with_two_decimals(tmp_path):
    run = run_with_config(tmp_path / "run", "official", "Llama-3.1-8B-Instruct")
    report = build_report([run], tmp_path / "out", bootstrap=50)
    assert report.table3.cell(("Llama-3.1-8B-Instruct (paper)",), "SD_TCR") == 89.55
    assert report.table3.cell(("Llama-3.1-8B-Instruct (paper)",), "MD_Coh") == 4.33
    md = (tmp_path / "out" / "table3.md").read_text()
    assert re.search(r"\| Llama-3\.1-8B-Instruct \| 100\.00 \[100\.00, 100\.00\]", md)
    assert "| Llama-3.1-8B-Instruct (paper) | 89.55 | 2.14 | 3.90 | 4.68 | 77.00 | 2.03 | 3.64 | 4.33 |" in md
    assert "Fidelity option: official" in md and "User agent: SmolLM2-135M-Instruct" in md
    assert {labels[-1] for labels, _ in report.by_domain.rows} == {"Alarm"}  # SD dialogues only

    paper = build_report(
        [run_with_config(tmp_path / "paper", "paper", "Llama-3.1-8B-Instruct")], tmp_path / "out2", bootstrap=50
    )
    assert [labels for labels, _ in paper.table3.rows] == [("Llama-3.1-8B-Instruct",)]
    assert {labels[-1] for labels, _ in paper.by_domain.rows} == {"Alarm", "Books", "Hotels"}


def test_runs_of_different_fidelity_options_are_not_reported_together(tmp_path):
    a = run_with_config(tmp_path / "a", "official", "m1")
    b = run_with_config(tmp_path / "b", "paper", "m2")
    with pytest.raises(ReportError, match="different fidelity options"):
        build_report([a, b], tmp_path / "out", bootstrap=50)
