"""The answer after thinking is at most the protocol's max_tokens and the thinking at most its budget,
however early the thinking ends (engines/chat/budget.py): in process (engines/vllm/local.py, its vLLM
side scripted) and through an OpenAI-compatible server that personalens did not start, with and
without a reasoning parser (engines/serving/engine.py), each over a scripted model that thinks one
word, thinks without end, or does not think (tests/thinking_script.py), and through `generate`: no
stored answer exceeds the protocol's max_tokens. tests/test_reasoning_vllm.py does it on a real
`vllm serve`."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from cli_helpers import read_rows
from test_fidelity import PromptRecorder, config
from thinking_script import END, THINK, YES, ScriptedLLM, ScriptedServer, Thinker, Tokens

from personalens.engines.base import Request, Sampling
from personalens.engines.chat import budget
from personalens.engines.chat.reasoning import MARKERS
from personalens.engines.flow import InFlight, PromptSizes, ReplySizes
from personalens.engines.models.config import ModelConfig
from personalens.engines.serving.engine import ServerEngine
from personalens.engines.stop import Stop
from personalens.engines.vllm.local import TurnLock, VllmEngine
from personalens.simulate import command as simulate_command

BUDGET, ANSWER = 64, 800
MESSAGES = [{"role": "user", "content": "Name a colour."}]
# thinking ended after one word, thinking to the budget and past it, no thinking at all
THINKERS = {"early": (1, True), "endless": (None, True), "silent": (None, False)}


def in_process(thinker: Thinker) -> VllmEngine:
    """The in-process engine over a scripted vLLM (`ScriptedLLM`), no reasoning parser: the `<think>`
    families' markers, split on the text."""
    engine = object.__new__(VllmEngine)
    engine.name, engine.kv_tokens, engine.max_num_seqs, engine.capped, engine.max_model_len = (
        "m",
        None,
        256,
        False,
        None,
    )
    engine._stop, engine._sizes, engine._replies = Stop(), PromptSizes(), ReplySizes()
    engine._lock, engine._running, engine._done, engine._in_flight = TurnLock(), {}, {}, InFlight()
    engine._stepped_at, engine._refused, engine._next_refusal, engine._fatal = 0.0, [], 0, (MemoryError,)
    engine._harmony = engine._parser = engine._template_kwargs = None
    engine._system_role, engine._llm = True, ScriptedLLM(thinker)
    engine.chat_tokenizer = SimpleNamespace(tokenizer=Tokens(), encode_chat=Tokens().render)
    engine._chains, engine._markers = budget.Chains(), budget.markers(None)
    engine._forced = Tokens().encode(engine._markers.forced)
    return engine


def request(thinking_budget: int | None = BUDGET, grammar: str | None = None) -> Request:
    return Request(MESSAGES, Sampling(max_tokens=ANSWER, seed=1, thinking_budget=thinking_budget), grammar=grammar)


def check(gen, think: int | None, thinks: bool) -> None:
    """A reply with its answer at the cap (the scripted answer never ends) and its thinking within the budget."""
    assert gen.error is None and gen.finish_reason == "length", gen
    assert gen.answer_tokens == ANSWER and gen.text.strip() == " ".join(["yes"] * ANSWER)
    assert not any(m in gen.text or m in gen.reasoning for m in MARKERS)
    if not thinks:
        assert (gen.reasoning, gen.reasoning_tokens, gen.completion_tokens) == ("", 0, ANSWER)
    elif think == 1:
        assert (gen.reasoning, gen.reasoning_tokens) == ("hmm", 3)  # <think>, a word, </think>
    else:
        assert gen.reasoning == " ".join(["hmm"] * (BUDGET - 1)) and gen.reasoning_tokens == BUDGET


@pytest.mark.parametrize("kind", list(THINKERS))
def test_in_process_the_thinking_and_the_answer_each_keep_their_own_budget(kind):
    think, thinks = THINKERS[kind]
    thinker = Thinker(think, thinks)
    engine = in_process(thinker)
    [gen] = engine.generate([request()])
    check(gen, think, thinks)
    first, second = engine._llm.params
    # the thinking request: the budget, stopped at (and keeping) either family's end marker, no grammar
    assert (first.max_tokens, first.stop, first.include_stop_str_in_output) == (BUDGET, ["</think>", "[/THINK]"], True)
    assert first.thinking_token_budget is None and second.max_tokens == ANSWER and not second.stop
    prompt = Tokens().render(MESSAGES)
    if thinks:  # the answer continues the prompt and the thinking (ended by force where the budget cut it)
        assert thinker.prompts[1][: len(prompt)] == prompt and thinker.prompts[1][-1] == END
        assert len(thinker.prompts[1]) == len(prompt) + (3 if think else BUDGET + 1)
    else:  # a reply that did not think is asked again at the answer's cap
        assert thinker.prompts[1] == prompt
    assert not engine._chains.answers and not engine._chains.running and not engine._running


def test_in_process_a_budget_of_0_answers_after_an_empty_thinking_and_a_short_thought_keeps_its_answer():
    thinker = Thinker(1)
    engine = in_process(thinker)
    [gen] = engine.generate([request(0)])
    assert gen.answer_tokens == gen.completion_tokens == ANSWER and gen.reasoning == ""
    assert [p.max_tokens for p in engine._llm.params] == [ANSWER]  # one request: the answer's
    assert thinker.prompts[0][-2:] == [THINK, END]
    # an answer that ends itself within the cap, without thinking and without a grammar, is kept from one request
    short = Thinker(None, thinks=False)
    short.reply = lambda prompt, max_tokens, stops=(), keep_stop=False: ([YES] * 5, "stop")
    [gen] = in_process(short).generate([request()])
    assert (gen.text, gen.completion_tokens, gen.finish_reason) == (" yes yes yes yes yes", 5, "stop")
    # with a grammar (a judge's), that same reply is asked again with the grammar
    [gen] = (engine := in_process(short)).generate([request(grammar='root ::= "yes"')])
    assert [p.structured_outputs is not None for p in engine._llm.params] == [False, True]


def served(url: str) -> ServerEngine:
    raw = {"name": "served", "engine": "server", "server": {"base_url": url, "model": "m", "retries": 0}}
    return ServerEngine(ModelConfig.from_mapping({**raw, "reasoning_parser": "deepseek_r1"}))


@pytest.mark.parametrize("parser", [True, False], ids=["parser", "no-parser"])
@pytest.mark.parametrize("kind", list(THINKERS))
def test_through_a_server_the_lab_runs_the_thinking_and_the_answer_each_keep_their_own_budget(kind, parser):
    think, thinks = THINKERS[kind]
    server = ScriptedServer(Thinker(think, thinks), parser)
    try:
        [gen] = served(server.url).generate([request()])
    finally:
        server.close()
    check(gen, think, thinks)
    (route, first), *rest = [(r, b) for r, b in server.bodies if r != "/tokenize"]
    assert route == "/v1/chat/completions" and "thinking_token_budget" not in first
    assert (first["max_tokens"], first["stop"], first["return_token_ids"]) == (BUDGET, ["</think>", "[/THINK]"], True)
    [(route, second)] = rest
    assert second["max_tokens"] == ANSWER and "stop" not in second
    assert route == ("/v1/completions" if thinks else "/v1/chat/completions")


@pytest.mark.parametrize("engine_kind", ["in process", "server"])
def test_no_stored_answer_exceeds_the_protocols_max_tokens_when_thinking_ends_early(engine_kind, tmp_path):
    """Through `generate`: an assistant whose thinking ends after one word, with a budget of 64 beside the
    paper's 800-token answer; each stored answer is at most 800 tokens, its thinking at most 64."""
    cfg = config(
        f"run.out_dir={tmp_path / 'run'}",
        "assistant.reasoning_parser=deepseek_r1",
        f"protocol.assistant.thinking_budget={BUDGET}",
        f"protocol.assistant.max_tokens={ANSWER}",
        "lockstep.token_ids=false",
    )
    server = ScriptedServer(Thinker(1), parser=False) if engine_kind == "server" else None
    assistant = served(server.url) if server else in_process(Thinker(1))
    try:
        assert simulate_command.generate(cfg, lambda: {"user_agent": PromptRecorder(), "assistant": assistant}) == 0
    finally:
        if server:
            server.close()
    turns = [t for d in read_rows(tmp_path / "run" / "dialogues") for t in d["turns"] if t["role"] == "assistant"]
    cap = int(cfg.protocol.assistant.max_tokens)
    assert turns and all(t["completion_tokens"] - t["reasoning_tokens"] <= cap for t in turns)
    assert all(t["reasoning"] == "hmm" and t["reasoning_tokens"] <= BUDGET for t in turns)
    assert all(t["text"].strip() == " ".join(["yes"] * cap) and t["finish_reason"] == "length" for t in turns)


class Restating(Thinker):
    """A `Thinker` whose answer writes the end-of-thinking marker again after two words of answer."""

    def _token(self, answering: bool, position: int) -> int:
        return END if answering and position == 2 else super()._token(answering, position)


@pytest.mark.parametrize("engine_kind", ["in process", "server with a parser", "server without one"])
def test_an_end_marker_inside_the_answer_keeps_the_answer_whole(engine_kind):
    """The answer request's text is all answer: a `</think>` that the model writes in it is removed, not
    read as the end of a thinking whose answer would then be the words after it (or none)."""
    thinker = Restating(1)
    server = ScriptedServer(thinker, parser=engine_kind.endswith("parser")) if "server" in engine_kind else None
    try:
        [gen] = (served(server.url) if server else in_process(thinker)).generate([request()])
    finally:
        if server:
            server.close()
    assert gen.error is None and gen.finish_reason == "length" and gen.reasoning == "hmm", gen
    assert gen.text.split() == ["yes"] * (ANSWER - 1) and not any(m in gen.text for m in MARKERS)
    assert gen.answer_tokens == ANSWER  # the marker written in the answer is one of its tokens


def test_gpt_oss_thinking_stops_at_its_final_channel_or_is_ended_there_by_force():
    """gpt-oss's harmony channels, through openai_harmony's real encoding: a thinking request stops at the
    final channel's header (the analysis then continued), one the budget cut has the analysis closed and
    the final channel opened after it, so that the answer request's output is the final channel."""
    pytest.importorskip("openai_harmony")
    from personalens.engines.base import Generation
    from personalens.engines.chat.harmony import encoding, split_harmony
    from personalens.engines.chat.reasoning import with_split

    enc, markers = encoding(), budget.markers("openai_gptoss")

    def thought(text: str, finish: str):
        ids = enc.encode(text, allowed_special="all")
        return ids, with_split(Generation("", 10, len(ids), finish_reason=finish), split_harmony(ids, enc))

    analysis = "<|channel|>analysis<|message|>Weigh the options."
    _, ended = thought(f"{analysis}<|end|><|start|>assistant{markers.stops[0]}", "stop")
    assert budget.step(request(), ended, cut=False) == budget.CONTINUE and ended.reasoning == "Weigh the options."
    cut_ids, cut = thought(analysis, "length")
    assert budget.step(request(), cut, cut=True) == budget.FORCE
    answer = enc.encode("Take the train.<|return|>", allowed_special="all")
    forced = budget.continued([], cut_ids, enc.encode(markers.forced, allowed_special="all"))
    whole = split_harmony([*forced, *answer], enc)
    assert (whole.answer, whole.reasoning) == ("Take the train.", "Weigh the options.")
