"""The command's stop (engines/stop.py) at each stage of a run: while the engines load, in the middle
of a batched call, between two lockstep steps and while the judge runs. Each time the command ends
with `Stopped` (its exit status), what it finished is written whole, and running it again finishes
the work with every scenario and judgment present exactly once. The engines are scripted here and
check the stop as every engine does before and while it answers; the real in-process engine's check
in the middle of a call is the last test, the servers' in tests/test_managed_servers.py."""

from __future__ import annotations

import signal
import threading

import pytest
from cli_helpers import read_rows
from test_fidelity import PromptRecorder, config

from personalens.config import run as R
from personalens.engines.factory import EngineLoader
from personalens.engines.stop import Stop, Stopped
from personalens.judge import command as judge_command
from personalens.simulate import command as simulate_command
from personalens.store.schema import JUDGMENT_KEY, KEY_COLUMNS

SIGTERM = Stopped("stopped by SIGTERM", 128 + signal.SIGTERM)


class Checking(PromptRecorder):
    """Answers as PromptRecorder does, checking the command's stop before each call and after each
    answered request (as the real engines do at each step); `request_at` asks for the stop in the
    middle of that call (after its first request) or, with `after_call`, once that call returned."""

    def __init__(self, stop: Stop, request_at: int | None = None, after_call: bool = False):
        super().__init__()
        self.stop, self.request_at, self.after_call, self.calls = stop, request_at, after_call, 0

    def generate(self, requests, on_finished=None):
        self.calls += 1
        self.stop.check()
        out = []
        for i, request in enumerate(requests):
            if self.calls == self.request_at and not self.after_call and i == 1:
                self.stop.request(SIGTERM)
            self.stop.check()
            out += super().generate([request], on_finished)
        if self.calls == self.request_at and self.after_call:
            self.stop.request(SIGTERM)
        return out


def loader(cfg, stop: Stop, engine: Checking, stop_while_loading: bool = False) -> EngineLoader:
    """The command's engine loader on no GPU, building the scripted engine for every model."""

    def build(model_config):
        if stop_while_loading:
            stop.request(SIGTERM)  # a signal that arrives while a model loads
        return engine

    roles = ("user_agent", "assistant", "judge")
    return EngineLoader({r: cfg[r] for r in roles}, cfg.run.out_dir, stop=stop, gpus=lambda: None, build=build)


def dialogue_keys(out) -> list[tuple]:
    return sorted(tuple(d[c] for c in KEY_COLUMNS) for d in read_rows(out / "dialogues"))


@pytest.mark.parametrize("stage", ["loading", "mid-call", "between steps"])
def test_generate_stopped_at_each_stage_keeps_what_it_finished_and_a_rerun_completes_it(tmp_path, stage):
    out = tmp_path / "run"
    cfg = config(f"run.out_dir={out}")
    expected = len(R.scenarios(cfg))
    stop = Stop()
    engine = Checking(stop, request_at=None if stage == "loading" else 3, after_call=stage == "between steps")
    with pytest.raises(Stopped) as stopped:
        simulate_command.generate(cfg, loader(cfg, stop, engine, stop_while_loading=stage == "loading"))
    assert stopped.value.exit_status == 143
    if stage == "loading":
        assert engine.calls == 0  # no model was asked anything
    else:
        assert engine.calls == (3 if stage == "mid-call" else 4)  # the next call saw the stop at once
    written = dialogue_keys(out) if (out / "dialogues").exists() else []
    assert len(written) < expected and len(set(written)) == len(written)
    # the steps finished before the stop are on record, whole (one trace row per finished call)
    trace = read_rows(out / "trace") if (out / "trace").exists() else []
    assert len(trace) == {"loading": 0, "mid-call": 2, "between steps": 3}[stage]

    stop = Stop()
    again = Checking(stop)
    assert simulate_command.generate(cfg, loader(cfg, stop, again)) == 0
    keys = dialogue_keys(out)
    assert len(keys) == len(set(keys)) == expected
    assert set(written) <= set(keys)


def test_a_judge_stopped_mid_run_keeps_its_judgments_and_a_rerun_adds_only_the_rest(tmp_path):
    out = tmp_path / "run"
    cfg = config(f"run.out_dir={out}", "judging.chunk=4")
    scripted = PromptRecorder()
    assert simulate_command.generate(cfg, lambda: {"user_agent": scripted, "assistant": scripted}) == 0
    stop = Stop()
    with pytest.raises(Stopped):
        judge_command.judge(cfg, loader(cfg, stop, Checking(stop, request_at=2)))
    kept = read_rows(out / "judgments")
    stop = Stop()
    assert judge_command.judge(cfg, loader(cfg, stop, Checking(stop))) == 0
    judgments = read_rows(out / "judgments")
    keys = [tuple(j[c] for c in JUDGMENT_KEY) for j in judgments]
    assert len(keys) == len(set(keys)) and len(kept) < len(judgments)


@pytest.mark.vllm
def test_the_in_process_engine_stops_mid_call_and_aborts_what_it_had_queued(engine, monkeypatch):
    """A stop requested while the real engine answers a batch (here from another thread once the first
    request has finished) is raised at its next step, and nothing of the call stays queued."""
    from engine_fixtures import chat

    stop = Stop()
    monkeypatch.setattr(engine, "_stop", stop)
    finished = []

    def on_finished(n: int, tokens: int) -> None:
        finished.append(n)
        threading.Thread(target=stop.request, args=(SIGTERM,)).start()

    batch = [
        chat("Say hi.", max_tokens=2),
        *(chat("Tell me a long story.", max_tokens=n, min_tokens=n) for n in (800,) * 2),
    ]
    with pytest.raises(Stopped):
        engine.generate(batch, on_finished=on_finished)
    assert finished and len(finished) < len(batch)
    assert not engine._llm.llm_engine.has_unfinished_requests()
    monkeypatch.undo()
    (again,) = engine.generate([chat("Say hi.", max_tokens=2)])
    assert again.error is None and again.completion_tokens > 0
