"""The in-process copy of a model capped by the rule that caps its server copies (engines/flow.py):
the engine's queueing loop with vLLM's side scripted (the rule itself: tests/test_server_flow.py;
against a real server: tests/test_server.py), and the factory marking the copy."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from test_engine_layout import Recorder, conf, loader

from personalens.engines.base import Generation, Request, Sampling
from personalens.engines.flow import InFlight, PromptSizes, ReplySizes
from personalens.engines.placement.gpus import simulated
from personalens.engines.replicated import ReplicatedEngine
from personalens.engines.stop import Stop
from personalens.engines.vllm.local import TurnLock, VllmEngine


def scripted(kv_tokens: int | None, capped: bool, reply_tokens: int = 100) -> VllmEngine:
    """A VllmEngine whose vLLM side is scripted: each step finishes the oldest queued request with a
    reply of `reply_tokens` that echoes its prompt, and the most ever queued at once is kept."""
    engine = object.__new__(VllmEngine)
    engine.name, engine.kv_tokens, engine.max_num_seqs, engine.capped = "m", kv_tokens, 256, capped
    engine._stop, engine._sizes, engine._replies = Stop(), PromptSizes(), ReplySizes()
    engine._lock, engine._running, engine._done, engine._in_flight = TurnLock(), {}, {}, InFlight()
    queue: list[tuple[str, str]] = []
    engine.most = 0

    def enqueue(request):
        queue.append((f"r{len(engine.order)}", request.messages[0]["content"]))
        engine.order.append(request.messages[0]["content"])
        engine.most = max(engine.most, len(queue))
        return queue[-1][0], None

    def step():
        request_id, prompt = queue.pop(0)
        return [(request_id, Generation(prompt, prompt_tokens=100, completion_tokens=reply_tokens))]

    engine.order = []
    engine._queue, engine._stepped, engine._idle = enqueue, step, lambda: not queue
    return engine


def requests(n: int, tag: str = "") -> list[Request]:
    # 300 characters: 100 tokens at the 3 characters a token counted before any reply
    return [
        Request([{"role": "user", "content": f"{tag}{i:03d}".ljust(300, "x")}], Sampling(max_tokens=900))
        for i in range(n)
    ]


def test_a_capped_engine_keeps_what_its_cache_holds_in_flight_and_learns_its_replies():
    engine = scripted(10_000, capped=True)
    done = []
    replies = engine.generate(requests(25), lambda n, tokens: done.append(n))
    # 10,000 tokens over 100 prompt + 900 expected reply tokens each: 10 at a time, the next as one ends
    assert engine.most == 10 and len(replies) == 25 and sum(done) == 25
    assert engine.order == [f"{i:03d}".ljust(300, "x") for i in range(25)]  # in the call's order
    # the replies took 100 of their 900 tokens: the next call keeps 10,000 // 200 = 50 (all 25) in flight
    engine.most = 0
    engine.generate(requests(25))
    assert engine.most == 25


def test_an_engine_not_capped_queues_every_request_and_an_unknown_cache_gives_max_num_seqs():
    free = scripted(10_000, capped=False)
    free.generate(requests(25))
    assert free.most == 25
    unknown = scripted(None, capped=True)
    unknown.max_num_seqs = 7
    unknown.generate(requests(25))
    assert unknown.most == 7


def test_concurrent_calls_share_the_cap_and_each_gets_its_own_replies_in_its_order():
    """Two calls at once on a capped engine (lockstep cohorts): 10 in flight for the engine, not 10
    for each; each call's replies are its own, in its order, reported from its own thread."""
    engine = scripted(10_000, capped=True, reply_tokens=900)  # replies as long as expected: 10 at a time
    step = engine._stepped
    engine._stepped = lambda: (time.sleep(0.005), step())[1]  # a step takes time, as vLLM's does
    calls = {"a": requests(15, "a"), "b": requests(15, "b")}
    results, threads = {}, {}
    both = threading.Barrier(2)

    def run(tag):
        reported = []

        def finished(n, tokens):
            reported.append(threading.current_thread().name)

        both.wait(timeout=10)  # the two calls start together
        results[tag] = (engine.generate(calls[tag], finished), reported)

    for tag in calls:
        threads[tag] = threading.Thread(target=run, args=(tag,), name=tag)
        threads[tag].start()
    for thread in threads.values():
        thread.join(timeout=30)
    for tag, sent in calls.items():
        replies, reported = results[tag]
        assert [g.text for g in replies] == [r.messages[0]["content"] for r in sent]
        assert reported == [tag] * 15
    # never more than the cap at once; once the first call filled it, the two calls take turns with
    # what finished requests free (first come, first served: engines/flow.py)
    first = engine.order[0][0]
    assert engine.most == 10 and [o[0] for o in engine.order[:10]] == [first] * 10
    assert [o[0] for o in engine.order[10:20]] == [first, "b" if first == "a" else "a"] * 5
    assert engine._in_flight.held == 0 and not engine._running and not engine._done


def test_the_engines_lock_goes_to_its_threads_in_the_order_they_asked():
    """A call that steps again and again releases the engine's lock and asks for it at once: the
    calls that waited for it go first (with a plain Lock the releasing thread may keep it)."""
    lock, order = TurnLock(), []

    def enter(name: str) -> None:
        with lock:
            order.append(name)

    threads = []
    with lock:
        for name in ("b", "c"):
            threads.append(threading.Thread(target=enter, args=(name,)))
            threads[-1].start()
            while lock._next != len(threads) + 1:  # it waits for its turn
                time.sleep(0.001)
    enter("a")
    for thread in threads:
        thread.join(timeout=10)
    assert order == ["b", "c", "a"]


def test_the_factory_caps_the_in_process_copy_beside_server_copies(tmp_path):
    """A 70B judge alone on 8 x 80 GB: in process on GPUs 0-3, a copy in a server on 4-7; the in-process
    engine is capped, a model without copies is not."""

    class Built(Recorder):
        def build(self, config):
            self.built.append(config)
            return SimpleNamespace(name=config.name, config=config, capped=False)

    judge = loader({"judge": conf(tmp_path, "llama31_70b")}, tmp_path, simulated(8, 80), Built())()["judge"]
    assert isinstance(judge, ReplicatedEngine) and [e.capped for e in judge.engines] == [True, False]
    alone = {"judge": {**conf(tmp_path, "llama31_70b"), "replicas": 1}}
    assert loader(alone, tmp_path, simulated(8, 80), Built())()["judge"].capped is False
