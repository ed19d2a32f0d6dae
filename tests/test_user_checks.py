"""The checks of the simulated user (personalens/report/user_checks.py): scripted dialogues made to
break each rule, dialogues made not to (near-misses included), the leak rule on the user agent's
real prompts of both template sets, and the report's tables of a run with planted failures."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf
from run_rows import dialogue_row, judgment_row
from test_report import write_run

from personalens.data import load_scenarios
from personalens.data.records import Turn
from personalens.paths import PROJECT_ROOT
from personalens.prompts.render import user_agent_profile
from personalens.prompts.templates import load_templates
from personalens.report import build_report
from personalens.report.user_checks import (
    LEAK_WORDS,
    PromptSpans,
    check,
    empty,
    leak,
    repeated,
    role_break,
    spans_of,
    tags_of,
)
from personalens.report.user_prompts import instruction_text

SAMPLE = PROJECT_ROOT / "data" / "sample"


def dialogue(*texts: str) -> list[Turn]:
    """Turns alternating from the user's opening."""
    return [Turn("user" if i % 2 == 0 else "assistant", t) for i, t in enumerate(texts)]


SOUND = dialogue(
    "Hey, could you find me a quiet Italian place for dinner tonight?",
    "Sure! Trattoria Roma is nearby and quiet. Would 7 PM work?",
    "7 works. Can you book a table for two?",
    "Done: a table for two at 7 PM at Trattoria Roma. Anything else?",
    "No, that's perfect, thanks.",
    "Enjoy your dinner!",
)


@pytest.mark.parametrize(
    "reply",
    [
        "How can I help you today?",
        "Great. What can I do for you next?",
        "I'd be happy to help you find a restaurant.",
        "Sure, I am always glad to assist with bookings.",
        "Okay. Happy to help with anything else!",
        "Is there anything else I can do for you?",
        "As an AI assistant, I cannot book tables.",
        "I'm ready to assist you with your film preferences.",
        "Hello, I'm a creative writing assistant based in London.",
        "I am your assistant for today.",
        "Let me know if you need anything else.",
        "Thanks!\nASSISTANT: You're welcome, enjoy your meal.",
        "Sounds good.\n[ASSISTANT]: Great, I've booked it.",
        # the assistant's reply said back as the user's
        "Done: a table for two at 7 PM at Trattoria Roma. Anything else?",
    ],
)
def test_a_user_turn_in_the_assistants_voice_is_a_role_break(reply):
    turns = [*SOUND[:4], Turn("user", reply)]
    assert role_break(turns)
    assert "role_break" in check(turns, ended="max_rounds", opening_terminate=False, prompt=None)


@pytest.mark.parametrize(
    "reply",
    [
        "Can you help me find a hotel as well?",
        "Thanks, that helps a lot!",
        "I'd be happy if you could book it for 8 instead.",
        "How can I get there from the station?",
        "Is there anything else you can tell me about it?",
        "My assistant at work usually handles this, but thanks.",
        "My sister is always glad when someone helps her.",
        "I'm ready to order now.",
        "I'm an assistant manager, so evenings are busy.",
        "Done? Great, a table for two at 7 then. Thanks!",  # close to the assistant's reply, not a copy
    ],
)
def test_a_user_turn_near_the_assistants_voice_is_no_role_break(reply):
    assert not role_break([*SOUND[:4], Turn("user", reply)])


def test_a_sound_dialogue_breaks_no_rule():
    assert check(SOUND, ended="terminated", opening_terminate=False, prompt=None) == frozenset()


def test_the_opening_terminate_is_flagged_from_what_generate_recorded():
    turns = dialogue("Find me a cab. TERMINATE", "Sure, where to?", "The airport.")
    assert check(turns, ended="max_rounds", opening_terminate=True, prompt=None) == {"early_terminate"}
    assert check(turns, ended="max_rounds", opening_terminate=False, prompt=None) == frozenset()


def test_a_loop_of_user_turns_is_repeated_and_a_short_or_changed_one_is_not():
    looped = dialogue(
        "Can you book me a flight to Boston on Friday morning?",
        "Which airport do you leave from?",
        "Can you book me a flight to Boston on Friday morning please?",
    )
    assert repeated(looped)
    assert not repeated(dialogue("Yes, please.", "Booked.", "Yes, please."))  # too short to count
    changed = dialogue(
        "Can you book the 7pm table for two?", "Which restaurant?", "Can you book the 8pm table for four?"
    )
    assert not repeated(changed)
    # not only consecutive turns: a loop back to the first request
    cycle = dialogue(
        "Please set an alarm for six tomorrow morning.",
        "Done.",
        "And one for my meeting.",
        "Which time?",
        "Please set an alarm for six tomorrow morning.",
    )
    assert repeated(cycle)


def test_an_empty_user_turn_is_flagged_unless_it_only_said_terminate():
    blank = dialogue("Book me a table.", "Where?", "  ", "Please say where.")
    assert empty(blank, "max_rounds")
    assert empty(dialogue("...", "Hello?"), "max_rounds")
    # the last user turn of a dialogue that ended on TERMINATE said only that word, removed from its text
    said_terminate = dialogue("Book me a table.", "Booked for 7.", "", "Goodbye!")
    assert not empty(said_terminate, "terminated")
    assert empty(said_terminate, "max_rounds")


def spans(instruction: str = "", profile: str = "") -> PromptSpans:
    return PromptSpans(spans_of(instruction), spans_of(profile))


def test_a_quoted_span_of_the_prompt_is_a_leak_and_a_shorter_one_is_not():
    profile = "The user frequently orders Thai food and prefers restaurants with outdoor seating on weekends."
    prompt = spans("Keep each response focused and concise (1-3 sentences maximum).", profile)
    quoted = " ".join(profile.split()[2 : 2 + LEAK_WORDS])
    assert leak(dialogue(f"Hi! {quoted}.", "Hello."), prompt)
    shorter = " ".join(profile.split()[2 : 1 + LEAK_WORDS])
    assert not leak(dialogue(f"Hi! {shorter}.", "Hello."), prompt)
    # case, punctuation and line breaks do not hide a quote of the instructions
    assert leak(dialogue("ok", "?", "KEEP EACH RESPONSE focused, and concise: 1-3 sentences!"), prompt)
    # the assistant's turns are not the user agent's
    assert not leak(dialogue("Hi.", profile), prompt)


@pytest.mark.parametrize(
    "folder, style, verbatim", [("prompts", "paper", False), ("prompts/official", "official", True)]
)
def test_the_leak_rule_reads_the_user_agents_real_prompt(folder, style, verbatim):
    templates = load_templates(PROJECT_ROOT / folder, style=style, verbatim=verbatim)
    scenario = load_scenarios(SAMPLE, "0", "SD")[0]
    shown = user_agent_profile(templates, scenario)
    profile = "\n".join(v for k, v in shown.items() if k != "task")
    told = instruction_text(templates)
    prompt = PromptSpans(spans_of(told), spans_of(profile), tags_of(told))
    # the instructions hold no profile, and the profile's spans are its own
    assert not spans_of(profile) & prompt.instruction
    assert spans_of(shown["interactions"]) <= prompt.profile
    # the next turn's instructions are there as well as the opening's
    assert leak(dialogue("if you feel the task has been FULLY completed AND you are SATISFIED"), prompt)
    guideline = "Stay consistent with the user's personality throughout the conversation"
    assert leak(dialogue(f"Sure. {guideline}."), prompt)
    assert leak(dialogue(shown["interactions"][:400]), prompt)
    # a markup tag of the released prompts is a leak; the paper's prompts have none, and no turn's
    # own angle brackets are tags of the prompt
    tagged = dialogue("<<query>>\n\nI'm looking for a film.")
    assert leak(tagged, prompt) == (style == "official")
    assert not leak(dialogue("Is it <b>really</b> open? I'd say <3 for that."), prompt)
    # the task is the user's to say, in its words: no leak
    assert not leak(dialogue(shown["task"]), prompt)
    assert not leak(SOUND, prompt)


def test_the_report_counts_flags_and_gives_table3_without_them(tmp_path):
    sound = [t.text for t in SOUND]
    spoilt = {
        "role_break": [sound[0], sound[1], "How can I help you today?", sound[3]],
        "repeated": [sound[0], sound[1], sound[0], sound[3]],
        "empty": [sound[0], sound[1], "", sound[3]],
    }
    dialogues, judgments = [], []
    for i in range(12):
        rule = list(spoilt)[i % 3] if i < 6 else None
        texts = spoilt[rule] if rule else sound[:4]
        turns = [
            {"role": "user" if k % 2 == 0 else "assistant", "text": t, "prompt_tokens": 5, "completion_tokens": 9}
            for k, t in enumerate(texts)
        ]
        d = dialogue_row(f"user{i}", f"SD-Movies-task-{i}", "SD", ["Movies"], turns=turns, model="m1")
        d["ended"] = "max_rounds"
        dialogues.append(d)
        # the flagged dialogues fail the task, the sound ones complete it
        judgments += [judgment_row(d, "task_completion", 0.0 if rule else 1.0), judgment_row(d, "personalization", 3.0)]
    report = build_report([write_run(tmp_path / "run", dialogues, judgments)], tmp_path / "out", bootstrap=50)
    flags = report.user_flags
    assert flags.cell(("u", "m1"), "role_break") == flags.cell(("u", "m1"), "repeated") == 2
    assert flags.cell(("u", "m1"), "empty") == 2 and flags.cell(("u", "m1"), "flagged") == 6
    assert flags.cell(("u", "m1"), "leak") is None  # no generate.yaml: the prompts cannot be rebuilt
    assert any("Prompt leaks not checked" in note for note in flags.notes)
    assert report.table3.cell(("m1",), "SD_TCR").mean == pytest.approx(50.0)
    (clean,) = report.table3_unflagged
    assert clean.cell(("m1",), "SD_TCR").mean == pytest.approx(100.0) and clean.cell(("m1",), "SD_TCR").n == 6
    (difference,) = report.flag_difference
    assert difference.cell(("m1",), "SD_TCR") == pytest.approx(50.0)
    assert difference.cell(("m1",), "SD_P") == pytest.approx(0.0)
    for name in ("user_flags", "table3_unflagged", "table3_flag_difference", "length_score"):
        assert (tmp_path / "out" / f"{name}.csv").is_file()
    # stored per dialogue: the leak rule unchecked (null), the others as planted
    stored = pq.read_table(tmp_path / "out" / "user_flags_dialogues.parquet").to_pylist()
    assert len(stored) == 12 and all(row["leak"] is None and row["reply_words"] > 0 for row in stored)
    planted = {f"user{i}": list(spoilt)[i % 3] for i in range(6)}
    for row in stored:
        assert [r for r in ("role_break", "repeated", "empty") if row[r]] == (
            [planted[row["user_id"]]] if row["user_id"] in planted else []
        )
    shown = (tmp_path / "out" / "report.md").read_text()
    assert "Checks of the simulated user" in shown and "Table 3 without the dialogues" in shown
    assert "Length against score" in shown


@pytest.mark.parametrize("fidelity", ["official", "paper"])
def test_the_report_rebuilds_the_user_agents_prompt_from_the_runs_saved_config(tmp_path, fidelity):
    run = tmp_path / "run"
    option = OmegaConf.to_container(OmegaConf.load(PROJECT_ROOT / "conf" / "fidelity" / f"{fidelity}.yaml"))
    option["prompts"]["dir"] = str(PROJECT_ROOT / ("prompts/official" if fidelity == "official" else "prompts"))
    config = {"data": {"root": str(SAMPLE), "users": "0", "kinds": "both"}, "prompt": {"dir": None}, "fidelity": option}
    run.mkdir()
    OmegaConf.save(OmegaConf.create({"fingerprint": "f", "config": config}), run / "generate.yaml")
    scenarios = load_scenarios(SAMPLE, "0", "both")[:3]
    templates = load_templates(option["prompts"]["dir"], style=option["prompts"]["style"])
    quoted = " ".join(user_agent_profile(templates, scenarios[0]).get("interactions").split()[:12])
    dialogues, judgments = [], []
    for k, scenario in enumerate(scenarios):
        texts = [f"Hi. {quoted}" if k == 0 else SOUND[0].text, SOUND[1].text]
        turns = [
            {"role": r, "text": t, "prompt_tokens": 1, "completion_tokens": 1}
            for r, t in zip(("user", "assistant"), texts)
        ]
        d = dialogue_row(
            scenario.user.user_id, scenario.task.task_id, scenario.task.kind, list(scenario.task.domains), turns=turns
        )
        dialogues.append(d)
        judgments.append(judgment_row(d, "task_completion", 1.0))
    report = build_report([write_run(run, dialogues, judgments, shards=1)], tmp_path / "out", bootstrap=20)
    assert report.user_flags.cell(("u", "m"), "leak") == 1
    assert not any("not checked" in note for note in report.user_flags.notes)
