"""A `generate` stopped mid-dialogue resumes from the turns it stored (store/turns.py): through the
`generate` command with a deterministic scripted engine that takes prompts as token ids from the
embedded model's real tokenizer, stopped by a `Stop` between steps (lockstep and continuous) and by
SIGKILL in the middle of a step, and a `judge` stopped between part files (tests/test_generate_vllm.py
stops the real vLLM engine with SIGTERM, tests/test_slurm.py a real SLURM job with its warning
signal)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest
from cli_helpers import REPO, read_rows
from test_fidelity import config

from personalens.config import run as R
from personalens.engines.base import Generation
from personalens.engines.chat.token_ids import ChatTokenizer
from personalens.engines.models.config import ModelConfig
from personalens.engines.stop import RESUMABLE, Stop, Stopped
from personalens.errors import PersonalensError
from personalens.report.compose import continued_by_shard
from personalens.simulate import command as simulate_command
from personalens.store import TURNS_SCHEMA, PartWriter, stored_turns

# both users' scenarios, dialogues of up to 4 and 6 rounds: the stops land mid-dialogue
OVERRIDES = ("data.users=0-1", "protocol.max_rounds_sd=4", "protocol.max_rounds_md=6")
KEY = ("user_id", "task_id", "setting", "trial")


class Seeded:
    """Replies made from each request's seed alone, so that a run gives the same dialogues however
    often it is stopped; a user agent's reply says TERMINATE for one seed in four. Records what it
    was sent; requests a stop during call `stop_at`, or dies in the middle of call `die_at`. Without a
    tokenizer it is sent chat messages instead of token ids."""

    name = "seeded"
    max_model_len = 1_000_000

    def __init__(self, tokenizer: ChatTokenizer | None, stop: Stop | None = None, stop_at: int = 0, die_at: int = 0):
        self.chat_tokenizer = tokenizer
        self.stop, self.stop_at, self.die_at = stop, stop_at, die_at
        self.calls = 0
        self.sent: list[tuple[str, int, tuple[int, ...]]] = []  # (dialogue, seed, prompt ids)

    def generate(self, requests, on_finished=None):
        self.calls += 1
        if self.calls == self.die_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.calls == self.stop_at:
            self.stop.request(Stopped("stopped by the test", RESUMABLE))
        out = []
        for r in requests:
            assert (r.prompt_ids is None) == (self.chat_tokenizer is None)
            self.sent.append((r.affinity, r.sampling.seed, tuple(r.prompt_ids or ())))
            user = r.messages[-1]["content"].startswith("<user_profile>")
            text = f"reply {r.sampling.seed % 1000} of the {'user' if user else 'assistant'}"
            out.append(Generation(text + (" TERMINATE" if user and r.sampling.seed % 4 == 0 else ""), 10, 3))
        return out


@pytest.fixture(scope="module")
def tokenizer() -> ChatTokenizer:
    return ChatTokenizer.load(ModelConfig(name="SmolLM2-135M-Instruct"))


@pytest.fixture(scope="module")
def never_stopped(tokenizer, tmp_path_factory) -> tuple[list[dict], Seeded]:
    out = tmp_path_factory.mktemp("never") / "run"
    engine = Seeded(tokenizer)
    assert simulate_command.generate(config(*OVERRIDES, f"run.out_dir={out}"), engines(engine)) == 0
    return by_key(read_rows(out / "dialogues")), engine


def engines(engine):
    return lambda: {"user_agent": engine, "assistant": engine}


def by_key(rows: list[dict]) -> dict[tuple, dict]:
    keyed = {tuple(r[c] for c in KEY): r for r in rows}
    assert len(keyed) == len(rows), "a dialogue written twice"
    return keyed


def same_dialogues(got: dict[tuple, dict], want: dict[tuple, dict]) -> None:
    assert got.keys() == want.keys()
    fields = ("turns", "rounds", "ended", "error", "opening_terminate", "seed")
    for key, row in want.items():
        assert {f: got[key][f] for f in fields} == {f: row[f] for f in fields}, key


def stored(out: Path) -> list[dict]:
    rows = read_rows(out / "turns")
    assert max(Counter((*(r[c] for c in KEY), r["index"]) for r in rows).values()) == 1, "a turn stored twice"
    return rows


def test_a_stopped_generate_resumes_its_dialogues_from_their_stored_turns(tokenizer, never_stopped, tmp_path):
    want, uninterrupted = never_stopped
    out = tmp_path / "run"
    cfg = config(*OVERRIDES, f"run.out_dir={out}")
    stop = Stop()
    first = Seeded(tokenizer, stop, stop_at=5)
    with pytest.raises(Stopped):
        simulate_command.generate(cfg, engines(first), stop)
    # the scripted engine does not check the stop inside a call: the call that asked for it returned its
    # replies, so its step was stored, and the run stopped after it
    assert first.calls == 5
    turns = stored(out)
    assert len(turns) == len(first.sent)  # every turn it simulated is stored, once
    written = read_rows(out / "dialogues")
    assert written and len(written) < len(want)  # some dialogues ended, the rest are partly stored
    partly = stored_turns(out / "turns" / "shard-000-of-001", skip=by_key(written).keys())
    assert partly
    # among them a dialogue whose user agent said TERMINATE in the last step: the word is gone from
    # its stored text, and the resumed run must still give it exactly one more assistant reply
    assert any(chain[-1]["said_terminate"] and chain[-1]["index"] > 0 for chain in partly.values())

    second = Seeded(tokenizer)
    assert simulate_command.generate(cfg, engines(second)) == 0
    got = by_key(read_rows(out / "dialogues"))
    same_dialogues(got, want)
    # every request of the never-stopped run was sent once, with its seed and its prompt's token ids
    assert Counter(first.sent + second.sent) == Counter(uninterrupted.sent)
    # each turn is stored once, by the invocation that simulated it, and the final rows hold them
    turns = stored(out)
    sessions = sorted({t["session_started"] for t in turns})
    assert len(sessions) == 2 and Counter(t["session_started"] for t in turns)[sessions[0]] == len(first.sent)
    for key, chain in stored_turns(out / "turns" / "shard-000-of-001").items():
        assert [t["text"] for t in chain] == [t["text"] for t in got[key]["turns"]]
    # the report's provenance note counts the dialogues continued across the two invocations
    assert continued_by_shard(out) == {"shard-000-of-001": len(partly)}

    # the command again: nothing left, nothing stored or written twice
    third = Seeded(tokenizer)
    assert simulate_command.generate(cfg, engines(third)) == 0 and third.sent == []
    assert len(stored(out)) == len(turns)


KILLED = """
import sys
sys.path.insert(0, {tests!r})
from test_resume import OVERRIDES, Seeded, engines
from test_fidelity import config
from personalens.simulate import command
engine = Seeded(None, die_at={die_at})  # chat messages: the replies depend on the seeds alone
command.generate(config(*OVERRIDES, "run.out_dir={out}"), engines(engine))
"""


def test_a_generate_killed_in_the_middle_of_a_step_loses_only_that_step(tokenizer, never_stopped, tmp_path):
    want, uninterrupted = never_stopped
    out = tmp_path / "run"
    script = textwrap.dedent(KILLED.format(tests=str(REPO / "tests"), die_at=5, out=out))
    started = time.monotonic()
    killed = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert time.monotonic() - started < 300
    before = stored(out)
    steps = sorted({t["index"] for t in before})
    assert steps == [0, 1, 2, 3]  # the four steps before the kill, none of the fifth

    resumed = Seeded(tokenizer)
    assert simulate_command.generate(config(*OVERRIDES, f"run.out_dir={out}"), engines(resumed)) == 0
    got = by_key(read_rows(out / "dialogues"))
    same_dialogues(got, want)
    # the resumed run sent the killed step again and everything after it, nothing stored before it
    assert Counter(resumed.sent) <= Counter(uninterrupted.sent)
    assert (Counter(uninterrupted.sent) - Counter(resumed.sent)).total() == len(before)
    # the turns stored before the kill are the final dialogues' turns, unchanged
    for t in before:
        turn = got[tuple(t[c] for c in KEY)]["turns"][t["index"]]
        assert (turn["role"], turn["text"], turn["completion_tokens"]) == (t["role"], t["text"], t["completion_tokens"])
    assert len(stored(out)) == sum(len(r["turns"]) for r in got.values())


class SeededSubmitting(Seeded):
    """`Seeded` taking requests while it runs (scheduling=continuous): each `finished` returns up to
    `per_step` of the replies submitted so far, and requests a stop on its `stop_at`-th call."""

    def __init__(self, tokenizer: ChatTokenizer, stop: Stop | None = None, stop_at: int = 0, per_step: int = 5):
        super().__init__(tokenizer)
        self.stop, self.stop_at, self.per_step = stop, stop_at, per_step
        self.pending: list[tuple[str, Generation]] = []
        self.steps = 0

    def submit(self, requests):
        ids = [str(len(self.sent) + i) for i in range(len(requests))]
        self.pending += zip(ids, self.generate(requests))
        return ids

    def finished(self):
        self.steps += 1
        if self.steps == self.stop_at:
            self.stop.request(Stopped("stopped by the test", RESUMABLE))
        done, self.pending = self.pending[: self.per_step], self.pending[self.per_step :]
        return done

    def idle(self):
        return not self.pending


def test_a_stopped_continuous_generate_resumes_from_the_turns_it_stored(tokenizer, never_stopped, tmp_path):
    want, _ = never_stopped  # the replies depend on the seeds alone: continuous gives lockstep's dialogues
    out = tmp_path / "run"
    cfg = config(*OVERRIDES, "scheduling=continuous", f"run.out_dir={out}")
    stop = Stop()
    first = SeededSubmitting(tokenizer, stop, stop_at=12)
    with pytest.raises(Stopped):
        simulate_command.generate(cfg, engines(first), stop)
    answered = len(first.sent) - len(first.pending)  # the replies the engine returned before the stop
    assert 0 < len(stored(out)) == answered  # all of them stored, the ones still running not
    second = SeededSubmitting(tokenizer)
    assert simulate_command.generate(cfg, engines(second)) == 0
    same_dialogues(by_key(read_rows(out / "dialogues")), want)
    assert len(stored(out)) == sum(len(r["turns"]) for r in want.values())


def test_stored_turns_changed_by_hand_are_refused_with_the_dialogue_named(tokenizer, tmp_path):
    out = tmp_path / "run"
    cfg = config(*OVERRIDES, f"run.out_dir={out}")
    row = {"run_id": "default", "user_id": "user0", "setting": "base", "trial": 0, "role": "user", "text": "hi",
           "prompt_tokens": 1, "completion_tokens": 1, "said_terminate": False, "session_started": 1.0}  # fmt: skip
    task_id = R.scenarios(cfg)[0].task.task_id
    PartWriter(out / "turns" / "shard-000-of-001", TURNS_SCHEMA).write(
        [{**row, "task_id": task_id, "index": i} for i in (0, 1)]  # two user turns in a row
    )
    engine = Seeded(tokenizer)
    with pytest.raises(PersonalensError, match=rf"cannot continue dialogue \('user0', '{task_id}'.*delete that shard"):
        simulate_command.generate(cfg, engines(engine))
    assert engine.sent == [] and read_rows(out / "dialogues") == []


def test_a_stopped_judge_keeps_its_written_part_files_and_resumes(tmp_path):
    from test_fidelity import PromptRecorder

    from personalens.judge import command as judge_command

    out = tmp_path / "run"
    cfg = config(f"run.out_dir={out}", "judging.chunk=4")
    recorder = PromptRecorder()
    assert simulate_command.generate(cfg, lambda: {"user_agent": recorder, "assistant": recorder}) == 0

    class Stopping(PromptRecorder):
        def generate(self, requests, on_finished=None):
            if len(self.requests) == 8:  # during the third call
                stop.request(Stopped("stopped by the test", RESUMABLE))
            return super().generate(requests, on_finished)

    stop, first = Stop(), Stopping()
    with pytest.raises(Stopped):
        judge_command.judge(cfg, lambda: {"judge": first}, stop)
    assert len(first.requests) == 12 and len(read_rows(out / "judgments")) == 12  # the call in flight written
    second = PromptRecorder()
    assert judge_command.judge(cfg, lambda: {"judge": second}) == 0
    judged = read_rows(out / "judgments")
    keys = Counter((*(j[c] for c in KEY), j["dimension"], j["speaker"], j["turn"]) for j in judged)
    assert max(keys.values()) == 1 and len(judged) == 12 + len(second.requests)
