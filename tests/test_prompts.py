"""Prompt rendering: each agent sees exactly the parts of the scenario the paper gives it."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pytest

from personalens.data.records import Scenario, Situation, Task, Turn, UserProfile
from personalens.prompts import (
    PromptError,
    PromptSetting,
    assistant_messages,
    conversation_text,
    judge_messages,
    load_templates,
    user_agent_messages,
)

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "personalens-data"

# Every value is a unique marker, so "is it in the prompt" has one answer.
DEMOGRAPHICS = {"age": "demo-age-25-34", "gender": "demo-gender-x", "birth_country": "demo-country-atlantis"}
AFFINITIES = {
    "Movies": {"Preferred Genres": ("aff-movies-noir", "aff-movies-musical"), "Seat Type": "aff-movies-aisle"},
    "Restaurants": {"Cuisine Preference": ("aff-food-ethiopian",), "Ambiance": "aff-food-quiet"},
    "Hotels": {"Room Type": ("aff-hotel-loft",)},
}
INTERACTIONS = {
    "Movies": "int-movies: often books late screenings. Literal {{ goal }} and ${task} braces stay as they are.",
    "Restaurants": "int-food: reserves tables for two.",
    "Hotels": "int-hotel: stays near stations.",
}
SITUATION = Situation("sit-loc-harbour", "sit-dev-tablet", "sit-time-dusk", "sit-day-tuesday", "sit-env-rainy")
USER = UserProfile(
    index=42,
    user_id="user42",
    demographics=DEMOGRAPHICS,
    interests={"Movies": 1, "Restaurants": 1, "Hotels": 1},
    affinities=AFFINITIES,
    interactions=INTERACTIONS,
)
SD = Scenario(
    USER,
    Task(
        "SD-Movies-task-1",
        "SD",
        "desc-sd: the user wants a film.",
        "intent-sd: find a film",
        "goal-sd: a film is booked",
        ("Movies",),
        ("Preferred Genres",),
    ),
    SITUATION,
)
MD = Scenario(
    USER,
    Task(
        "MD-task-1",
        "MD",
        "desc-md: film and dinner.",
        "intent-md: plan a night out",
        "goal-md: both booked",
        ("Restaurants", "Movies"),
        ("Cuisine Preference",),
    ),
    SITUATION,
)
TURNS = [
    Turn("user", "utt-u1: evening plans?"),
    Turn("assistant", "utt-a1: sure, which day?"),
    Turn("user", "utt-u2: Friday."),
    Turn("assistant", "utt-a2: booked {for} you."),
]

ALL_SETTINGS = [
    PromptSetting(mode, d, i, s) for mode, d, i, s in itertools.product(("vanilla", "base"), *[(False, True)] * 3)
]


@pytest.fixture(scope="module")
def templates():
    return load_templates()


def affinity_values(domain: str) -> list[str]:
    values = []
    for value in AFFINITIES[domain].values():
        values.extend([value] if isinstance(value, str) else value)
    return values


def only_content(messages) -> str:
    assert len(messages) == 1 and messages[0]["role"] == "user"
    return messages[0]["content"]


def assert_profile(text: str, scenario: Scenario, present: bool) -> None:
    """Demographics, the task domains' affinities and summaries, and the situation are all in/out."""
    parts = [*DEMOGRAPHICS.values(), *(v for _, v in SITUATION.items())]
    for domain in scenario.task.domains:
        parts += [*affinity_values(domain), INTERACTIONS[domain]]
    for part in parts:
        assert (part in text) == present, part


# ---------------------------------------------------------------- settings


def test_setting_labels_are_unique_and_round_trip():
    labels = [s.label for s in ALL_SETTINGS]
    assert len(set(labels)) == len(ALL_SETTINGS)
    assert PromptSetting("base", True, False, True).label == "base+D+S"
    assert PromptSetting("vanilla").label == "vanilla"
    for setting in ALL_SETTINGS:
        assert PromptSetting.from_label(setting.label) == setting


@pytest.mark.parametrize("label", ["", "fancy", "base+X", "base+I+D", "base+D+D", "base+", "D+I"])
def test_setting_rejects_bad_labels(label):
    with pytest.raises(ValueError, match="prompt setting"):
        PromptSetting.from_label(label)


def test_setting_rejects_unknown_mode():
    with pytest.raises(ValueError, match="mode"):
        PromptSetting("fancy")


# ---------------------------------------------------------------- template files


def test_missing_template_file_is_named(tmp_path, templates):
    folder = tmp_path / "prompts"
    shutil.copytree(templates.folder, folder)
    (folder / "judge" / "coherence.txt").unlink()
    with pytest.raises(PromptError, match=r"judge/coherence\.txt"):
        load_templates(folder)


def test_missing_folder_is_named(tmp_path):
    with pytest.raises(PromptError, match="nowhere"):
        load_templates(tmp_path / "nowhere")


def test_syntax_error_names_file(tmp_path, templates):
    folder = tmp_path / "prompts"
    shutil.copytree(templates.folder, folder)
    (folder / "assistant" / "vanilla.txt").write_text("Hello {% if %}")
    with pytest.raises(PromptError, match=r"assistant/vanilla\.txt: line 1"):
        load_templates(folder)


def test_unknown_placeholder_fails_at_render(tmp_path, templates):
    folder = tmp_path / "prompts"
    shutil.copytree(templates.folder, folder)
    (folder / "judge" / "task_completion.txt").write_text("{{ conversation }} {{ goall }}")
    custom = load_templates(folder)
    with pytest.raises(PromptError, match=r"task_completion\.txt: 'goall' is undefined"):
        judge_messages(custom, "task_completion", SD, TURNS)


def test_custom_folder_text_is_used(tmp_path, templates):
    folder = tmp_path / "prompts"
    shutil.copytree(templates.folder, folder)
    (folder / "assistant" / "vanilla.txt").write_text("Custom vanilla.\n")
    custom = load_templates(folder)
    assert assistant_messages(custom, SD, TURNS[:1], PromptSetting("vanilla"))[0]["content"] == "Custom vanilla."


# ---------------------------------------------------------------- conversation text


def test_conversation_text_labels_speakers_and_extends_as_prefix():
    full = conversation_text(TURNS)
    assert full.splitlines()[0] == "USER: utt-u1: evening plans?"
    assert "ASSISTANT: utt-a2: booked {for} you." in full
    for k in range(1, len(TURNS)):
        assert full.startswith(conversation_text(TURNS[:k]))


# ---------------------------------------------------------------- user agent


@pytest.mark.parametrize("scenario", [SD, MD], ids=["SD", "MD"])
@pytest.mark.parametrize("k", [0, 2, 4])
def test_user_agent_sees_profile_intent_and_situation(templates, scenario, k):
    text = only_content(user_agent_messages(templates, scenario, TURNS[:k]))
    assert_profile(text, scenario, present=True)
    assert scenario.task.user_intent in text
    for hidden in ("user42", scenario.task.goal, scenario.task.description):
        assert hidden not in text
    for domain in ("Movies", "Restaurants", "Hotels"):  # labelled iff the task touches the domain
        assert (f"[{domain}]" in text) == (domain in scenario.task.domains)
    assert "aff-hotel-loft" not in text and INTERACTIONS["Hotels"] not in text
    assert INTERACTIONS["Movies"] in text  # braces and dollars in profile text are kept verbatim
    assert ("USER: utt-u1" in text) == (k > 0)
    assert conversation_text(TURNS[:k]) in text


def test_user_id_is_never_shown_even_if_in_demographics(templates):
    user = UserProfile(7, "user7", {"user_id": "user7", **DEMOGRAPHICS}, USER.interests, AFFINITIES, INTERACTIONS)
    scenario = Scenario(user, SD.task, SITUATION)
    assert "user7" not in only_content(user_agent_messages(templates, scenario, []))
    assert "user7" not in only_content(judge_messages(templates, "personalization", scenario, TURNS))


def test_user_agent_opening_and_later_prompts_follow_figures_13_and_14(templates):
    opening = only_content(user_agent_messages(templates, SD, []))
    later = only_content(user_agent_messages(templates, SD, TURNS[:2]))
    assert "Do not output TERMINATE for this initial query" in opening
    assert "Current Interaction History" not in opening
    assert "add 'TERMINATE' at the end of your response" in later
    assert "Current Interaction History:\nUSER: utt-u1" in later


def test_user_agent_prompt_prefix_is_shared_across_turns(templates):
    prompts = [only_content(user_agent_messages(templates, MD, TURNS[:k])) for k in (2, 4)]
    short, long = prompts
    end_of_short_conversation = short.index(conversation_text(TURNS[:2])) + len(conversation_text(TURNS[:2]))
    assert long.startswith(short[:end_of_short_conversation])
    assert short.index("USER: utt-u1") == long.index("USER: utt-u1")


def test_user_agent_needs_the_assistant_to_have_spoken_last(templates):
    with pytest.raises(ValueError, match="user cannot speak next"):
        user_agent_messages(templates, SD, TURNS[:1])


# ---------------------------------------------------------------- assistant


@pytest.mark.parametrize("scenario", [SD, MD], ids=["SD", "MD"])
@pytest.mark.parametrize("setting", ALL_SETTINGS, ids=lambda s: s.label)
def test_assistant_sees_exactly_the_blocks_its_setting_enables(templates, scenario, setting):
    messages = assistant_messages(templates, scenario, TURNS[:3], setting)
    system = messages[0]["content"]
    assert messages[0]["role"] == "system"
    everything = "\n".join(m["content"] for m in messages)
    for domain in AFFINITIES:  # never the affinities, of any domain
        for value in affinity_values(domain):
            assert value not in everything
    for hidden in ("user42", scenario.task.goal, scenario.task.description, scenario.task.user_intent):
        assert hidden not in everything
    for value in DEMOGRAPHICS.values():
        assert (value in system) == setting.demographics
    for domain, summary in INTERACTIONS.items():
        assert (summary in system) == (setting.interactions and domain in scenario.task.domains)
        assert (f"[{domain}]" in system) == (setting.interactions and domain in scenario.task.domains)
    for _, value in SITUATION.items():
        assert (value in system) == setting.situation
    assert ("Response Guidelines" in system) == (setting.mode == "base")
    # the dialogue history is in the chat turns, not in the system prompt
    assert "utt-u1" not in system
    assert messages[1:] == [{"role": t.role, "content": t.text} for t in TURNS[:3]]


def test_assistant_context_blocks_sit_before_the_response_guidelines(templates):
    system = assistant_messages(templates, SD, TURNS[:1], PromptSetting.from_label("base+D+I+S"))[0]["content"]
    positions = [
        system.index(s)
        for s in ("Problem Solving", "demo-age-25-34", "int-movies", "sit-loc-harbour", "Response Guidelines")
    ]
    assert positions == sorted(positions)
    assert system.endswith("Provide your response immediately without any preamble.")


@pytest.mark.parametrize(
    "turns", [[], TURNS[:2], [Turn("assistant", "hi")], [Turn("user", "a"), Turn("user", "b"), Turn("user", "c")]]
)
def test_assistant_needs_alternating_turns_ending_with_the_user(templates, turns):
    with pytest.raises(ValueError, match="turn|assistant cannot speak next"):
        assistant_messages(templates, SD, turns, PromptSetting())


# ---------------------------------------------------------------- judge


def test_task_completion_judge_sees_goal_and_conversation_and_ends_with_verdict(templates):
    text = only_content(judge_messages(templates, "task_completion", MD, TURNS))
    assert text.endswith("VERDICT:")
    assert MD.task.goal in text and conversation_text(TURNS) in text
    assert_profile(text, MD, present=False)
    assert MD.task.description not in text and MD.task.user_intent not in text


@pytest.mark.parametrize("scenario", [SD, MD], ids=["SD", "MD"])
def test_personalization_judge_sees_profile_task_and_conversation(templates, scenario):
    text = only_content(judge_messages(templates, "personalization", scenario, TURNS))
    assert_profile(text, scenario, present=True)
    assert scenario.task.description in text and conversation_text(TURNS) in text
    for hidden in ("user42", scenario.task.goal, "aff-hotel-loft", INTERACTIONS["Hotels"]):
        assert hidden not in text
    assert "Personalization Score: [1-4]" in text and "Score of 4: EXCEPTIONAL" in text
    assert text.index("Current Context:") < text.index("Conversation:\nUSER: utt-u1")


@pytest.mark.parametrize(
    "dimension,score_line", [("naturalness", "Naturalness Score: [1-5]"), ("coherence", "Coherence Score: [1-5]")]
)
@pytest.mark.parametrize(
    "speaker,rated,other",
    [
        ("user", "overall user utterances", "overall assistant responses"),
        ("assistant", "overall assistant responses", "overall user utterances"),
    ],
)
def test_per_speaker_judges_see_only_the_conversation_and_name_the_rated_speaker(
    templates, dimension, score_line, speaker, rated, other
):
    text = only_content(judge_messages(templates, dimension, MD, TURNS, speaker=speaker))
    assert conversation_text(TURNS) in text and score_line in text
    assert rated in text and other not in text
    assert_profile(text, MD, present=False)
    for hidden in (MD.task.goal, MD.task.description, MD.task.user_intent):
        assert hidden not in text


@pytest.mark.parametrize(
    "dimension,speaker", [("naturalness", None), ("coherence", "judge"), ("task_completion", "user"), ("fluency", None)]
)
def test_judge_rejects_bad_dimension_or_speaker(templates, dimension, speaker):
    with pytest.raises(ValueError, match="dimension"):
        judge_messages(templates, dimension, SD, TURNS, speaker=speaker)


def test_judge_rejects_empty_conversation(templates):
    with pytest.raises(ValueError, match="empty conversation"):
        judge_messages(templates, "task_completion", SD, [])


# ---------------------------------------------------------------- determinism and real data


def render_all(templates, scenario: Scenario, turns) -> list:
    out = [
        user_agent_messages(templates, scenario, turns[:2]),
        *(assistant_messages(templates, scenario, turns[:3], s) for s in ALL_SETTINGS),
        judge_messages(templates, "task_completion", scenario, turns),
        judge_messages(templates, "personalization", scenario, turns),
    ]
    out += [
        judge_messages(templates, d, scenario, turns, speaker=s)
        for d in ("naturalness", "coherence")
        for s in ("user", "assistant")
    ]
    return out


def test_rendering_is_deterministic(templates):
    assert render_all(templates, MD, TURNS) == render_all(load_templates(), MD, TURNS)


def test_real_scenarios_render_with_every_domain_labelled(templates):
    if not DATA.is_dir():
        pytest.skip(f"official data excerpt not found at {DATA.resolve()}")
    from personalens.data.loading import load_scenarios

    scenarios = load_scenarios(DATA, users=[0], kinds="both")
    md = next(s for s in scenarios if s.task.kind == "MD")
    for scenario in (scenarios[0], md):
        rendered = render_all(templates, scenario, TURNS)
        ua = only_content(rendered[0])
        assert all(f"[{d}]\n" in ua for d in scenario.task.domains)
        assert scenario.user.user_id not in ua and scenario.task.user_intent in ua
        for messages in rendered[1 : 1 + len(ALL_SETTINGS)]:
            assert "User preferences" not in messages[0]["content"]
            assert scenario.task.goal not in messages[0]["content"]
