"""A Table-3 row on one machine with random weights: the paper's 50-user subset through `generate`,
`judge` (every dimension) and `report`, on an in-process vLLM engine whose weights are random
(`load_format: dummy`) but whose architecture is a shipped model's (its published config.json,
written here), so no weights are downloaded. The tokenizer is the embedded model's (SmolLM2's):
prompts are as long as SmolLM2 makes them, not exactly as the real model's tokenizer would.

It prints the wall time of each stage, generate's generated tokens per second, lockstep against
the same requests replayed straight to the engine (raw batched, from a cold prefix cache too), and
the step trace's summary (calls, share of their wall time in the straggler tail).

`--cohorts` measures lockstep cohorts instead: the user agent and the assistant are two distinct
in-process engines of the same architecture (the user agent's config named and seeded apart, so the
placement planner splits the machine's memory between them), loaded once, and `generate` runs on
them with `lockstep.cohorts=1` and then `lockstep.cohorts=2` (each from a cold prefix cache, into
an out dir of its own), printing each run's wall time, turns/s, tokens/s and each engine's busy
share from the step trace; no raw replay, judge or report. It needs vLLM's engine processes (the
default): with VLLM_ENABLE_V1_MULTIPROCESSING=0 two engine cores stepping at once in one process
fail (docs/performance.md).

    python bench/gpu_row.py ../shared/personalens-data               # on a GPU: llama31_8b, paper protocol
    python bench/gpu_row.py ../shared/personalens-data --arch mistral7b_v02
    python bench/gpu_row.py ../shared/personalens-data --cohorts --users 0-1 --rounds 2,3
    python bench/gpu_row.py ../shared/personalens-data --levers --users 0-1 --rounds 2,3 --gpu-type h100
    python bench/gpu_row.py --tiny                                   # CPU smoke size (tests/test_gpu_row.py)

`--levers` loads one engine per variant (`lever_overrides`): bf16 against fp8 KV, then a small KV
cache (`--kv-gib`, every dialogue in flight) without and with `--host-gib` of host memory for
evicted KV (vLLM's native offloading), each through `generate` from a cold cache, with `personalens
plan`'s prediction of the same config on this machine's GPUs (`--gpu-type`'s figures) beside it.

The architecture's vocabulary is the tokenizer's (SmolLM2's 49,152 ids): a random id past it
decodes to nothing, so a reply would go back into later prompts shorter than it was generated.

Random weights rarely sample the end-of-text token and never say TERMINATE, so every reply runs
to its token budget and every dialogue to its round cap: those set the row's lengths. They default
to an assumption of the paper's models (`--rounds 4,6` SD,MD and `--reply-tokens 80,300` user,
assistant, the lengths bench/stragglers.py assumes), not the protocol's caps (20 and 30 rounds of
800 tokens), under which prompts would outgrow the model's context. The judge's replies fill their
budget too (4,000 tokens under fidelity=official): `--judge-tokens` lowers it where device time is
short. `--tiny` is a 2-layer architecture on the bundled sample's user 0, one round, a few tokens.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# published config.json values (Hugging Face model cards) of the shipped model configs' architectures;
# the special tokens are SmolLM2's, whose tokenizer is used
ARCHS = {
    "llama31_8b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
    },
    "mistral7b_v02": {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        # the published 32,000 is raised to SmolLM2's 49,152 ids, which its prompts use
        "vocab_size": 49152,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
    },
    "tiny": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "vocab_size": 49152,
        "max_position_embeddings": 8192,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": True,
    },
}
SPECIAL = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "torch_dtype": "bfloat16"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
SCENARIOS_PER_USER = 86  # the excerpt's users (bench/release_copy.py copies them)


def model_dir(arch: str, into: Path, tokenizer: Path | None = None) -> Path:
    """A model directory with the architecture's config.json and the tokenizer files of `tokenizer`
    (a directory holding SmolLM2's), by default the embedded model's."""
    if tokenizer is None:
        from personalens.engines.models.embedded import embedded_model_dir

        tokenizer = embedded_model_dir()
    from tokenizers import Tokenizer

    into.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (tokenizer / name).exists():
            shutil.copy(tokenizer / name, into / name)
    # random ids past the tokenizer's vocabulary decode to nothing: an 80-token reply of ids up to
    # Llama's 128,256 goes back into later prompts as 32 of SmolLM2's tokens (docs/performance.md)
    vocab = Tokenizer.from_file(str(into / "tokenizer.json")).get_vocab_size()
    (into / "config.json").write_text(json.dumps({**ARCHS[arch], "vocab_size": vocab, **SPECIAL}, indent=2))
    return into


class Recorder:
    """The engine, with every batched call's requests kept for the raw replay."""

    def __init__(self, engine):
        self.engine, self.name = engine, engine.name
        self.chat_tokenizer = engine.chat_tokenizer  # so lockstep hands it token ids
        self.calls: list[list] = []

    def generate(self, requests, on_finished=None):
        self.calls.append(list(requests))
        return self.engine.generate(requests, on_finished)


def timed(what: str, run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    seconds = time.perf_counter() - started
    print(f"{what}: {seconds:.1f} s", flush=True)
    return seconds


def overrides(args: argparse.Namespace, model: Path, out: Path) -> list[str]:
    roles = ("assistant", "user_agent", "judge")
    if args.tiny:  # the embedded model's CPU settings, the tiny architecture's random weights
        models = [f"{r}.path={model}" for r in roles] + [f"{r}.kv_cache_memory_bytes={2**28}" for r in roles]
        sizes = ["protocol=quick", "protocol.max_rounds_sd=1", "protocol.max_rounds_md=1", "data.users=0"]
        # replies of 8 tokens; the judge's least budget the official format accepts
        sizes += [f"protocol.{r}.max_tokens={n}" for r, n in (("user_agent", 8), ("assistant", 8), ("judge", 120))]
    else:
        models = [f"model@{r}={args.arch_config}" for r in roles] + [f"{r}.path={model}" for r in roles]
        sizes = [f"protocol={args.protocol}", f"data.root={args.root}", f"data.users={args.users}"]
        (sd, md), (user, assistant) = (map(int, x.split(",")) for x in (args.rounds, args.reply_tokens))
        sizes += [f"protocol.max_rounds_sd={sd}", f"protocol.max_rounds_md={md}"]
        sizes += [f"protocol.user_agent.max_tokens={user}", f"protocol.assistant.max_tokens={assistant}"]
        if args.judge_tokens is not None:
            sizes.append(f"protocol.judge.max_tokens={args.judge_tokens}")
    dummy = [f"{r}.load_format=dummy" for r in roles]
    if args.cohorts:  # the user agent a model of its own: the same architecture, named and seeded apart
        models += ["user_agent.name=user-agent", "user_agent.seed=1"]
    return [*models, *dummy, *sizes, f"run.out_dir={out}", "progress=false", "report.bootstrap=100"]


def compose_config(args: argparse.Namespace, model: Path, out: Path, *extra: str):
    from hydra import compose, initialize_config_dir

    from personalens.config import register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("config", overrides=[*overrides(args, model, out), *extra])


def measured(out: Path, seconds: float) -> dict:
    """A generate run's figures from its dialogues and step trace."""
    from personalens.simulate.trace import CallTrace, TraceTotals
    from personalens.store import read_table

    dialogues = read_table(out / "dialogues", ["turns"]).column("turns").to_pylist()
    generated = sum(t["completion_tokens"] for turns in dialogues for t in turns)
    totals = TraceTotals()
    for row in read_table(out / "trace").to_pylist():
        totals.add(CallTrace(**{k: row[k] for k in CallTrace.__dataclass_fields__}))
    busy = {engine: busy / totals.span for engine, busy in totals.busy.items()} if totals.span else {}
    turns = sum(map(len, dialogues))
    return {
        "generate_s": seconds,
        "dialogues": len(dialogues),
        "turns": turns,
        "generated": generated,
        "turns_per_s": turns / seconds,
        "tokens_per_s": generated / seconds,
        "calls": totals.calls,
        "busy": busy,
        "span_s": totals.span,
        "trace": totals.line(),
    }


def cohorts_line(cohorts: int, m: dict) -> str:
    busy = ", ".join(f"{engine} {share:.0%}" for engine, share in sorted(m["busy"].items()))
    return (
        f"lockstep.cohorts={cohorts}: {m['dialogues']} dialogues, {m['turns']} turns, {m['generated']} generated "
        f"tokens in {m['generate_s']:.1f} s = {m['turns_per_s']:.2f} turns/s, {m['tokens_per_s']:.1f} tokens/s; "
        f"{m['calls']} batched calls; busy: {busy} of the calls' {m['span_s']:.1f} s"
    )


def run_cohorts(args: argparse.Namespace, work: Path) -> dict:
    """Two distinct engines loaded once; generate with one cohort, then two, each from a cold prefix cache."""
    from personalens.config import run as R
    from personalens.simulate.command import generate

    model = model_dir(args.arch, work / "model", args.tokenizer)
    configs = {n: compose_config(args, model, work / f"cohorts-{n}", f"lockstep.cohorts={n}") for n in (1, 2)}
    loader = R.engines(configs[1], ("user_agent", "assistant"))  # the layout is logged (and kept) here
    result: dict = {"load_s": timed("model load (random weights, two engines)", loader)}
    engines = loader()
    distinct = [engines["user_agent"], engines["assistant"]]
    if distinct[0] is distinct[1]:
        raise SystemExit("the user agent and the assistant share one engine: --cohorts needs two")
    for n, cfg in configs.items():
        for engine in distinct:
            engine.reset_prefix_cache()
        seconds = timed(f"generate, lockstep.cohorts={n}", lambda cfg=cfg: generate(cfg, loader))
        result[f"cohorts_{n}"] = measured(Path(cfg.run.out_dir), seconds)
        print(cohorts_line(n, result[f"cohorts_{n}"]), flush=True)
    for engine in distinct:
        engine.close()
    return result


def lever_overrides(kv_gib: float, host_gib: float) -> dict[str, list[str]]:
    """`--levers`' variants, each the overrides of one engine load: bf16 against fp8 KV at the planned
    KV cache, then a KV cache of `kv_gib` (smaller than every dialogue in flight keeps, all of them in
    flight, at max_model_len 8,192: `--rounds 2,3` keeps prompts below it) without and with `host_gib`
    of host memory for evicted KV. Every role gets them, so the row keeps one engine."""
    roles = ("assistant", "user_agent", "judge")
    # max_model_len 8,192: vLLM starts only with one sequence of it in the KV cache
    small = [f"{r}.{k}" for r in roles for k in (f"kv_cache_memory_bytes={int(kv_gib * 2**30)}", "max_model_len=8192")]
    small.append("lockstep.in_flight=all")
    return {
        "bf16 KV": [],
        "fp8 KV": [f"{r}.kv_cache_dtype=fp8" for r in roles],
        f"KV cache {kv_gib:g} GiB": small,
        f"KV cache {kv_gib:g} GiB + {host_gib:g} GiB host": small + [f"{r}.kv_offload_gib={host_gib}" for r in roles],
    }


def predicted(cfg, out: Path, gpu_type: str, gpu_gib: float | None = None) -> dict:
    """`personalens plan`'s chosen generate row for `cfg` on this machine's GPUs (`gpu_type`'s figures),
    or on one GPU of `gpu_gib` GiB."""
    from omegaconf import open_dict

    from personalens.plan.command import plan

    with open_dict(cfg):
        cfg.plan.jobs, cfg.plan.gpu_type, cfg.plan.out = ["generate"], gpu_type, str(out)
        if gpu_gib is not None:
            cfg.plan.gpus, cfg.plan.gpu_memory_gib = 1, gpu_gib
    plan(cfg)
    rows = json.loads(out.read_text())["placement"]["jobs"]["generate"]["throughput"]["layouts"]
    chosen = next(r for r in rows if r["chosen"])
    keys = ("tokens_per_s", "prefilled_share", "kv_tokens", "host_kv_tokens", "reloaded_share", "in_flight")
    return {k: chosen[k] for k in keys if k in chosen}


def run_levers(args: argparse.Namespace, work: Path) -> dict:
    """Each lever's variant loaded, run through generate from a cold cache and closed, with plan's
    prediction of the same config beside it."""
    from personalens.config import run as R
    from personalens.simulate.command import generate

    model = model_dir(args.arch, work / "model", args.tokenizer)
    result: dict = {}
    for k, (name, extra) in enumerate(lever_overrides(args.kv_gib, args.host_gib).items()):
        cfg = compose_config(args, model, work / f"lever-{k}", *extra)
        loader = R.engines(cfg, ("user_agent", "assistant"))
        load = timed(f"{name}: model load", loader)
        seconds = timed(f"{name}: generate", lambda cfg=cfg, loader=loader: generate(cfg, loader))
        m = measured(Path(cfg.run.out_dir), seconds)
        for engine in {id(e): e for e in loader().values()}.values():
            engine.close()
        result[name] = {
            "load_s": load,
            **m,
            "plan": predicted(cfg, work / f"lever-{k}.plan.json", args.gpu_type, args.plan_gib),
        }
        print(f"{name}: {m['tokens_per_s']:.1f} tokens/s measured, {result[name]['plan']}", flush=True)
    return result


def generate_line(result: dict) -> str:
    rate, raw_rate = result["generated"] / result["generate_s"], result["raw_generated"] / result["raw_s"]
    return (
        f"generate: {result['dialogues']} dialogues, {result['turns']} turns, {result['generated']} generated tokens "
        f"in {result['generate_s']:.1f} s = {rate:.1f} tokens/s; raw batched {raw_rate:.1f} tokens/s; "
        f"lockstep / raw batched = {rate / raw_rate:.2f}"
    )


def run(args: argparse.Namespace, work: Path) -> dict:
    from personalens.config import run as R
    from personalens.judge.command import judge
    from personalens.report.command import report
    from personalens.simulate.command import generate
    from personalens.store import read_table

    out = work / "run"
    cfg = compose_config(args, model_dir(args.arch, work / "model", args.tokenizer), out)
    result: dict = {}
    engines: dict = {}
    result["load_s"] = timed(
        "model load (random weights)", lambda: engines.update(R.engines(cfg, ("user_agent", "assistant", "judge"))())
    )
    engine = engines["assistant"]
    recorder = Recorder(engine)
    seconds = timed("generate", lambda: generate(cfg, lambda: {"user_agent": recorder, "assistant": recorder}))
    m = measured(out, seconds)
    result.update({k: m[k] for k in ("generate_s", "dialogues", "turns", "generated", "trace")})

    def raw() -> None:
        engine.reset_prefix_cache()
        for batch in recorder.calls:
            result["raw_generated"] = result.get("raw_generated", 0) + sum(
                g.completion_tokens for g in engine.generate(batch)
            )

    result["raw_s"] = timed("raw batched (the same requests)", raw)
    print(generate_line(result), flush=True)  # before the judge, so a run cut short still has it
    result["judge_s"] = timed("judge", lambda: judge(cfg, lambda: {"judge": engine}))
    result["judgments"] = read_table(out / "judgments", ["score"]).num_rows
    result["report_s"] = timed("report", lambda: report(cfg))
    engine.close()  # vLLM's engine processes stop now, not at an interpreter exit that waits on them
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data_root", type=Path, nargs="?", help="a small root to copy users from (the excerpt)")
    parser.add_argument("--arch", default="llama31_8b", choices=sorted(ARCHS))
    parser.add_argument("--users", default="sample50", help="data.users (default: the paper's 50-user subset)")
    parser.add_argument("--protocol", default="paper")
    parser.add_argument("--rounds", default="4,6", help="round caps SD,MD (every dialogue runs to its cap)")
    parser.add_argument("--reply-tokens", default="80,300", help="user,assistant reply budgets (replies fill them)")
    parser.add_argument(
        "--judge-tokens", type=int, help="the judge's reply budget (default: the fidelity option's; replies fill it)"
    )
    parser.add_argument(
        "--tokenizer", type=Path, help="a directory with SmolLM2's tokenizer files (default: the embedded model's)"
    )
    parser.add_argument("--tiny", action="store_true", help="CPU smoke size: tiny architecture, user 0, 1 round")
    parser.add_argument(
        "--cohorts", action="store_true", help="two distinct engines; generate with lockstep.cohorts=1, then 2"
    )
    parser.add_argument(
        "--levers", action="store_true", help="bf16 vs fp8 KV; a small KV cache without and with host offloading"
    )
    parser.add_argument("--kv-gib", type=float, default=4.0, help="--levers: the small KV cache, GiB per engine")
    parser.add_argument("--host-gib", type=float, default=48.0, help="--levers: host memory for evicted KV, GiB")
    parser.add_argument("--gpu-type", default="h100", help="--levers: plan.gpu_type of the predictions")
    parser.add_argument(
        "--plan-gib", type=float, help="--levers: predict for one GPU of this many GiB (default: this machine's GPUs)"
    )
    parser.add_argument("--keep", type=Path, help="work here (and keep it) instead of a temporary folder")
    args = parser.parse_args()
    if args.tiny:
        args.arch = "tiny"
    elif args.data_root is None:
        parser.error("a data root to copy users from is needed (or --tiny)")
    args.arch_config = {"tiny": "smollm2"}.get(args.arch, args.arch)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        if not args.tiny:
            from release_copy import replicate

            from personalens.data.selection import SUBSETS

            users = max(SUBSETS[args.users]) + 1 if args.users in SUBSETS else 1500  # the release: 1,500 users
            args.root = replicate(args.data_root, users, work / "data")
        result = (run_cohorts if args.cohorts else run_levers if args.levers else run)(args, work)
    print(f"arch {args.arch} (random weights), {'tiny' if args.tiny else f'users {args.users}, {args.protocol}'}")
    if args.levers:
        print("RESULT " + json.dumps(result))
        return
    if args.cohorts:
        print("\n".join(cohorts_line(n, result[f"cohorts_{n}"]) for n in (1, 2)))
        print(
            f"cohorts=2 / cohorts=1 wall time: {result['cohorts_2']['generate_s'] / result['cohorts_1']['generate_s']:.2f}"
        )
        print("RESULT " + json.dumps(result))
        return
    print(generate_line(result))
    print(f"trace: {result['trace']}")
    print(f"judge: {result['judgments']} judgments in {result['judge_s']:.1f} s; report {result['report_s']:.1f} s")
    print("RESULT " + json.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":  # vLLM spawns worker processes
    main()
