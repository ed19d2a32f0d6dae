"""Thinking split from answers (personalens/engines/chat/reasoning.py): every form on text, on output ids
with vLLM's own reasoning parsers, and from a server's reply; tests/test_reasoning_pipeline.py runs
the split through generate, judge and report."""

from __future__ import annotations

import dataclasses

import pytest

from personalens.engines.base import Generation
from personalens.engines.chat.reasoning import (
    THINKING,
    leaks,
    load_parser,
    opens_thinking,
    split_ids,
    split_text,
    thinking_tokens,
    with_split,
)
from personalens.engines.serving.http import _generation


@pytest.mark.parametrize(
    ("text", "opened", "answer", "reasoning", "closed"),
    [
        (
            "<think>\nWeigh the options.\n</think>\n\nTake the train.",
            False,
            "Take the train.",
            "Weigh the options.",
            True,
        ),
        ("<think>\nWeigh the options, then", False, "", "Weigh the options, then", False),  # cut inside
        ("Weigh the options.\n</think>\n\nTake the train.", True, "Take the train.", "Weigh the options.", True),
        ("Weigh the options, then", True, "", "Weigh the options, then", False),  # opened in the prompt, cut
        ("[THINK]Weigh it.[/THINK]Take the train.", False, "Take the train.", "Weigh it.", True),
        ("[THINK]Weigh it", False, "", "Weigh it", False),
        ("Take the train.", False, "Take the train.", "", True),
        # two blocks: the answer is what follows the last end marker, and no marker stays in it
        ("<think>a</think>draft<think>b</think>Take the train.", False, "Take the train.", "adraftb", True),
    ],
)
def test_split_text_forms(text, opened, answer, reasoning, closed):
    split = split_text(text, opened)
    assert (split.answer, split.reasoning, split.closed) == (answer, reasoning, closed)
    assert leaks(split.answer) == 0


def test_opens_thinking_reads_the_prompts_end():
    assert opens_thinking("<｜Assistant｜><think>\n")
    assert not opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # Qwen3, thinking off
    assert not opens_thinking("<|im_start|>assistant\n")


def test_a_reply_cut_in_thinking_finishes_as_thinking_with_no_answer():
    raw = Generation(text="<think>Weigh the", prompt_tokens=9, completion_tokens=800, finish_reason="length")
    gen = with_split(raw, split_text(raw.text))
    assert (gen.text, gen.reasoning, gen.finish_reason) == ("", "Weigh the", THINKING)
    assert gen.reasoning_tokens is None and gen.answer_tokens is None  # seen as text only: not counted
    plain = with_split(Generation("Hello", 3, 2, finish_reason="stop"), split_text("Hello"))
    assert (plain.text, plain.reasoning_tokens, plain.answer_tokens, plain.finish_reason) == ("Hello", 0, 2, "stop")


class _Tokenizer:
    """Whole words as tokens (pure logic for vLLM's parsers, which need only a vocabulary and decode)."""

    def __init__(self, words):
        self.words = list(words)
        self.ids = {w: i for i, w in enumerate(self.words)}

    def get_vocab(self):
        return dict(self.ids)

    def encode(self, text):
        return [self.ids[w] for w in text.split()]

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(self.words[i] for i in ids)


WORDS = ["<think>", "</think>", "weigh", "options", "take", "train", "[THINK]", "[/THINK]"]


@pytest.mark.parametrize(
    ("parser", "output", "opened", "answer", "reasoning", "tokens", "closed"),
    [
        ("deepseek_r1", "<think> weigh options </think> take train", False, "take train", "weigh options", 4, True),
        ("deepseek_r1", "weigh options </think> take train", True, "take train", "weigh options", 3, True),
        ("deepseek_r1", "<think> weigh options", False, "", "weigh options", 3, False),
        ("deepseek_r1", "weigh options", True, "", "weigh options", 2, False),
        ("deepseek_r1", "take train", False, "take train", "", 0, True),
    ],
)
def test_split_ids_with_vllms_parser(parser, output, opened, answer, reasoning, tokens, closed):
    tokenizer = _Tokenizer(WORDS)
    split = split_ids(load_parser(parser, tokenizer, {}), tokenizer.encode(output), tokenizer.decode, opened)
    assert (split.answer, split.reasoning, split.reasoning_tokens, split.closed) == (answer, reasoning, tokens, closed)


def _reply(message, finish="stop", usage=None):
    return {
        "choices": [{"message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 50, **(usage or {})},
    }


def test_server_replies_reasoning_field_content_field_and_text():
    counted = {"completion_tokens_details": {"reasoning_tokens": 30}}
    gen = _generation(_reply({"content": "\n\nTake the train.", "reasoning": "Weigh it."}, usage=counted), "s")
    assert (gen.text, gen.reasoning, gen.reasoning_tokens, gen.answer_tokens) == (
        "Take the train.",
        "Weigh it.",
        30,
        20,
    )
    older = _generation(_reply({"content": "Take the train.", "reasoning_content": "Weigh it."}), "s")
    assert (older.text, older.reasoning, older.reasoning_tokens) == ("Take the train.", "Weigh it.", None)
    # vLLM counts thinking between the output's markers: 0 where the template opened it in the prompt
    zero = {"completion_tokens_details": {"reasoning_tokens": 0}}
    opened = _generation(_reply({"content": "Take the train.", "reasoning": "Weigh it."}, usage=zero), "s")
    assert (opened.reasoning, opened.reasoning_tokens) == ("Weigh it.", None)
    cut = _generation(_reply({"content": None, "reasoning": "Weigh the"}, finish="length", usage=zero), "s")
    assert (cut.text, cut.finish_reason, cut.reasoning_tokens) == ("", THINKING, 50)  # all of it thinking
    unparsed = _generation(_reply({"content": "<think>Weigh it.</think>Take the train."}), "s")
    assert (unparsed.text, unparsed.reasoning) == ("Take the train.", "Weigh it.")


def test_text_splits_are_counted_on_the_ids_up_to_the_end_marker_in_one_token_or_several():
    vocab = ["<think>", "</think>", "</", "think>", "weigh", " it", "go"]

    def decode(ids):
        return "".join(vocab[i] for i in ids)

    for ids, thinking in (([0, 4, 5, 1, 6], 4), ([0, 4, 5, 2, 3, 6], 5), ([4, 5, 1, 6], 3)):
        text = decode(ids)
        split = thinking_tokens(split_text(text), text, ids, decode)
        assert (split.answer, split.reasoning, split.reasoning_tokens) == ("go", "weigh it", thinking)
    assert thinking_tokens(split_text("<think>weigh"), "<think>weigh", [0, 4], decode).reasoning_tokens == 2
    assert thinking_tokens(split_text("go"), "go", [6], decode).reasoning_tokens == 0


def test_a_servers_request_carries_the_models_template_kwargs():
    from engine_fixtures import chat

    from personalens.engines.serving.engine import chat_body

    body = chat_body("m", chat("Hi"), system_role=True, template_kwargs={"enable_thinking": False})
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert "chat_template_kwargs" not in chat_body("m", chat("Hi"), system_role=True)


def test_span_hashes_are_the_polynomial_hashes_of_every_run():
    from personalens.engines.chat.spans import SPAN, span_hashes

    text = "Weigh the options:\n  the train is   slower, the plane costs more — but é and 漢字 count once."
    collapsed = " ".join(text.split())
    modulus, base = 1 << 64, 0x100000001B3
    direct = {
        sum(ord(c) * pow(base, SPAN - 1 - k, modulus) for k, c in enumerate(collapsed[i : i + SPAN])) % modulus
        for i in range(len(collapsed) - SPAN + 1)
    }
    assert len(span_hashes(text)) == len(collapsed) - SPAN + 1 and {int(h) for h in span_hashes(text)} == direct
    assert span_hashes("x" * (SPAN - 1)).size == 0


def test_thinking_is_found_in_its_own_answer_or_a_later_text_past_what_its_prompt_showed():
    from personalens.engines.chat.spans import SPAN, thinking_found

    own = "the museum's night opening on fridays is worth suggesting"
    quoted = "I want a quiet museum visit with my two children next week"
    profile = "Enjoys modern art and visits galleries on most weekends"
    thinking = f"They said: {quoted}. Their profile: {profile}. Maybe {own}."
    assert len(own) > SPAN
    # what it quoted from its prompt (an earlier turn, the profile), said again later: no leak
    clean = [(quoted, ""), ("Try the science museum.", thinking), (f"{quoted}. {profile}.", "")]
    assert thinking_found(clean, given=profile) == (False, False, False)
    assert thinking_found(clean) == (False, True, False)  # without the profile it showed, the line counts
    # a run it did not read, planted into its own answer, or into a later text however spaced: found
    assert thinking_found([clean[0], (f"Sure: {own}.", thinking), clean[2]], given=profile) == (False, True, False)
    said = own.replace(" ", "\n  ")
    assert thinking_found([*clean[:2], (f"So {said}?", "")], given=profile) == (False, True, False)
    # a run one character short of SPAN is not searched
    assert thinking_found([*clean[:2], (f"So:{own[: SPAN - 1]}", "")], given=profile) == (False, False, False)


def test_the_share_of_thinking_that_repeats_itself():
    from personalens.engines.chat.spans import SPAN, repeated_share

    assert repeated_share("x" * (SPAN - 1)) is None
    assert repeated_share("Let me check the dates again. " * 20) > 0.9  # a loop
    assert repeated_share("".join(chr(0x4E00 + i) for i in range(400))) == 0.0


def test_a_reply_cut_after_its_thinking_with_no_answer_ends_in_thinking_in_every_engine():
    """Thinking that ended, then max_tokens before a word of answer: no reply, whether split on ids in
    process, from a server's `reasoning` field or on the text; a reply that stopped there, and a model
    that did not think, keep their (empty) answer."""
    tokenizer = _Tokenizer(WORDS)
    ids = tokenizer.encode("<think> weigh options </think>")
    split = split_ids(load_parser("deepseek_r1", tokenizer, {}), ids, tokenizer.decode)
    raw = Generation("", prompt_tokens=9, completion_tokens=len(ids), finish_reason="length")
    in_process = with_split(raw, split)
    served = _generation(_reply({"content": "\n\n", "reasoning": "weigh options"}, finish="length"), "s")
    text = with_split(raw, split_text("<think>weigh options</think>\n"))
    for gen in (in_process, served, text):
        assert (gen.text, gen.reasoning, gen.finish_reason) == ("", "weigh options", THINKING)
    assert with_split(dataclasses.replace(raw, finish_reason="stop"), split).finish_reason == "stop"
    assert with_split(raw, split_text("  ")).finish_reason == "length"


def test_a_server_reply_without_a_reasoning_field_is_split_knowing_whether_the_prompt_opened_the_thinking():
    cut = _reply({"content": "Weigh the options, the train"}, finish="length")
    gen = _generation(cut, "s", opened=True)
    assert (gen.text, gen.reasoning, gen.finish_reason) == ("", "Weigh the options, the train", THINKING)
    assert _generation(cut, "s").text == "Weigh the options, the train"  # no thinking opened: an answer
    ended = _generation(_reply({"content": "Weigh it.\n</think>\n\nTake the train."}), "s", opened=True)
    assert (ended.text, ended.reasoning, ended.finish_reason) == ("Take the train.", "Weigh it.", "stop")


def test_a_servers_request_carries_the_reasoning_effort_in_its_own_field():
    from engine_fixtures import chat

    from personalens.engines.serving.engine import chat_body

    body = chat_body("m", chat("Hi"), system_role=True, template_kwargs={"reasoning_effort": "high"})
    assert body["reasoning_effort"] == "high" and body["chat_template_kwargs"] == {"reasoning_effort": "high"}
    assert "reasoning_effort" not in chat_body("m", chat("Hi"), True, {"enable_thinking": True})
