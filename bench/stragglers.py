"""What the per-round barrier of lockstep costs on a GPU, estimated: dialogues replayed through the
model of a continuous-batching engine in personalens/plan/engine_model.py (vLLM's scheduler, much
simplified, with a roofline step time of one GPU), once with lockstep's barrier and once without it.

    python bench/stragglers.py                      # a Table-3 row: 4,096 synthetic dialogues
    python bench/stragglers.py --run runs/default   # replay a run's dialogues (their real lengths)
    python bench/stragglers.py --sweep              # the synthetic row under other assumptions

The schedulers compared (lockstep, continuous, continuous with a window of W dialogues in flight)
and the engine model are described in that module. Every number of the GPU model is an assumption
stated in `GpuModel` (H100 SXM figures from NVIDIA's datasheet, efficiencies assumed), and so are
the synthetic dialogue lengths in `SyntheticRow`: nothing here was measured on a GPU. See
docs/performance.md for the results.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from personalens.plan.engine_model import Dialogue, Result, Turn, simulate
from personalens.plan.gpu_model import GpuModel


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
