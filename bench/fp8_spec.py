"""FP8 weights against bf16, each with and without n-gram speculative decoding, on one GPU: a shipped
model's architecture (Llama-3.1-8B by default) with random weights, as bench/gpu_row.py builds it
(its data copy, model directory and config composition), one engine for every role. Each variant is
loaded, run through `generate` from a cold cache and closed; `personalens plan`'s prediction of the
same config on this GPU (`--gpu-type`'s figures, `--plan-gib` of memory) is printed beside what it
measured, and both are written to `--record` (bench/results/ by default) as JSON.

    python bench/fp8_spec.py .dev/excerpt --users 0 --rounds 2,3 --reply-tokens 60,200 \\
        --gpu-type h200 --plan-gib 140.4 --tokenizer .dev/tokenizer

Random weights decode random ids: an n-gram proposer finds few repeats to draft from, so this row
measures what speculative decoding costs when its drafts are mostly rejected, not what it gives on
real text; `plan` models it only from a measured acceptance rate, and this row copies the vLLM
spec-decode counters that `generate` recorded in each variant's run folder
(`logs/summaries/spec_decode.jsonl`, which `plan.calibrate=` reads: plan/speculative.py). vLLM's CPU build cannot load fp8 weights
(engines/vllm/quantization.py): `--dry-run` composes the variants and prints plan's predictions
without loading a model, which is what runs without a GPU (tests/test_fp8_spec.py)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_row  # noqa: E402

ROLES = ("assistant", "user_agent", "judge")
# defined: vLLM's n-gram proposer settings of the row: 3 tokens drafted a step from a repeat of up to 4
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}


def variants(ngram: dict = NGRAM) -> dict[str, list[str]]:
    """Each variant's overrides, every role alike (one engine): bf16, fp8 weights, each with n-gram drafts."""
    fp8 = [f"{r}.quantization=fp8" for r in ROLES]
    block = "{" + ",".join(f"{k}:{v}" for k, v in ngram.items()) + "}"
    drafts = [f"{r}.speculative={block}" for r in ROLES]
    return {"bf16": [], "fp8 weights": fp8, "bf16 + ngram": drafts, "fp8 weights + ngram": fp8 + drafts}


def line(name: str, row: dict) -> str:
    plan = row["plan"]
    measured = f"{row['tokens_per_s']:,.1f} tokens/s measured, " if "tokens_per_s" in row else ""
    return f"{name}: {measured}plan {plan.get('tokens_per_s', 0):,.1f} tokens/s, KV {plan.get('kv_tokens')}" + (
        f", {plan['not_modelled']}" if "not_modelled" in plan else ""
    )


def run(args: argparse.Namespace, work: Path) -> dict:
    """Every variant measured (or, with --dry-run, only composed and predicted)."""
    model = gpu_row.model_dir(args.arch, work / "model", args.tokenizer)
    result: dict = {}
    for k, (name, extra) in enumerate(variants().items()):
        cfg = gpu_row.compose_config(args, model, work / f"variant-{k}", *extra)
        saved = work / f"variant-{k}.plan.json"
        plan = gpu_row.predicted(cfg, saved, args.gpu_type, args.plan_gib)
        steps = json.loads(saved.read_text())["placement"]["jobs"]["generate"]["throughput"]["decode_step"]
        if any(step["speculative"] and "tokens_per_step" not in step for step in steps.values()):
            plan["not_modelled"] = "speculative decoding not modelled (no measured acceptance rate)"
        row: dict = {"overrides": extra, "plan": plan}
        if not args.dry_run:
            from personalens.config import run as R
            from personalens.plan.speculative import read_spec_decode
            from personalens.simulate.command import generate

            loader = R.engines(cfg, ("user_agent", "assistant"))
            row["load_s"] = gpu_row.timed(f"{name}: model load", loader)
            seconds = gpu_row.timed(f"{name}: generate", lambda cfg=cfg, loader=loader: generate(cfg, loader))
            row |= gpu_row.measured(Path(cfg.run.out_dir), seconds)
            engines = {id(e): e for e in loader().values()}.values()
            row["kv_tokens"] = [getattr(e, "kv_tokens", None) for e in engines]
            # the counters generate recorded, where `plan.calibrate=<this variant's out_dir>` reads them
            row["spec_decode"] = {m: vars(s) for m, s in read_spec_decode(Path(cfg.run.out_dir)).items()}
            for engine in engines:
                engine.close()
        result[name] = row
        print(line(name, row), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data_root", type=Path, help="a small root to copy users from (the excerpt)")
    parser.add_argument("--arch", default="llama31_8b", choices=sorted(gpu_row.ARCHS))
    parser.add_argument("--users", default="0", help="data.users: N or A-B (the data root's users copied to B + 1)")
    parser.add_argument("--protocol", default="paper")
    parser.add_argument("--rounds", default="2,3", help="round caps SD,MD (every dialogue runs to its cap)")
    parser.add_argument("--reply-tokens", default="60,200", help="user,assistant reply budgets")
    parser.add_argument("--judge-tokens", type=int, default=None)
    parser.add_argument("--tokenizer", type=Path, default=None, help="a folder with SmolLM2's tokenizer files")
    parser.add_argument("--gpu-type", default="h200", help="plan.gpu_type of the predictions")
    parser.add_argument("--plan-gib", type=float, default=140.4, help="the GPU's memory the predictions plan for")
    parser.add_argument("--record", type=Path, default=gpu_row.REPO / "bench" / "results")
    parser.add_argument("--dry-run", action="store_true", help="compose and predict only; load no model")
    parser.add_argument("--keep", type=Path, help="work here (and keep it) instead of a temporary folder")
    args = parser.parse_args()
    args.tiny, args.cohorts, args.arch_config = False, False, args.arch
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        from release_copy import replicate

        args.root = replicate(args.data_root, int(args.users.split("-")[-1]) + 1, work / "data")
        result = run(args, work)
    stamp = time.strftime("%Y-%m-%d-%H%M%S", time.gmtime())
    kind = "dry-run" if args.dry_run else args.gpu_type
    args.record.mkdir(parents=True, exist_ok=True)
    out = args.record / f"fp8-spec-{kind}-{stamp}.json"
    out.write_text(json.dumps({"arch": args.arch, "users": args.users, "variants": result}, indent=2, default=str))
    print(f"recorded in {out}")
    print("RESULT " + json.dumps(result, default=str))


if __name__ == "__main__":  # vLLM spawns worker processes
    main()
