"""What the per-round barrier of lockstep costs on a GPU, estimated: dialogues replayed through a
model of a continuous-batching engine (vLLM's scheduler, much simplified) whose step time comes
from a roofline model of one GPU, once with lockstep's barrier and once without it.

    python bench/stragglers.py                      # a Table-3 row: 4,096 synthetic dialogues
    python bench/stragglers.py --run runs/default   # replay a run's dialogues (their real lengths)
    python bench/stragglers.py --sweep              # the synthetic row under other assumptions

Schedulers compared, on the same requests (same prompts, replies, order):
  lockstep    every active dialogue's next request submitted together; the next step's requests
              only when all of this step's have finished (`personalens generate` today)
  continuous  each dialogue's next request submitted as soon as its previous one finished
  window W    continuous, with at most W dialogues in flight (new ones start as others end), so
              that the dialogues in flight keep their history in the prefix cache

The engine model: FCFS admission while fewer than `max_num_seqs` requests run and their KV fits
the cache; every step decodes one token of every running request and prefills up to
`max_num_batched_tokens` - running prompt tokens of the admitted requests (chunked prefill). A step
takes overhead + max(memory time, compute time): memory = weights + the running requests' KV read
once, compute = 2 x parameters x tokens in the step + attention over the context. The prefix cache
keeps each (dialogue, role)'s last sequence (prompt and reply) until it is evicted, least recently
used first, when admissions need room; a hit saves the part of the new prompt that repeats it.

Every number of the GPU model is an assumption stated in `GpuModel` (H100 SXM figures from
NVIDIA's datasheet, efficiencies assumed), and so are the synthetic dialogue lengths in
`SyntheticRow`: nothing here was measured on a GPU. See docs/performance.md for the results.
"""

from __future__ import annotations

import argparse
import random
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path


@dataclass(frozen=True)
class GpuModel:
    """Llama-3.1-8B-Instruct (its published config: 8.03e9 parameters, 32 layers, hidden 4096,
    8 KV heads of 128) in bf16 on one H100 SXM (datasheet: 3.35 TB/s HBM3, 989 TFLOPS dense bf16,
    80 GB). Efficiencies, overhead and the engine's limits are assumptions."""

    params: float = 8.03e9
    layers: int = 32
    hidden: int = 4096
    kv_bytes_per_token: int = 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 heads of 128, 2 bytes
    bandwidth: float = 3.35e12 * 0.75  # assumed: 75% of peak HBM bandwidth reached by decoding
    flops: float = 989e12 * 0.5  # assumed: 50% of dense bf16 peak in prefill-heavy steps
    overhead: float = 0.5e-3  # assumed: per engine step (scheduling, launches; CUDA graphs on)
    kv_tokens: int = 400_000  # assumed: 0.9 x 80 GB - 16 GB weights - activations, / 128 KiB per token
    max_num_seqs: int = 256  # conf/model/llama31_8b.yaml
    max_batched_tokens: int = 8192  # assumed: vLLM's chunked-prefill token budget per step

    def step_seconds(self, decodes: int, prefill: int, context: int) -> float:
        """One engine step: `decodes` running requests one token each, `prefill` prompt tokens,
        `context` tokens of KV read by the step's attention."""
        memory = (2 * self.params + context * self.kv_bytes_per_token) / self.bandwidth
        tokens = decodes + prefill
        compute = (2 * self.params * tokens + 4 * self.layers * self.hidden * context * min(tokens, 1)) / self.flops
        return self.overhead + max(memory, compute)


@dataclass(frozen=True)
class Turn:
    role: str
    prompt: int  # prompt tokens
    reusable: int  # of them, the tokens that repeat this role's previous sequence of the dialogue
    reply: int  # generated tokens


Dialogue = Sequence[Turn]


@dataclass
class _Request:
    dialogue: int
    turn: Turn
    prefill: int = 0  # prompt tokens still to compute
    remaining: int = 0  # tokens still to generate
    context: int = 0  # KV held: prompt (and reply) tokens so far
    finished: float = 0.0


@dataclass
class Result:
    scheduling: str
    seconds: float = 0.0
    generated: int = 0
    prompt: int = 0
    computed: int = 0  # prompt tokens prefilled (not served from the cache)
    calls: list[tuple[float, float, list[float]]] = field(default_factory=list)  # lockstep: start, end, finishes

    def tail_share(self) -> float:
        """As the step trace counts it: the time fewer than a quarter of a call's requests ran."""
        tail = total = 0.0
        for start, end, done in self.calls:
            done = sorted(done)
            j = int(len(done) * 0.75) + 1
            tail += done[-1] - done[j - 1]
            total += end - start
        return tail / total if total else 0.0


class Engine:
    """The simplified vLLM: a waiting queue, the running requests, the prefix cache, a clock."""

    def __init__(self, gpu: GpuModel, shared_prefix: int):
        self.gpu, self.shared = gpu, shared_prefix
        self.now = 0.0
        self.waiting: deque[_Request] = deque()
        self.running: list[_Request] = []
        self.cache: OrderedDict[tuple[int, str], int] = OrderedDict()  # (dialogue, role) -> tokens
        self.cached_tokens = 0  # in the cache, not held by running requests
        self.held = 0  # KV of the running requests
        self.computed = 0

    def submit(self, request: _Request) -> None:
        self.waiting.append(request)

    def step(self) -> list[_Request]:
        """Admit what fits, run one engine step, return the requests that finished in it."""
        self._admit()
        budget = self.gpu.max_batched_tokens - sum(1 for r in self.running if r.prefill == 0)
        prefill = 0
        for r in self.running:
            if r.prefill and budget > 0:
                chunk = min(r.prefill, budget)
                r.prefill -= chunk
                budget -= chunk
                prefill += chunk
        decoding = [r for r in self.running if r.prefill == 0]  # a finished prefill samples a token too
        self.now += self.gpu.step_seconds(len(decoding), prefill, self.held)
        self.computed += prefill
        done = []
        for r in decoding:
            r.remaining -= 1
            r.context += 1
            self.held += 1
            if r.remaining <= 0:
                r.finished = self.now
                done.append(r)
        if done:
            self.running = [r for r in self.running if r.remaining > 0]
            for r in done:  # its prompt and reply stay cached for the dialogue's next turn
                self.held -= r.context
                self.cache[(r.dialogue, r.turn.role)] = r.context
                self.cached_tokens += r.context
        return done

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.gpu.max_num_seqs:
            r = self.waiting[0]
            if self.running and self.held + r.turn.prompt > self.gpu.kv_tokens:
                break
            own = self.cache.pop((r.dialogue, r.turn.role), 0)  # its blocks become the request's own
            self.cached_tokens -= own
            while self.cache and self.held + r.turn.prompt + self.cached_tokens > self.gpu.kv_tokens:
                _, size = self.cache.popitem(last=False)  # the least recently used
                self.cached_tokens -= size
            self.waiting.popleft()
            hit = max(min(own, r.turn.reusable), min(self.shared, r.turn.prompt))
            r.prefill, r.remaining, r.context = r.turn.prompt - hit, r.turn.reply, r.turn.prompt
            self.running.append(r)
            self.held += r.context


def simulate(
    dialogues: Sequence[Dialogue], gpu: GpuModel, scheduling: str, window: int | None = None, shared_prefix: int = 0
) -> Result:
    """Replay every dialogue's turns through the engine model under one scheduler."""
    engine = Engine(gpu, shared_prefix)
    result = Result(scheduling if window is None else f"{scheduling}, window {window}")
    position = [0] * len(dialogues)  # each dialogue's next turn

    def submit(d: int) -> None:
        turn = dialogues[d][position[d]]
        engine.submit(_Request(d, turn))
        result.generated += turn.reply
        result.prompt += turn.prompt

    if scheduling == "lockstep":
        active = [d for d in range(len(dialogues)) if dialogues[d]]
        while active:
            start = engine.now
            for d in active:
                submit(d)
            finishes: list[float] = []
            while len(finishes) < len(active):
                finishes += [r.finished for r in engine.step()]
            result.calls.append((start, engine.now, finishes))
            for d in active:
                position[d] += 1
            active = [d for d in active if position[d] < len(dialogues[d])]
    else:
        waiting = deque(d for d in range(len(dialogues)) if dialogues[d])
        for _ in range(min(window or len(waiting), len(waiting))):
            submit(waiting.popleft())
        while engine.waiting or engine.running:
            for r in engine.step():
                position[r.dialogue] += 1
                if position[r.dialogue] < len(dialogues[r.dialogue]):
                    submit(r.dialogue)
                elif waiting:  # a dialogue ended: the next one starts
                    submit(waiting.popleft())
    result.seconds = engine.now
    result.computed = engine.computed
    return result


@dataclass(frozen=True)
class SyntheticRow:
    """A Table-3 row's dialogues under the paper protocol, all lengths in tokens. Assumed (no
    measurement of the paper's models exists here): assistant replies log-normal around a median
    of `assistant_median` with spread `assistant_sigma`, capped at the protocol's 800; user
    replies uniform in `user`; rounds geometric with mean `mean_rounds` (each round the user agent
    says TERMINATE with probability 1 / mean_rounds), capped at 20 (SD) and 30 (MD). Prompt
    sizes: the official prompts' measured sizes in SmolLM2's tokenizer (docs/performance.md), the
    instructions after the conversation (`user_suffix`, `assistant_suffix`) not reusable."""

    dialogues: int = 4096
    md_share: float = 0.2  # the excerpt: 52 of 258 scenarios are MD
    mean_rounds: float = 4.0
    assistant_median: float = 200.0
    assistant_sigma: float = 0.7
    user: tuple[int, int] = (15, 60)
    user_opening: int = 1200  # the opening prompt
    user_base: int = 1480  # the next-turn prompt without its conversation
    assistant_base: int = 600
    user_suffix: int = 332
    assistant_suffix: int = 138
    shared_prefix: int = 400  # system prompt and instructions every dialogue's prompts share
    seed: int = 0

    def build(self) -> list[list[Turn]]:
        rng = random.Random(self.seed)
        out = []
        for _ in range(self.dialogues):
            cap = 30 if rng.random() < self.md_share else 20
            rounds = 1
            while rounds < cap and rng.random() > 1 / self.mean_rounds:
                rounds += 1
            out.append(self._dialogue(rng, rounds))
        return out

    def _dialogue(self, rng: random.Random, rounds: int) -> list[Turn]:
        turns, history, last = [], 0, {"user": 0, "assistant": 0}
        for k in range(2 * rounds):
            role = "user" if k % 2 == 0 else "assistant"
            if role == "user":
                prompt = self.user_opening if k == 0 else self.user_base + history
                reply = rng.randint(*self.user)
                reusable = 0 if k <= 2 else max(0, last["user"] - self.user_suffix)
            else:
                prompt = self.assistant_base + history
                reply = min(800, max(1, int(rng.lognormvariate(0, self.assistant_sigma) * self.assistant_median)))
                reusable = max(0, last["assistant"] - self.assistant_suffix)
            turns.append(Turn(role, prompt, min(reusable, prompt), reply))
            last[role] = prompt
            history += reply + 6  # the reply and its speaker label
        return turns


def from_run(run_dir: Path, user_suffix: int, assistant_suffix: int) -> list[list[Turn]]:
    """A run's dialogues with their real token counts (reusable: the role's previous prompt less
    the instructions after the conversation)."""
    import pyarrow.dataset as ds

    files = sorted(str(p) for p in (run_dir / "dialogues").rglob("part-*.parquet"))
    out = []
    for row in ds.dataset(files, format="parquet").to_table(columns=["turns"]).to_pylist():
        last = {"user": 0, "assistant": 0}
        turns = []
        for t in row["turns"]:
            suffix = user_suffix if t["role"] == "user" else assistant_suffix
            reusable = max(0, min(t["prompt_tokens"], last[t["role"]] - suffix))
            turns.append(Turn(t["role"], t["prompt_tokens"], reusable, max(1, t["completion_tokens"])))
            last[t["role"]] = t["prompt_tokens"]
        out.append(turns)
    return out


def measured(run_dir: Path) -> None:
    """The run's own step trace (where it ran: a CPU, for runs made here)."""
    import pyarrow.dataset as ds

    files = sorted(str(p) for p in (run_dir / "trace").rglob("part-*.parquet"))
    rows = sorted(ds.dataset(files, format="parquet").to_table().to_pylist(), key=lambda r: (r["started"], r["call"]))
    for r in rows:
        print(
            f"  step {r['step']:2d} {'+'.join(r['roles']):<14} {r['requests']:4d} requests, {r['completion_tokens']:6d} "
            f"generated, {r['seconds']:7.1f} s: first done {r['first_finished']:6.1f} s, last {r['last_finished']:6.1f} s, "
            f"tail {r['tail']:6.1f} s"
        )
    seconds, tail = sum(r["seconds"] for r in rows), sum(r["tail"] for r in rows)
    print(f"measured: {len(rows)} calls, {seconds:.1f} s, {tail / seconds:.0%} of it in the straggler tail")


def compare(dialogues: Sequence[Dialogue], gpu: GpuModel, shared: int, windows: Sequence[int]) -> list[Result]:
    results = [simulate(dialogues, gpu, "lockstep", shared_prefix=shared)]
    results.append(simulate(dialogues, gpu, "continuous", shared_prefix=shared))
    results += [simulate(dialogues, gpu, "continuous", w, shared) for w in windows]
    base = results[0].seconds
    turns = sum(len(d) for d in dialogues)
    print(f"{len(dialogues):,} dialogues, {turns:,} turns, {results[0].generated:,} generated tokens")
    for r in results:
        print(
            f"  {r.scheduling:<26} {r.seconds:9.1f} s  {r.generated / r.seconds:8.0f} generated tokens/s  "
            f"prefilled {r.computed / r.prompt:4.0%} of {r.prompt:,} prompt tokens  "
            f"saves {1 - r.seconds / base:+6.1%} vs lockstep"
            + (f"  (tail share {r.tail_share():.0%})" if r.calls else "")
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, help="replay this run's dialogues instead of a synthetic row")
    parser.add_argument("--dialogues", type=int, default=4096)
    parser.add_argument("--windows", default="64,256", help="dialogues in flight for the windowed scheduler")
    parser.add_argument("--sweep", action="store_true", help="the synthetic row under other length assumptions")
    args = parser.parse_args()
    gpu = GpuModel()
    windows = [int(w) for w in args.windows.split(",") if w]
    print(f"GPU model (assumptions): {gpu}")
    row = SyntheticRow(dialogues=args.dialogues)
    if args.run:
        measured(args.run)
        print("the run's dialogues replayed through the GPU model:")
        compare(from_run(args.run, row.user_suffix, row.assistant_suffix), gpu, row.shared_prefix, windows)
        return
    print(f"synthetic row: {row}")
    compare(row.build(), gpu, row.shared_prefix, windows)
    if args.sweep:
        for what, change in (
            ("row", {"mean_rounds": 2.0}),
            ("row", {"mean_rounds": 8.0}),
            ("row", {"assistant_median": 100.0}),
            ("row", {"assistant_median": 400.0}),
            ("row", {"assistant_sigma": 0.3}),
            ("row", {"assistant_sigma": 1.0}),
            ("row", {"dialogues": 512}),
            ("gpu", {"max_num_seqs": 1024}),
            ("gpu", {"max_batched_tokens": 16384}),
            ("gpu", {"kv_tokens": 200_000}),
            ("gpu", {"flops": 989e12 * 0.8}),
        ):
            print(f"with {what} {change}:")
            if what == "row":
                compare(replace(row, **change).build(), gpu, row.shared_prefix, windows)
            else:
                compare(row.build(), replace(gpu, **change), row.shared_prefix, windows)


if __name__ == "__main__":
    main()
