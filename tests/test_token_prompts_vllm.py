"""Token-id prompts through the real vLLM engine: the ids personalens makes are the ids vLLM's own
chat path makes, and lockstep dialogues come out the same whether prompts go as kept token ids or
as chat messages (same seeds, same text); scheduling=continuous runs the same dialogues through
vLLM's engine steps, and ends a dialogue whose request vLLM dropped as `failed`."""

from __future__ import annotations

import random

import pytest
from engine_fixtures import chat

from personalens.data import load_scenarios
from personalens.engines.base import Request, Sampling
from personalens.engines.chat.token_ids import ChatTokenizer
from personalens.paths import PROJECT_ROOT
from personalens.prompts.setting import PromptSetting
from personalens.prompts.templates import load_templates
from personalens.simulate.continuous import run_continuous
from personalens.simulate.dialogue import EndRules
from personalens.simulate.generate import Protocol, plan_dialogues, renderer
from personalens.simulate.lockstep import run_lockstep

pytestmark = pytest.mark.vllm

CONVERSATIONS = [
    [{"role": "user", "content": "Hello there."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a fruit.\n\nOnly one."}],
    [
        {"role": "system", "content": "You plan trips. Café naïve 東京 😀"},
        {"role": "user", "content": "I need a flight to Rome on Tuesday, around 7:30pm?"},
        {"role": "assistant", "content": "Sure - here are 2 options:\n1. AZ 611\n2. FR 9012"},
        {"role": "user", "content": "The first one, thanks!  TERMINATE"},
    ],
]


def test_ids_equal_what_vllm_chat_tokenizes(engine):
    outputs = engine._llm.chat(CONVERSATIONS, [engine_params(2)] * len(CONVERSATIONS), use_tqdm=False)
    ours = engine.chat_tokenizer.encode_chats(CONVERSATIONS)
    assert ours == [list(out.prompt_token_ids) for out in outputs]
    folded = ChatTokenizer(engine.chat_tokenizer.tokenizer, system_role=False)
    assert folded.encode_chat(CONVERSATIONS[1])[: len(ours[1])] != ours[1]  # folding changes the prompt


def engine_params(max_tokens: int):
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0)


def test_token_prompts_generate_what_messages_generate(engine):
    requests = [chat(c[-1]["content"], max_tokens=12, temperature=0.8, seed=7) for c in CONVERSATIONS]
    # both from a cold prefix cache: KV served from the cache is computed in another batch, and at
    # temperature > 0 its rounding can change a sampled token
    engine.reset_prefix_cache()
    by_messages = engine.generate(requests)
    ids = engine.chat_tokenizer.encode_chats([r.messages for r in requests])
    engine.reset_prefix_cache()
    by_ids = engine.generate([Request(r.messages, r.sampling, prompt_ids=i) for r, i in zip(requests, ids)])
    assert [g.text for g in by_ids] == [g.text for g in by_messages]
    assert [g.prompt_tokens for g in by_ids] == [len(i) for i in ids]


def same_prompts_until_a_reply_differs(a: list[tuple], b: list[tuple]) -> bool:
    """Two runs of one dialogue, turn by turn (role, text, prompt tokens): while their histories
    agree, every prompt has the same length, the turn whose reply first differs included. Returns
    whether every reply agreed."""
    for (role_a, text_a, prompt_a), (role_b, text_b, prompt_b) in zip(a, b):
        assert (role_a, prompt_a) == (role_b, prompt_b)
        if text_a != text_b:
            return False
    return len(a) == len(b)


def test_lockstep_dialogues_are_the_same_with_kept_ids_and_with_messages(engine, sample_root):
    """The quickstart's path (official prompts, quick protocol's sampling, short replies here) on a
    few sample scenarios, once per prompt route, and once with scheduling=continuous through vLLM's
    engine steps. A reply is computed in a batch whose make-up depends on when vLLM's engine process
    picked up each request, and at temperature > 0 the batch's rounding can change a sampled token
    (the same prompts sent twice by the same route can differ so): so the runs must send prompts of
    the same length for the same history, up to and including the first reply that differs."""
    templates = load_templates(PROJECT_ROOT / "prompts" / "official", style="official", verbatim=True)
    scenarios = random.Random(3).sample(load_scenarios(sample_root), 4)
    protocol = Protocol(
        2,
        2,
        {"user": Sampling(temperature=0.5, max_tokens=24), "assistant": Sampling(temperature=0.0, max_tokens=24)},
        EndRules("substring", reply_after_cap=True),
    )
    engines = {"user": engine, "assistant": engine}
    runs, steps = {}, []
    for route in ("ids", "messages", "continuous"):
        todo, _ = plan_dialogues(scenarios, PromptSetting("base"), 1, 0, protocol, set())
        engine.reset_prefix_cache()  # each route from a cold cache, so all compute alike
        render = renderer(templates, PromptSetting("base"))
        if route == "continuous":
            run_continuous(todo, engines, render, protocol.sampling, lambda _: None, steps.append)
        else:
            run_lockstep(todo, engines, render, protocol.sampling, lambda _: None, keep_ids=route == "ids")
        runs[route] = [[(t.role, t.text, t.prompt_tokens) for t in d.turns] for d in todo]
        # the official rules: the user agent answers the capped reply; a TERMINATE earns one more
        assert all((d.ended, d.turns[-1].role) in {("max_rounds", "user"), ("terminated", "assistant")} for d in todo)
    for route in ("messages", "continuous"):
        agreed = [same_prompts_until_a_reply_differs(a, b) for a, b in zip(runs["ids"], runs[route])]
        print(f"{route}: {sum(agreed)} of {len(agreed)} dialogues the same as by ids")
    assert sum(len(turns) for turns in runs["ids"]) >= 4 * 4
    # continuous: every reply came back through an engine step and a traced submission
    turns = sum(map(len, runs["continuous"]))
    assert sum(s.requests for s in steps) == sum(t.requests for s in steps for t in s.calls) == turns


class AbortingOne:
    """The real engine, except that vLLM is told to abort the second request of the first submission
    (a dialogue's opening): vLLM then stops running it and never reports it finished, a request it
    dropped."""

    def __init__(self, engine):
        self.engine, self.aborted = engine, None

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def submit(self, requests):
        ids = self.engine.submit(requests)
        if self.aborted is None:
            self.aborted = requests[1]
            self.engine._llm.llm_engine.abort_request([ids[1]], internal=False)
        return ids


def short_chat(dialogue, role: str) -> list[dict]:
    """A prompt of a few tokens (the official prompts' profiles make each step slow on a CPU)."""
    return [{"role": "user", "content": f"Say hi to {dialogue.scenario.user.user_id} as the {role}."}]


def test_a_request_vllm_drops_under_continuous_scheduling_fails_its_dialogue_and_the_run_ends(engine, sample_root):
    protocol = Protocol(
        1, 1, {r: Sampling(temperature=0.0, max_tokens=4) for r in ("user", "assistant")}, EndRules("substring", True)
    )
    todo, _ = plan_dialogues(load_scenarios(sample_root)[:2], PromptSetting("base"), 1, 0, protocol, set())
    dropping = AbortingOne(engine)
    finished = []
    engines = {"user": dropping, "assistant": dropping}
    run_continuous(todo, engines, short_chat, protocol.sampling, finished.extend, keep_ids=False)
    assert dropping.aborted is not None and engine.idle()
    failed = [d for d in todo if d.ended == "failed"]
    assert [(d.error, len(d.turns)) for d in failed] == [("vLLM dropped the request without a reply", 0)]
    assert all(d.ended == "max_rounds" and len(d.turns) == 3 for d in todo if d not in failed)
    assert sorted(map(id, finished)) == sorted(map(id, todo))
