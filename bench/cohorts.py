"""Lockstep cohorts against strict alternation, timed as on GPUs: the real `personalens generate`
(config, prompts, Parquet) drives engines whose calls take the time the planner's GPU model gives
them, each engine on its own "GPUs" in a thread of its own, sleeping for that time.

    python bench/cohorts.py                  # paper protocol, the sample's 34 scenarios x 30 trials
    python bench/cohorts.py --trials 8 --scale 0.02
    python bench/cohorts.py --tiny           # seconds (tests/test_cohorts_bench.py)

A call's time is personalens/plan/engine_model.py's: its requests replayed through the simplified
vLLM (admission up to `max_num_seqs` and the KV cache, chunked prefill, a prefix cache that keeps
each dialogue's last sequence per role), each step overhead + max(memory, compute) from the GPU's
published figures (plan/gpu_model.py's H100 SXM: 3.35 TB/s, 989 TFLOPS, at the planner's
efficiencies). The engine keeps its model state across calls, so a history evicted from the cache
is prefilled again. A call sleeps `scale` x its modelled time, reporting each request as it finishes
at its modelled time; a run's modelled seconds are its wall seconds / `scale`, which also counts the
pipeline's own CPU time (rendering, Parquet), scaled up by 1 / `scale` (printed beside, with each
engine's modelled seconds of calls, which no CPU time or load enters).

Replies are as long as bench/stragglers.py's SyntheticRow assumes (no calibration of the paper's
models exists here): the assistant's log-normal around a median of 200 tokens (sigma 0.7, capped at
the protocol's 800), the user agent's 15-60 tokens, and a user reply says TERMINATE with probability
1/4 (4 rounds on average, capped at 20 and 30). Each reply is drawn from its request's seed, so every
run of a layout makes the same dialogues whatever the cohorts. The paper protocol's samplings tell
the roles apart (the user agent samples at temperature 0.5, the assistant greedily). Token counts
are characters / 4. `--balanced` draws the user agent's replies as the assistant's, so that the two
roles have about equal work.

Layouts: two 8B engines on one H100 each ("equal"); the same with the assistant, whose role has the
more work, on two H100s, a copy on each, the run's replicated engine splitting its requests by
dialogue ("equal, assistant x2": copies by work); a 70B user agent on 4 H100s (tensor parallel)
with an 8B assistant on one ("70B + 8B"); one 8B engine for both roles ("shared"). Each runs with
`lockstep.cohorts=1` (strict alternation) and `auto` (2 for distinct engines, 1 when shared), and
the shared engine also with 2 forced; each of those with every dialogue in flight
(`lockstep.in_flight=all`) and, with `--in-flight all,auto`, as many as the engines' KV caches keep
(simulate/window.py, sized from each engine model's `kv_tokens` and `max_num_seqs`, its
`max_model_len` 65,536 before the first dialogue ends). Each row says the share of prompt tokens
the engines prefilled (the rest served from their prefix caches). Results: docs/performance.md.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from personalens.engines.base import Engine, Generation, OnFinished, Request  # noqa: E402
from personalens.engines.chat.token_ids import common_prefix  # noqa: E402
from personalens.engines.placement.inflight import Cache  # noqa: E402
from personalens.engines.replicated import ReplicatedEngine  # noqa: E402
from personalens.plan.engine_model import Engine as ModelledEngine  # noqa: E402
from personalens.plan.engine_model import ModelRequest, Turn  # noqa: E402
from personalens.plan.gpu_model import BANDWIDTH_EFFICIENCY, FLOPS_EFFICIENCY, GPUS, GpuModel  # noqa: E402

CHARS_PER_TOKEN = 4
SHARED_PREFIX = 400  # tokens every dialogue's prompts share (bench/stragglers.py's assumption)
JUMP = 16  # the most decode-only steps the driver models at once (a request submitted meanwhile waits)
MAX_MODEL_LEN = 65_536  # the configs' (conf/model/llama31_8b.yaml)
H100 = GPUS["h100"]

# Llama-3.1-8B-Instruct on one H100: engine_model's defaults (its published config; 400,000 KV tokens)
LLAMA_8B = replace(GpuModel(), bandwidth=H100.bandwidth * BANDWIDTH_EFFICIENCY, flops=H100.flops * FLOPS_EFFICIENCY)
# Llama-3.1-70B-Instruct (published config: 70.6e9 parameters, 80 layers, hidden 8192, 8 KV heads of
# 128) in bf16 on 4 H100s, tensor parallel (its all-reduces left out: tp at 1, as bench/results/cohorts.md was modelled);
# KV cache assumed: 4 x 0.9 x 80 GB - 141 GB of weights - 8 GB of activations, / 320 KiB a token
LLAMA_70B_TP4 = GpuModel(
    params=70.6e9,
    layers=80,
    hidden=8192,
    kv_bytes_per_token=2 * 80 * 8 * 128 * 2,
    bandwidth=4 * H100.bandwidth * BANDWIDTH_EFFICIENCY,
    flops=4 * H100.flops * FLOPS_EFFICIENCY,
    kv_tokens=int((4 * 0.9 * 80e9 - 141e9 - 8e9) / (2 * 80 * 8 * 128 * 2)),
    max_num_seqs=256,
)


@dataclass(frozen=True)
class Replies:
    """How long replies are, and how often the user agent ends (SyntheticRow's assumptions)."""

    assistant_median: float = 200.0
    assistant_sigma: float = 0.7
    user: tuple[int, int] = (15, 60)
    terminate: float = 0.25
    cap: int = 800
    balanced: bool = False  # the user agent's replies drawn as the assistant's (equal work per turn)

    def reply(self, request: Request) -> tuple[int, bool]:
        """Tokens of the reply to `request`, and whether it says TERMINATE, from its seed."""
        rng = random.Random(request.sampling.seed)
        cap = min(self.cap, request.sampling.max_tokens)
        long = min(cap, max(1, int(rng.lognormvariate(0, self.assistant_sigma) * self.assistant_median)))
        if user_turn(request):
            return (long if self.balanced else min(cap, rng.randint(*self.user))), rng.random() < self.terminate
        return long, False


def user_turn(request: Request) -> bool:
    return request.sampling.temperature > 0  # the paper protocol: only the user agent samples


def tokens(text: str) -> int:
    return max(1, len(text) // CHARS_PER_TOKEN)


class TimedEngine:
    """An engine whose calls take the modelled time of `gpu`, scaled by `scale`, in wall time: a
    driver thread steps the engine model and sleeps until each step's modelled end, then reports the
    requests it finished. With `joins`, calls run at once and a call's requests join the running
    batch at the model's next step (`joins_calls`, engines/base.py); without, one call at a time."""

    max_model_len = MAX_MODEL_LEN  # the prior of lockstep.in_flight=auto; no prompt comes near it

    def __init__(self, name: str, gpu: GpuModel, replies: Replies, scale: float, joins: bool = False):
        self.name, self.gpu, self.replies, self.scale = name, gpu, replies, scale
        self.joins_calls = joins
        self.model = ModelledEngine(gpu, SHARED_PREFIX)
        self.modelled = 0.0  # the modelled seconds in which it was answering
        self._ids: dict[tuple[str | None, bool], int] = {}
        self._last: dict[tuple[str | None, bool], str] = {}  # per (dialogue, role): last prompt and reply
        self._one_call = threading.Lock()  # without `joins`: calls never overlap
        self._changed = threading.Condition()  # guards the model; notified on submissions and finishes
        self._reported: set[int] = set()  # ids of finished requests whose modelled end has passed
        self._begun = time.monotonic()  # wall time of the model's second 0
        self._closed = False
        self._driver = threading.Thread(target=self._drive, name=f"timed {name}", daemon=True)
        self._driver.start()

    def close(self) -> None:
        """Ends the driver thread once the model has nothing left to step."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._driver.join()

    def generate(self, requests: Sequence[Request], on_finished: OnFinished | None = None) -> list[Generation]:
        with contextlib.nullcontext() if self.joins_calls else self._one_call:
            with self._changed:
                texts, queued = self._submit(requests)
                self._changed.notify_all()
            left = {id(q) for q in queued}
            while left:
                with self._changed:
                    self._changed.wait_for(lambda: not left.isdisjoint(self._reported))
                    done = left & self._reported
                    self._reported -= done
                left.difference_update(done)
                if on_finished is not None:
                    on_finished(len(done), sum(q.turn.reply for q in queued if id(q) in done))
        return [
            Generation(
                text, prompt_tokens=prompt, completion_tokens=reply, finish_reason="stop", cached_tokens=q.cached
            )
            for (text, reply, prompt), q in zip(texts, queued)
        ]

    def _submit(self, requests: Sequence[Request]) -> tuple[list[tuple[str, int, int]], list[ModelRequest]]:
        """The replies (text, tokens, prompt tokens), and the requests queued in the model."""
        if not self.model.busy:  # idle until now
            self.model.now = max(self.model.now, (time.monotonic() - self._begun) / self.scale)
        texts, queued = [], []
        for r in requests:
            key = (r.affinity, user_turn(r))
            prompt_text = "".join(m["content"] for m in r.messages)
            reply, terminate = self.replies.reply(r)
            text = " ".join(["word"] * (reply - 1) + (["TERMINATE"] if terminate else ["word"]))
            reusable = tokens(prompt_text[: common_prefix(self._last.get(key, ""), prompt_text)])
            self._last[key] = prompt_text + text
            turn = Turn("user" if key[1] else "assistant", tokens(prompt_text), reusable, reply)
            queued.append(ModelRequest(self._ids.setdefault(key, len(self._ids)), turn))
            self.model.submit(queued[-1])
            texts.append((text, reply, turn.prompt))
        return texts, queued

    def _drive(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self.model.busy or self._closed)
                if not self.model.busy:
                    return
                before = self.model.now
                done = self.model.step(JUMP)
                self.modelled += self.model.now - before
                end = self._begun + self.scale * self.model.now
            _sleep_until(end)
            if done:
                with self._changed:
                    self._reported |= {id(q) for q in done}
                    self._changed.notify_all()


def _sleep_until(deadline: float) -> None:
    left = deadline - time.monotonic()
    if left > 0:
        time.sleep(left)


@dataclass(frozen=True)
class Layout:
    user: GpuModel
    assistant: GpuModel | None  # None: the user agent's engine serves both roles
    assistant_copies: int = 1  # engines of the assistant's model, each on GPUs of its own


LAYOUTS = {
    "equal": Layout(LLAMA_8B, LLAMA_8B),
    "equal, assistant x2": Layout(LLAMA_8B, LLAMA_8B, 2),
    "70B + 8B": Layout(LLAMA_70B_TP4, LLAMA_8B),
    "shared": Layout(LLAMA_8B, None),
}


class TimedLoader:
    """The engines of a layout, and their KV caches as `generate`'s lockstep.in_flight=auto reads
    them from a planned layout (engines/factory.py `EngineLoader.caches`)."""

    def __init__(self, layout: Layout, replies: Replies, scale: float, joins: bool = False):
        self.user = TimedEngine("user-agent", layout.user, replies, scale, joins)
        self.parts = (
            [TimedEngine("assistant", layout.assistant, replies, scale, joins) for _ in range(layout.assistant_copies)]
            if layout.assistant is not None
            else []
        )
        self.assistant: Engine = (
            self.user if not self.parts else self.parts[0] if len(self.parts) == 1 else ReplicatedEngine(self.parts)
        )
        if len(self.parts) > 1:
            self.assistant.max_model_len = MAX_MODEL_LEN

    def __call__(self) -> dict[str, Engine]:
        return {"user_agent": self.user, "assistant": self.assistant}

    @property
    def caches(self) -> tuple[Cache, ...]:
        if not self.parts:
            return (Cache(("user_agent", "assistant"), self.user.gpu.kv_tokens, self.user.gpu.max_num_seqs),)
        gpu = self.parts[0].gpu
        return (
            Cache(("user_agent",), self.user.gpu.kv_tokens, self.user.gpu.max_num_seqs),
            Cache(("assistant",), gpu.kv_tokens, gpu.max_num_seqs, len(self.parts)),
        )

    def close(self) -> None:
        for engine in [self.user, *self.parts]:
            engine.close()

    def modelled(self) -> dict[str, float]:
        """Per model, the modelled seconds of its engines' calls, summed over its copies."""
        out = {self.user.name: self.user.modelled}
        for part in self.parts:
            out[part.name] = out.get(part.name, 0.0) + part.modelled
        return out


@dataclass(frozen=True)
class Measured:
    layout: str
    cohorts: str
    in_flight: str
    joins: bool  # whether a cohort's calls joined an engine's running batch
    dialogues: int
    turns: int
    wall: float
    cpu: float  # the process's CPU seconds during the run
    scale: float
    busy: dict[str, float]  # per engine, share of the run (the step trace's)
    engine_seconds: dict[str, float]  # per model, the modelled seconds of its calls (no CPU time in them)
    prefilled: float  # the share of prompt tokens the engines computed (the rest: their prefix caches)

    @property
    def modelled(self) -> float:
        return self.wall / self.scale

    @property
    def turns_per_s(self) -> float:
        return self.turns / self.modelled


def run(layout: str, cohorts: str, in_flight: str, joins: bool, args: argparse.Namespace, work: Path) -> Measured:
    from hydra import compose, initialize_config_dir

    from personalens.config import register_resolvers
    from personalens.simulate.command import generate
    from personalens.simulate.trace import CallTrace, TraceTotals
    from personalens.store import read_table

    loader = TimedLoader(LAYOUTS[layout], Replies(balanced=args.balanced), args.scale, joins)
    out = work / f"{layout}-{cohorts}-{in_flight}-{'joins' if joins else 'queued'}".replace(" ", "").replace(",", "")
    overrides = [
        f"protocol={args.protocol}",
        f"data.root={args.root}",
        f"trials={args.trials}",
        f"lockstep.cohorts={cohorts}",
        f"lockstep.in_flight={in_flight}",
        f"run.out_dir={out}",
        "progress=false",
        *args.override,
    ]
    register_resolvers()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    cpu, started = time.process_time(), time.monotonic()
    try:
        generate(cfg, loader)
    finally:
        loader.close()
    wall, cpu = time.monotonic() - started, time.process_time() - cpu
    turns = read_table(out / "dialogues", ["turns"]).column("turns").to_pylist()
    totals = TraceTotals()
    for row in read_table(out / "trace").to_pylist():
        totals.add(CallTrace(**{k: row[k] for k in CallTrace.__dataclass_fields__}))
    busy = {engine: seconds / totals.span for engine, seconds in totals.busy.items()}
    prompt = sum(totals.prompt.values())
    prefilled = 1 - sum(totals.cached.values()) / prompt if prompt else 0.0
    return Measured(
        layout,
        cohorts,
        in_flight,
        joins,
        len(turns),
        sum(map(len, turns)),
        wall,
        cpu,
        args.scale,
        busy,
        loader.modelled(),
        prefilled,
    )


def line(m: Measured, base: Measured | None) -> str:
    busy = ", ".join(f"{engine} {share:.0%}" for engine, share in sorted(m.busy.items()))
    calls = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in m.engine_seconds.items())
    versus = f" {m.turns_per_s / base.turns_per_s:5.2f}x" if base else ""
    return (
        f"{m.layout:<19} cohorts={m.cohorts:<5} in_flight={m.in_flight:<4} joins={'yes' if m.joins else 'no ':<3} "
        f"{m.dialogues:5d} dialogues "
        f"{m.turns:6d} turns  modelled {m.modelled:8.1f} s  {m.turns_per_s:7.2f} turns/s{versus}  "
        f"prefilled {m.prefilled:.0%}  busy: {busy}  "
        f"(modelled calls: {calls}; wall {m.wall:.1f} s, CPU {m.cpu:.1f} s)"
    )


def main(argv: Sequence[str] | None = None) -> list[Measured]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=REPO / "data" / "sample", help="the data root")
    parser.add_argument(
        "--trials", type=int, default=30, help="trials of each scenario (dialogues = scenarios x trials)"
    )
    parser.add_argument("--protocol", default="paper")
    parser.add_argument("--scale", type=float, default=0.05, help="wall seconds slept per modelled second")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="semicolon-separated, of: " + "; ".join(LAYOUTS))
    parser.add_argument("--in-flight", default="all", help="comma-separated lockstep.in_flight values: all, auto, N")
    parser.add_argument("--cohorts", default="1,auto", help="comma-separated lockstep.cohorts values")
    parser.add_argument(
        "--joins",
        default="no,yes",
        help="comma-separated: no (an engine answers one call at a time), yes (a call joins the running batch)",
    )
    parser.add_argument("--override", action="append", default=[], help="one more Hydra override (repeatable)")
    parser.add_argument("--balanced", action="store_true", help="user replies as long as the assistant's")
    parser.add_argument("--tiny", action="store_true", help="2 trials, 2 rounds, a tiny scale: seconds")
    parser.add_argument("--keep", type=Path, help="write the runs here (default: a temporary folder)")
    args = parser.parse_args(argv)
    if args.tiny:
        args.trials, args.scale = 2, 0.0005
        args.override = [*args.override, "protocol.max_rounds_sd=2", "protocol.max_rounds_md=2"]
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        work = args.keep or Path(scratch)
        for layout in args.layouts.split(";"):
            runs = args.cohorts.split(",") + (["2"] if LAYOUTS[layout].assistant is None else [])
            base = None  # the first row: strict alternation with every dialogue in flight by default
            for in_flight in args.in_flight.split(","):
                for joins in args.joins.split(","):
                    for cohorts in runs:
                        if joins == "yes" and (cohorts == "1" or LAYOUTS[layout].assistant is None):
                            continue  # one cohort, or one engine (its calls run in turn), never joins a call
                        measured = run(layout, cohorts, in_flight, joins == "yes", args, work)
                        print(line(measured, base), flush=True)
                        base = base or measured
                        results.append(measured)
    return results


if __name__ == "__main__":
    main()
