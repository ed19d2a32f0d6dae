"""The engine over a model's copies (engines/replicated.py): its batch split by affinity or
round-robin, the replies in request order, progress reported from the calling thread, a refusal
kept to its request and a copy's failure failing the call, with scripted engines standing for the
copies; then the in-process vLLM engine as the first copy, answering from a thread of its own and
stopped when another copy fails. tests/test_managed_vllm.py runs it over real vLLM servers."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

from personalens.engines.base import Generation, Request, Sampling, conversation, rejected
from personalens.engines.replicated import ReplicatedEngine, copy_of
from personalens.engines.serving.processes import ServerExited


class Copy:
    """A scripted copy: answers `<tag>:<text of the request's last message>`, one request at a time from
    a thread of its own (as a server engine's event loop would), and records what it was sent."""

    def __init__(self, tag: str, *, refuse: str = "", fail: Exception | None = None, pause: float = 0.0):
        self.name, self.tag, self.refuse, self.fail, self.pause = "model", tag, refuse, fail, pause
        self.calls: list[list[str]] = []
        self.finished_threads: set[str] = set()
        self.answered = 0

    def generate(self, requests, on_finished=None):
        self.calls.append([r.messages[-1]["content"] for r in requests])
        out = []
        for r in requests:
            time.sleep(self.pause)
            if self.fail is not None:
                raise self.fail
            text = r.messages[-1]["content"]
            gen = rejected("too long") if text == self.refuse else Generation(f"{self.tag}:{text}", 3, 2)
            out.append(gen)
            self.answered += 1
            if on_finished is not None:
                self.finished_threads.add(threading.current_thread().name)
                on_finished(1, gen.completion_tokens)
        return out


def request(text: str, affinity: str | None = None) -> Request:
    return Request([{"role": "user", "content": text}], Sampling(max_tokens=4), affinity=affinity)


def test_a_conversations_requests_go_to_one_copy_every_call_and_replies_keep_request_order():
    copies = [Copy("a"), Copy("b"), Copy("c")]
    engine = ReplicatedEngine(copies)
    dialogues = [conversation("user", f"task-{i}", "base", 0) for i in range(12)]
    reported = []
    for turn in range(3):
        batch = [request(f"{d}/{turn}", d) for d in dialogues]
        replies = engine.generate(batch, on_finished=lambda n, t: reported.append((threading.current_thread(), n, t)))
        # in request order, each from the copy its dialogue's hash picks
        assert [g.text for g in replies] == [f"{'abc'[copy_of(d, 3)]}:{d}/{turn}" for d in dialogues]
    for k, copy in enumerate(copies):
        served = {text.rsplit("/", 1)[0] for call in copy.calls for text in call}
        assert served == {d for d in dialogues if copy_of(d, 3) == k}
    assert all(copy.calls for copy in copies)  # 12 dialogues reach all three copies
    # progress: every request once, from the calling thread, though the copies answered in threads of their own
    assert sum(n for _, n, _ in reported) == 36 and sum(t for _, _, t in reported) == 72
    assert {thread for thread, _, _ in reported} == {threading.main_thread()}
    assert all(copy.finished_threads and "MainThread" not in copy.finished_threads for copy in copies)


def test_the_copy_of_a_conversation_is_stable_across_processes_and_spreads_conversations_evenly():
    keys = [conversation(f"user{u}", f"task{t}", "base", 0) for u in range(50) for t in range(20)]
    here = [copy_of(k, 4) for k in keys]
    code = (
        "import sys; from personalens.engines.replicated import copy_of; "
        "print(','.join(str(copy_of(k, 4)) for k in sys.stdin.read().split('\\n')))"
    )
    for seed in ("1", "2"):  # Python's own hash() would change with PYTHONHASHSEED
        there = subprocess.run(
            [sys.executable, "-c", code],
            input="\n".join(keys),
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        ).stdout.strip()
        assert there == ",".join(map(str, here))
    # 1,000 conversations over 4 copies: each within 4 standard deviations of 250 (sd 13.7)
    assert all(195 <= n <= 305 for n in Counter(here).values()), Counter(here)


def test_requests_without_affinity_go_round_robin_across_calls():
    copies = [Copy("a"), Copy("b"), Copy("c")]
    engine = ReplicatedEngine(copies)
    first = engine.generate([request(str(i)) for i in range(4)])
    second = engine.generate([request(str(i)) for i in range(4, 6)])
    assert [g.text for g in first + second] == ["a:0", "b:1", "c:2", "a:3", "b:4", "c:5"]
    assert [sum(map(len, c.calls)) for c in copies] == [2, 2, 2]


def test_one_copys_refusal_costs_only_its_request():
    engine = ReplicatedEngine([Copy("a", refuse="2"), Copy("b")])
    replies = engine.generate([request(str(i)) for i in range(4)])
    assert [(g.text, g.error) for g in replies] == [("a:0", None), ("b:1", None), ("", "too long"), ("b:3", None)]


def test_a_copys_failure_fails_the_call_with_its_error_and_stops_the_others():
    line = "the vLLM server of model (copy 1) exited with status 137 (killed by SIGKILL) while the command was using it"
    slow = Copy("a", pause=0.05)
    engine = ReplicatedEngine([slow, Copy("b", fail=ServerExited(line), pause=0.2)])
    started = time.monotonic()
    with pytest.raises(ServerExited, match=r"\(copy 1\) exited with status 137"):
        engine.generate([request(str(i)) for i in range(200)], on_finished=lambda n, t: None)
    assert time.monotonic() - started < 2  # not after the other copy's 100 requests (5 s)
    # the other copy was told to stop at its next finished request, and had stopped when the call ended
    answered = slow.answered
    time.sleep(0.3)
    assert answered == slow.answered < 100


def test_one_copy_per_call_runs_in_the_calling_thread_and_the_first_engines_tokenizer_is_the_models():
    first, second = Copy("a"), Copy("b")
    first.chat_tokenizer, first.max_model_len = "tokenizer", 2048
    engine = ReplicatedEngine([first, second])
    assert (engine.chat_tokenizer, engine.max_model_len, engine.name) == ("tokenizer", 2048, "model")
    d = next(conversation("u", i) for i in range(100) if copy_of(conversation("u", i), 2) == 1)
    replies = engine.generate([request("x", d), request("y", d)], on_finished=lambda n, t: None)
    assert [g.text for g in replies] == ["b:x", "b:y"] and second.finished_threads == {"MainThread"}
    assert engine.generate([]) == [] and first.calls == []
    assert ReplicatedEngine([second]).chat_tokenizer is None  # server copies: the messages are sent


def test_concurrent_calls_get_their_own_replies_and_an_interrupted_one_stops_only_its_parts():
    """Two calls at once (lockstep cohorts) over copies that take concurrent calls: each gets its own
    replies in its order, reported from its own thread; one interrupted by its caller stops its own
    parts, and the other's are answered in full."""
    copies = [Copy("a", pause=0.005), Copy("b", pause=0.005)]
    assert not ReplicatedEngine(copies).joins_calls
    for copy in copies:
        copy.joins_calls = True
    engine = ReplicatedEngine(copies)
    assert engine.joins_calls and not ReplicatedEngine([*copies, Copy("c")]).joins_calls

    class Interrupted(Exception):
        pass

    results, reported = {}, {"x": [], "y": []}

    def run(tag: str, interrupt_at: int | None) -> None:
        def finished(n: int, tokens: int) -> None:
            reported[tag].append(threading.current_thread().name)
            if len(reported[tag]) == interrupt_at:
                raise Interrupted

        try:
            results[tag] = engine.generate([request(f"{tag}{i}") for i in range(60)], finished)
        except Interrupted as err:
            results[tag] = err

    threads = [threading.Thread(target=run, args=a, name=a[0]) for a in (("x", 3), ("y", None))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    replies = results["y"]
    assert [g.text.split(":", 1)[1] for g in replies] == [f"y{i}" for i in range(60)]
    assert reported["y"] == ["y"] * 60 and set(reported["x"]) == {"x"}
    assert isinstance(results["x"], Interrupted)
    answered_x = sum(copy.answered for copy in copies) - 60
    assert answered_x < 30  # its parts stopped at their next finished request, not after 60 (0.3 s)


@pytest.mark.vllm
def test_the_in_process_engine_answers_its_part_from_a_thread_and_stops_when_another_copy_fails(engine):
    """As on a GPU node: the model's own engine in this process, its copy a server (scripted here)."""
    from engine_fixtures import chat

    keys = [conversation("user", i) for i in range(50)]
    own, other = ([k for k in keys if copy_of(k, 2) == c][:3] for c in (0, 1))
    replicated = ReplicatedEngine([engine, Copy("b")])
    assert (replicated.chat_tokenizer, replicated.max_model_len) == (engine.chat_tokenizer, engine.max_model_len)
    batch = [
        dataclasses.replace(chat(f"Name a colour ({i}).", max_tokens=4), affinity=k) for i, k in enumerate(own + other)
    ]
    reported = []
    replies = replicated.generate(batch, on_finished=lambda n, t: reported.append(threading.current_thread()))
    assert all(g.error is None and g.completion_tokens > 0 for g in replies[:3])
    assert [g.text for g in replies[3:]] == [f"b:Name a colour ({i})." for i in (3, 4, 5)]
    assert reported == [threading.main_thread()] * 6

    # the copy fails at once: the engine stops at its first finished request (16 tokens), aborts the
    # two of 1,500 tokens, and answers the next call
    failing = ReplicatedEngine([engine, Copy("b", fail=ServerExited("the vLLM server of m (copy 1) exited"))])
    story = [
        dataclasses.replace(chat("Tell me a long story.", max_tokens=n, min_tokens=n), affinity=own[i])
        for i, n in enumerate((16, 1500, 1500))
    ]
    started = time.monotonic()
    with pytest.raises(ServerExited, match=r"\(copy 1\) exited"):
        failing.generate([*story, dataclasses.replace(chat("x"), affinity=other[0])], on_finished=lambda n, t: None)
    assert time.monotonic() - started < 8  # 1,500 tokens take 15 s or more on a 2-core CPU
    assert not engine._llm.llm_engine.has_unfinished_requests()
    (again,) = engine.generate([chat("Say hi.", max_tokens=2)])
    assert again.error is None and again.completion_tokens > 0
