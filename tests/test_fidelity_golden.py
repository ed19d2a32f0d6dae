"""Golden tests: every prompt the `official` fidelity option renders equals, character for character,
what the released PersonaLens code assembles for the same inputs.

The expected strings come from running the released code itself (../shared/official-code): its
dialogue simulation (`src/generate_dialogue.py`, `src/generate_dialogue_md.py`) and its judge script
(`src/evaluate_dialogue.py`) run on the excerpt users with a scripted stand-in for the Bedrock
client, which records every request body and answers with fixed replies. Only the client libraries
(boto3, botocore, diskcache) are replaced; all prompt wording, formatting and assembly is theirs.
"""

from __future__ import annotations

import argparse
import io
import json
import runpy
import sys
import types

import pytest

from personalens.data import load_scenarios
from personalens.data.records import Turn
from personalens.paths import PROJECT_ROOT
from personalens.prompts import PromptSetting, assistant_messages, judge_messages, load_templates, user_agent_messages

OFFICIAL = PROJECT_ROOT.parent / "shared" / "official-code"
USERS = (0, 1, 2)
# the released code's assistant model ids -> our prompt families
FAMILIES = {"claude-3-sonnet-v1": "default", "llama-3-1-8b-instruct-v1": "llama", "mistral-7b-instruct-v2": "mistral"}
# the released code's flags (demographic, past interaction summary, situation) -> our settings
FLAGS = {
    (False, False, False): "base",
    (True, False, False): "base+D",
    (False, True, False): "base+I",
    (False, False, True): "base+S",
    (True, True, True): "base+D+I+S",
}
USER_SYSTEM_START = "<instruction>\nYou are tasked"
OPENING, CLOSING = "Hi, can you give me a hand with something?", "Perfect, that's all. TERMINATE"
ASSISTANT_REPLY = "  Sure thing, done.\n"  # the released code keeps Claude's text as is, lstrips Llama's/Mistral's

pytestmark = pytest.mark.skipif(
    not (OFFICIAL / "src" / "generate_dialogue.py").is_file(),
    reason=f"the released PersonaLens code is not at {OFFICIAL} (it is reference material outside the repository)",
)


class Recorder:
    """Stands in for boto3's bedrock-runtime client: records each request, answers by role."""

    def __init__(self):
        self.calls: list[dict] = []

    def invoke_model(self, body: str, modelId: str):
        request = json.loads(body)
        self.calls.append(request)
        if "messages" in request and request["system"].startswith(USER_SYSTEM_START):
            text = request["messages"][0]["content"][0]["text"]
            reply = OPENING if "<initial_query>" in text else CLOSING
        else:
            reply = ASSISTANT_REPLY
        payload = {"content": [{"text": reply}], "generation": reply, "outputs": [{"text": reply}]}
        return {"body": io.BytesIO(json.dumps(payload).encode())}


@pytest.fixture(scope="module")
def released(tmp_path_factory, shared_data_root):
    """Imports the released code with a recording Bedrock client, in a scratch working directory
    that holds the excerpt's data/ (the released scripts read and write relative paths)."""
    recorder = Recorder()
    boto3 = types.ModuleType("boto3")
    boto3.Session = lambda: types.SimpleNamespace(client=lambda *a, **k: recorder)
    botocore = types.ModuleType("botocore")
    exceptions = types.ModuleType("botocore.exceptions")
    exceptions.ClientError = type("ClientError", (Exception,), {})
    diskcache = types.ModuleType("diskcache")
    diskcache.Cache = lambda path: {}
    stubs = {"boto3": boto3, "botocore": botocore, "botocore.exceptions": exceptions, "diskcache": diskcache}
    work = tmp_path_factory.mktemp("released")
    (work / "data").mkdir()
    (work / "data" / "profile").symlink_to(shared_data_root / "profile")
    mp = pytest.MonkeyPatch()
    for name, module in stubs.items():
        mp.setitem(sys.modules, name, module)
    for name in [n for n in sys.modules if n in ("src", "util") or n.startswith(("src.", "util."))]:
        mp.delitem(sys.modules, name)
    mp.syspath_prepend(str(OFFICIAL))
    mp.chdir(work)
    from src import generate_dialogue, generate_dialogue_md  # noqa: E402  (the released modules)
    from util import assistant_prompts

    yield types.SimpleNamespace(
        recorder=recorder, sd=generate_dialogue, md=generate_dialogue_md, prompts=assistant_prompts, work=work
    )
    mp.undo()
    for name in [n for n in sys.modules if n in ("src", "util") or n.startswith(("src.", "util."))]:
        del sys.modules[name]


@pytest.fixture(scope="module")
def scenarios(shared_data_root):
    return {s.key: s for s in load_scenarios(shared_data_root, list(USERS))}


@pytest.fixture(scope="module")
def templates():
    return load_templates(PROJECT_ROOT / "prompts" / "official", style="official", verbatim=True)


def simulate(released, model: str, flags: tuple[bool, bool, bool], kind: str) -> list[tuple[str, str, dict]]:
    """Runs the released simulation of every excerpt user's `kind` tasks; returns (user_id, task_id,
    request) per model call, in call order (the tasks file's order, four calls per task)."""
    released.recorder.calls.clear()
    module = released.sd if kind == "SD" else released.md
    args = argparse.Namespace(
        demographic=flags[0],
        past_interaction_summary=flags[1],
        situation=flags[2],
        model_id_asst=model,
        model_id_user="claude-3-sonnet-v1",
        bedrock_region="us-east-1",
    )
    for user in USERS:
        module.main(user, args)
    calls = iter(released.recorder.calls)
    out = []
    for user in USERS:
        tasks = json.loads(
            (
                released.work / "data" / "profile" / f"user{user}" / ("tasks.json" if kind == "SD" else "tasks_md.json")
            ).read_text()
        )
        for task in tasks.values():
            out += [(f"user{user}", task["task_id"], next(calls)) for _ in range(4)]
    assert next(calls, None) is None
    return out


def saved_dialogue(released, user_id: str, task_id: str, model: str, tag: str = "") -> list[Turn]:
    path = released.work / "output" / "dialogue" / user_id / f"{model}{tag}" / f"{task_id}_dialogue.json"
    return [Turn(m["role"], m["content"]) for m in json.loads(path.read_text())["dialogue"]]


def sent_messages(request: dict, model: str, system: str) -> list[dict]:
    """The messages a request carried: Claude's API fields; for Llama, the (system, user) pair parsed
    back out of the prompt string the released code formats by hand (given its system part); for
    Mistral, whose format has no system role, the one [INST] block's text."""
    if "messages" in request:
        assert len(request["messages"]) == 1 and request["messages"][0]["role"] == "user"
        return [
            {"role": "system", "content": request["system"]},
            {"role": "user", "content": request["messages"][0]["content"][0]["text"]},
        ]
    raw = request["prompt"]
    if "llama" in model:
        head = (
            f"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|>\n"
            "<|start_header_id|>user<|end_header_id|>\n\n"
        )
        tail = "<|eot_id|>\n<|start_header_id|>assistant<|end_header_id|>"
        assert raw.startswith(head) and raw.endswith(tail), raw[:200]
        return [{"role": "system", "content": system}, {"role": "user", "content": raw[len(head) : -len(tail)]}]
    assert raw.startswith("<s>[INST]") and raw.endswith("[/INST]"), raw[:200]
    return [{"role": "user", "content": raw[len("<s>[INST]") : -len("[/INST]")]}]


@pytest.mark.parametrize("kind", ["SD", "MD"])
@pytest.mark.parametrize("model", list(FAMILIES))
@pytest.mark.parametrize("flags", list(FLAGS), ids=list(FLAGS.values()))
def test_user_agent_and_assistant_prompts_match_the_released_simulation(
    released, scenarios, templates, model, flags, kind
):
    family, setting = FAMILIES[model], PromptSetting.from_label(FLAGS[flags])
    tag = "".join(t for t, on in zip(("_d", "_p", "_s"), flags) if on)
    calls = simulate(released, model, flags, kind)
    assert calls
    for n, (user_id, task_id, request) in enumerate(calls):
        scenario = scenarios[(user_id, task_id)]
        history = saved_dialogue(released, user_id, task_id, model, tag)[: n % 4]
        if n % 2 == 0:  # the user agent: opening query, then its reply after the assistant's first turn
            ours = user_agent_messages(templates, scenario, history)
            assert ours == sent_messages(request, "claude", request["system"]), (user_id, task_id, n % 4)
        else:
            ours = assistant_messages(templates, scenario, history, setting, family)
            assert ours == sent_messages(request, model, ours[0]["content"]), (user_id, task_id, n % 4)


@pytest.mark.parametrize("kind", ["SD", "MD"])
@pytest.mark.parametrize("family", ["default", "llama", "mistral"])
def test_vanilla_assistant_prompt_matches_the_released_vanilla_prompts(released, scenarios, templates, family, kind):
    """The release's only vanilla prompts (CLAUDE_*_VANILLA), which its simulation never selects by
    itself: assembled here with its own prompt template class, for every family."""
    module = released.sd if kind == "SD" else released.md
    template = module.AssistantPromptTemplate(
        system_prompt=released.prompts.CLAUDE_SYSTEM_PROMPT_VANILLA,
        task_prompt=released.prompts.CLAUDE_TASK_PROMPT_VANILLA,
    )
    simulate(released, "claude-3-sonnet-v1", (False, False, False), kind)
    checked = 0
    for (user_id, task_id), scenario in scenarios.items():
        if scenario.task.kind != kind:
            continue
        dialogue = saved_dialogue(released, user_id, task_id, "claude-3-sonnet-v1")
        for cut in (1, 3):
            history = [{"role": t.role, "content": t.text} for t in dialogue[:cut]]
            expected = [
                {"role": "system", "content": template.system_prompt},
                {"role": "user", "content": template.format_prompt({}, {}, {}, [False] * 3, history)},
            ]
            assert assistant_messages(templates, scenario, dialogue[:cut], PromptSetting("vanilla"), family) == expected
            checked += 1
    assert checked


JUDGE_RUNS = [
    ("task_completion", "", None),
    ("personalization", "", None),
    ("naturalness", "", "user"),
    ("naturalness", "-a", "assistant"),
    ("coherence", "", "user"),
    ("coherence", "-a", "assistant"),
]


@pytest.mark.parametrize("kind", ["SD", "MD"])
@pytest.mark.parametrize("dimension,flag,speaker", JUDGE_RUNS, ids=[f"{d}-{s}" for d, _, s in JUDGE_RUNS])
def test_judge_prompts_match_the_released_evaluation(released, scenarios, templates, dimension, flag, speaker, kind):
    """The released judge script run on the dialogues its simulation wrote (base setting)."""
    simulate(released, "claude-3-sonnet-v1", (False, False, False), kind)
    released.recorder.calls.clear()
    argv = [
        "evaluate_dialogue.py",
        "-s",
        str(USERS[0]),
        "-e",
        str(USERS[-1]),
        "-m",
        "claude-3-sonnet-v1",
        "-d",
        dimension,
        *([flag] if flag else []),
        *(["-md"] if kind == "MD" else []),
    ]
    mp = pytest.MonkeyPatch()
    mp.setattr(sys, "argv", argv)
    try:
        runpy.run_path(str(OFFICIAL / "src" / "evaluate_dialogue.py"), run_name="__main__")
    finally:
        mp.undo()
    keys = [k for k, s in scenarios.items() if s.task.kind == kind]
    assert len(released.recorder.calls) == len(keys)
    for (user_id, task_id), request in zip(keys, released.recorder.calls):
        assert request["system"] == "" and len(request["messages"]) == 1
        expected = [{"role": "user", "content": request["messages"][0]["content"][0]["text"]}]
        dialogue = saved_dialogue(released, user_id, task_id, "claude-3-sonnet-v1")
        ours = judge_messages(templates, dimension, scenarios[(user_id, task_id)], dialogue, speaker)
        assert ours == expected, (user_id, task_id)
