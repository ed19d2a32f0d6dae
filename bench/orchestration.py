"""What the calling process spends per turn, with the model taken out: the real `generate` command
(and `judge`) over a release-sized data root, with an engine that answers at once but still does in
this process what vLLM's `LLM.chat` / `LLM.generate` do before the GPU sees a request (chat
template and tokenization for prompts without token ids, `SamplingParams`, `TokensPrompt`).

Each (dialogues, protocol, route) runs in its own process, so its peak RSS is its own. Routes:
`ids` (the default: prompts kept as token ids per dialogue) and `messages` (chat messages,
rendered and tokenized whole each turn, as before). Synthetic replies never say TERMINATE, so
every dialogue runs to the round cap; their lengths are stated in the output.

    python bench/orchestration.py ../shared/personalens-data --dialogues 500,2000,8000,32000
    python bench/orchestration.py ../shared/personalens-data --dialogues 500 --protocol paper --route ids,messages

Per-turn costs are CPU time of the process (tokenizer threads included), less the stand-in model's
own work (making the synthetic replies), split by part; per round, so a cost that grows with the
history shows. turns/s is over wall time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from release_copy import replicate

REPO = Path(__file__).resolve().parents[1]
SCENARIOS_PER_USER = 86  # the excerpt's users have 86 scenarios each (the release: about 81)
# synthetic reply lengths in tokens (uniform): quick = the quick protocol's budgets; paper = our
# assumption of realistic replies under 800-token budgets (no measurement of the paper's models)
REPLY_TOKENS = {
    "quick": {"user": (32, 64), "assistant": (48, 96)},
    "paper": {"user": (40, 120), "assistant": (150, 600)},
}
WORDS = "the a to of and you for is on that with your it can i this be have are at or we will from".split()


class Timers:
    """CPU seconds of this process by part (process CPU time, so that other load on the machine does
    not inflate the split; tokenizer threads count too)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._open: list[str] = []

    def wrap(self, owner, name: str, part: str) -> None:
        """Time owner.name under `part`; time inside a nested timed call is that call's part only."""
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            started = time.process_time()
            self._open.append(part)
            try:
                return inner(*args, **kwargs)
            finally:
                self._open.pop()
                spent = time.process_time() - started
                self.seconds[part] += spent
                if self._open:
                    self.seconds[self._open[-1]] -= spent

        setattr(owner, name, timed)


class InstantEngine:
    """Answers at once, after the calling-process work of vLLM's offline API."""

    def __init__(self, tokenizer, protocol: str, take_ids: bool, timers: Timers):
        self.name = "instant"
        self._tokenizer = tokenizer
        self.chat_tokenizer = tokenizer if take_ids else None
        self._lengths = REPLY_TOKENS[protocol]
        self._timers = timers

    def generate(self, requests, on_finished=None):
        from vllm.inputs import TokensPrompt

        from personalens.engines.base import Generation
        from personalens.engines.vllm.local import sampling_params

        if all(r.prompt_ids is not None for r in requests):
            ids = [r.prompt_ids for r in requests]
        else:  # what LLM.chat does: the chat template, then tokenization
            ids = self._tokenizer.encode_chats([r.messages for r in requests])
        started = time.process_time()
        prompts = [TokensPrompt(prompt_token_ids=list(i)) for i in ids]
        params = [sampling_params(r) for r in requests]
        self._timers.seconds["requests"] += time.process_time() - started
        started = time.process_time()  # the stand-in model's own work, left out of the per-turn cost
        replies = []
        for r, prompt in zip(requests, prompts):
            rng = random.Random(r.sampling.seed)
            role = "user" if r.sampling.temperature > 0 else "assistant"  # the protocol's user agent samples
            low, high = self._lengths[role]
            tokens = min(rng.randint(low, high), r.sampling.max_tokens)
            text = " ".join(rng.choice(WORDS) for _ in range(max(1, int(tokens * 0.75))))
            replies.append(Generation(text, len(prompt["prompt_token_ids"]), tokens))
        self._timers.seconds["model"] += time.process_time() - started
        for reply in replies:  # as vLLM reports each finished request (the step trace's finish times)
            if on_finished is not None:
                on_finished(1, reply.completion_tokens)
        del prompts, params
        return replies


def compose(root: Path, users: int, protocol: str, out: Path) -> list[str]:
    return [
        f"data.root={root}",
        f"data.users=0-{users - 1}",
        f"protocol={protocol}",
        f"run.out_dir={out}",
        "progress=false",
    ]


def one_run(args: argparse.Namespace) -> dict:
    """In a child process: one generate (and judge) run; prints its measurements as JSON."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from personalens.config import register_resolvers
    from personalens.engines.chat.token_ids import ChatTokenizer
    from personalens.engines.models.config import ModelConfig
    from personalens.simulate import generate as generate_module
    from personalens.simulate import lockstep as lockstep_module
    from personalens.simulate.command import generate
    from personalens.store import PartWriter

    load_before = os.getloadavg()[0]
    timers = Timers()
    for module_function in ("user_agent_messages", "assistant_messages"):
        timers.wrap(generate_module, module_function, "render")
    timers.wrap(ChatTokenizer, "render", "render")
    timers.wrap(ChatTokenizer, "encode", "tokenize")
    timers.wrap(ChatTokenizer, "encode_ends", "tokenize")
    timers.wrap(PartWriter, "write", "write")
    steps = []
    run_lockstep = generate_module.run_lockstep

    def recording(*a, **kw):
        inner = kw.get("on_step") or a[5]
        last = [time.process_time(), timers.seconds["model"]]

        def on_step(stats):  # CPU seconds of the step, not its wall time (robust to other load)
            now, model = time.process_time(), timers.seconds["model"]
            steps.append((stats.requests, now - last[0] - (model - last[1]), stats.prompt_tokens))
            last[:] = [now, model]
            inner(stats)

        if "on_step" in kw:
            kw["on_step"] = on_step
        else:
            a = (*a[:5], on_step, *a[6:])
        return run_lockstep(*a, **kw)

    generate_module.run_lockstep = recording
    kept = []  # the PromptIds of the run, for their counts
    token_prompts = lockstep_module.token_prompts

    def keeping(engines):
        made = token_prompts(engines)
        kept.extend(made.values())
        return made

    lockstep_module.token_prompts = keeping
    register_resolvers()
    overrides = compose(Path(args.root), args.users, args.protocol, Path(args.out))
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = hydra_compose("config", overrides=overrides)
    tokenizer = ChatTokenizer.load(ModelConfig(name="SmolLM2-135M-Instruct"))
    # vLLM's request types imported (and made once) before the clock starts: the engine's first
    # call must not pay for the imports
    from vllm.inputs import TokensPrompt

    from personalens.engines.base import Request, Sampling
    from personalens.engines.vllm.local import sampling_params

    TokensPrompt(prompt_token_ids=[0])
    sampling_params(Request([], Sampling()))

    engine = InstantEngine(tokenizer, args.protocol, args.route == "ids", timers)
    started, cpu = time.perf_counter(), time.process_time()
    generate(cfg, lambda: {"user_agent": engine, "assistant": engine})
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    turns = sum(s[0] for s in steps)
    model = timers.seconds.pop("model", 0.0)
    split = {k: round(v / turns * 1e3, 4) for k, v in sorted(timers.seconds.items())}
    split["rest"] = round((cpu - model - sum(timers.seconds.values())) / turns * 1e3, 4)
    cpu -= model
    result = {
        "dialogues": None,
        "protocol": args.protocol,
        "route": args.route,
        "turns": turns,
        "wall_s": round(wall, 2),
        "turns_per_s": round(turns / wall, 1),
        "turns_per_cpu_s": round(turns / cpu, 1),
        "cpu_ms_per_turn": round(cpu / turns * 1e3, 4),
        "model_cpu_s": round(model, 2),
        "ms_per_turn": split,
        # per step: CPU ms per turn and mean prompt tokens (odd steps: user agent turns; even: assistant)
        "steps": [(round(s / max(n, 1) * 1e3, 4), round(p / max(n, 1))) for n, s, p in steps],
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "load": (load_before, os.getloadavg()[0]),  # 1-minute load average at the start and the end
        "prompt_tokens": sum(s[2] for s in steps),
        "splices": [vars(k.stats) for k in kept],
    }
    from personalens.store import read_table

    result["dialogues"] = read_table(Path(args.out) / "dialogues", ["user_id"]).num_rows
    if args.judge:
        result["judge"] = run_judge(cfg, engine, timers)
    print("RESULT " + json.dumps(result))
    return result


def run_judge(cfg, engine, timers: Timers) -> dict:
    from personalens.judge.command import judge

    before = dict(timers.seconds)
    started = time.perf_counter()
    judge(cfg, lambda: {"judge": engine})
    wall = time.perf_counter() - started
    spent = {k: round(v - before.get(k, 0.0), 2) for k, v in timers.seconds.items()}
    return {"wall_s": round(wall, 2), "seconds": spent}


def child_env() -> dict:
    """This checkout's package first (a worktree beside an editable install of another)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def timed_cli(args: list[str]) -> str:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "personalens.cli", *args], cwd=REPO, capture_output=True, text=True, env=child_env()
    )
    said = (done.stdout if done.returncode == 0 else done.stdout + done.stderr).strip()
    return f"{time.perf_counter() - started:.2f} s wall (exit {done.returncode}): {said[-600:]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data_root", type=Path, help="a small data root to copy users from (the 3-user excerpt)")
    parser.add_argument("--dialogues", default="500,2000,8000,32000")
    parser.add_argument("--protocol", default="quick", choices=["quick", "paper"])
    parser.add_argument("--route", default="ids", help="ids, messages, or both: ids,messages")
    parser.add_argument("--judge", action="store_true", help="also judge the dialogues (the judge path)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--users", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        one_run(args)
        return
    sizes = [int(n) for n in args.dialogues.split(",")]
    print(f"CPU flags: {' '.join(sorted(f for f in _cpu_flags() if 'avx' in f or 'amx' in f))}; {os.cpu_count()} cores")
    print(f"synthetic reply tokens ({args.protocol}): {REPLY_TOKENS[args.protocol]}")
    with tempfile.TemporaryDirectory() as tmp:
        users = max(math.ceil(n / SCENARIOS_PER_USER) for n in sizes)
        root = replicate(args.data_root, users, Path(tmp) / "data")
        last = None
        for n in sizes:
            for route in args.route.split(","):
                out = Path(tmp) / f"run-{n}-{route}"
                child = [sys.executable, __file__, str(args.data_root), "--child", "--root", str(root)]
                child += ["--users", str(math.ceil(n / SCENARIOS_PER_USER)), "--out", str(out)]
                child += ["--protocol", args.protocol, "--route", route] + (["--judge"] if args.judge else [])
                done = subprocess.run(child, capture_output=True, text=True, cwd=REPO, env=child_env())
                line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
                if line is None:
                    sys.exit(f"child failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
                report(json.loads(line[len("RESULT ") :]))
                last = (n, route, out)
        n, route, out = last
        overrides = compose(root, math.ceil(n / SCENARIOS_PER_USER), args.protocol, out)
        print(
            f"resume scan of the finished {n:,}-dialogue run: `personalens generate` {timed_cli(['generate', *overrides])}"
        )
        # without --judge there are no judgments: merge checks and writes the dialogues alone
        judged = [] if args.judge else ["judging.dimensions=[]"]
        print(f"`personalens merge` on it: {timed_cli(['merge', *overrides, *judged])}")


def report(r: dict) -> None:
    split = ", ".join(f"{k} {v:.3f}" for k, v in r["ms_per_turn"].items())
    print(
        f"{r['dialogues']:>6,} dialogues {r['protocol']:<5} {r['route']:<8}: {r['turns']:,} turns in {r['wall_s']} s "
        f"= {r['turns_per_s']:,} turns/s ({r['turns_per_cpu_s']:,} per CPU second); CPU ms per turn "
        f"{r['cpu_ms_per_turn']:.3f}: {split}; peak RSS {r['peak_rss_mib']} MiB (stand-in model: {r['model_cpu_s']} CPU s, "
        f"not counted); load average {r['load'][0]:.1f} -> {r['load'][1]:.1f}"
    )
    for stats in r["splices"]:
        print(
            f"    token ids: {stats['tokenized']:,} tokens tokenized for {r['prompt_tokens']:,} prompt tokens "
            f"({stats['tokenized'] / r['prompt_tokens']:.0%}); prompts {stats['prompts']:,}: {stats['spliced']:,} spliced "
            f"({stats['reused_ends']:,} keeping the end too), {stats['full']:,} whole; {stats['checked']:,} checked, "
            f"{stats['mismatches']} mismatches"
        )
    for name, steps in (("user", r["steps"][0::2]), ("assistant", r["steps"][1::2])):
        rounds = ", ".join(f"{k}: {t:.3f} ({p})" for k, (t, p) in enumerate(steps, 1))
        print(f"    CPU ms per {name} turn by round (mean prompt tokens): {rounds}")
    user_steps = r["steps"][0::2]
    if len(user_steps) >= 20:
        (t2, p2), (t3, _), (t20, p20) = user_steps[1], user_steps[2], user_steps[19]
        print(
            f"    user turn 2: {t2:.3f} ms ({p2} prompt tokens); user turn 20: {t20:.3f} ms ({p20} tokens); "
            f"20th / 2nd {t20 / t2:.2f}, 20th / 3rd {t20 / t3:.2f}"
        )
    if "judge" in r:
        print(f"    judge: {r['judge']['wall_s']} s; seconds by part {r['judge']['seconds']}")


def _cpu_flags() -> set[str]:
    from personalens.engines.dtype import read_cpu_flags

    return set(read_cpu_flags())


if __name__ == "__main__":
    main()
