"""A failure inside one engine step costs only its request: a finished reply that cannot be read is
answered as refused while the step's other replies, and the other calls joined to the engine, go on
(the real in-process engine on the embedded model); and leaving `EngineWorkers` never waits forever
on an engine call that does not end."""

from __future__ import annotations

import threading
import time

import pytest
from engine_fixtures import chat

from personalens.simulate import workers as W


@pytest.mark.vllm
def test_a_reply_that_cannot_be_read_is_refused_alone_while_another_call_waits(engine, monkeypatch):
    split, planted = engine._split, []

    def failing(out):
        # the first 3-token reply read: its two requests finish in the same step, beside the other call's
        if len(out.outputs[0].token_ids) == 3 and not planted:
            planted.append(out.request_id)
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "planted by the test")
        return split(out)

    monkeypatch.setattr(engine, "_split", failing)
    results, errors = {}, {}
    waiting = [chat(f"Count to ten, {i}.", max_tokens=24, min_tokens=24) for i in range(2)]
    broken = [chat(f"Name a colour, {i}.", max_tokens=3, min_tokens=3) for i in range(2)]

    def call(tag, requests):
        try:
            results[tag] = engine.generate(requests)
        except BaseException as err:  # noqa: BLE001 - reported by the assertions below
            errors[tag] = err

    threads = [
        threading.Thread(target=call, args=("waiting", waiting)),
        threading.Thread(target=call, args=("broken", broken)),
    ]
    threads[0].start()
    deadline = time.monotonic() + 60
    while not engine._running:  # the waiting call's requests are in vLLM
        assert time.monotonic() < deadline
        time.sleep(0.005)
    threads[1].start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a call never returned"
    assert errors == {} and len(planted) == 1
    assert [(g.completion_tokens, g.error) for g in results["waiting"]] == [(24, None), (24, None)]
    refused = [g for g in results["broken"] if g.error is not None]
    answered = [g for g in results["broken"] if g.error is None]
    assert len(refused) == 1 and "could not be read: UnicodeDecodeError" in refused[0].error
    assert len(answered) == 1 and answered[0].completion_tokens == 3
    assert not engine._running and not engine._done and not engine._llm.llm_engine.has_unfinished_requests()


def test_leaving_the_workers_does_not_wait_forever_on_a_call_that_never_ends(monkeypatch):
    monkeypatch.setattr(W, "JOIN_S", 0.5)

    class Joining:
        joins_calls = True

        def __init__(self, name):
            self.name = name

    never = threading.Event()
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="failed"):
        with W.EngineWorkers([Joining("a"), Joining("b")]) as workers:
            workers.submit(Joining("a"), "stuck", never.wait)  # an engine call that never returns
            workers.submit(Joining("b"), "failing", lambda: (_ for _ in ()).throw(RuntimeError("failed")))
            workers.next()
    assert time.monotonic() - started < 10
    never.set()
