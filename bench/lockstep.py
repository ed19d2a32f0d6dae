"""Benchmark: lockstep simulation vs the original one-dialogue-at-a-time protocol.

On one engine and one model, the same N dialogues (fixed reply lengths, so the work is identical)
are simulated three ways, each with a cold prefix cache:
  sequential  one dialogue at a time, one request per generate call (the original code's shape)
  lockstep    all dialogues at once, one batched call per step (personalens)
  raw         the very requests lockstep sent, replayed straight to the engine: the engine's own
              batched throughput on the same tokens; lockstep / raw is the orchestration overhead.

    python bench/lockstep.py --dialogues 64 --rounds 2 --tokens 16
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import replace
from pathlib import Path

from omegaconf import OmegaConf

from personalens.engines.build import build_engines
from personalens.engines.base import Request, Sampling
from personalens.data import load_scenarios
from personalens.paths import project_path
from personalens.prompts.setting import PromptSetting
from personalens.prompts.templates import load_templates
from personalens.simulate.generate import Protocol, plan_dialogues, renderer
from personalens.simulate.lockstep import run_lockstep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dialogues", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="assistant replies per dialogue")
    parser.add_argument("--tokens", type=int, default=16, help="new tokens per reply (fixed)")
    parser.add_argument("--model", default=None, help="model path (default: the embedded SmolLM2-135M)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="with --model")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()

    model = OmegaConf.load(project_path("conf/model/smollm2.yaml"))  # the embedded default's settings
    model.max_num_seqs = args.max_num_seqs
    if args.model:
        model.name, model.path = Path(args.model).name, args.model
        model.kv_cache_memory_bytes, model.gpu_memory_utilization = None, args.gpu_memory_utilization
    engine = build_engines({"assistant": model})["assistant"]
    engines = {"user": engine, "assistant": engine}
    templates = load_templates()
    setting = PromptSetting("base")
    fixed = Sampling(temperature=0.0, max_tokens=args.tokens, min_tokens=args.tokens)
    protocol = Protocol(args.rounds, args.rounds, {"user": replace(fixed, temperature=0.5), "assistant": fixed})

    scenarios = load_scenarios(project_path("data/sample"))
    trials = -(-args.dialogues // len(scenarios))

    def fresh_dialogues():
        todo, _ = plan_dialogues(scenarios, setting, trials, 0, protocol, set())
        return todo[: args.dialogues]

    sent: list[list[Request]] = []

    render = renderer(templates, setting)
    class Recording:
        name = engine.name

        def generate(self, requests):
            sent.append(list(requests))
            return engine.generate(requests)

    def timed(fn):
        engine.reset_prefix_cache()
        started = time.perf_counter()
        tokens = fn()
        return tokens, time.perf_counter() - started

    engine.generate([Request([{"role": "user", "content": "Hello"}], fixed)])  # warm-up

    def lockstep():
        ds = fresh_dialogues()
        recorder = Recording()
        run_lockstep(ds, {"user": recorder, "assistant": recorder}, render, protocol.sampling, lambda _: None)
        return sum(t.completion_tokens for d in ds for t in d.turns)

    def sequential():
        ds = fresh_dialogues()
        for d in ds:
            run_lockstep([d], engines, render, protocol.sampling, lambda _: None)
        return sum(t.completion_tokens for d in ds for t in d.turns)

    def raw():
        return sum(g.completion_tokens for batch in sent for g in engine.generate(batch))

    results = {
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "model": model.name, "dialogues": args.dialogues, "rounds": args.rounds,
        "tokens_per_reply": args.tokens,
    }
    # lockstep first: raw replays the requests it sent
    for name, phase in (("lockstep", lockstep), ("sequential", sequential), ("raw_batched", raw)):
        tokens, seconds = timed(phase)
        results[name] = {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}
        print(f"{name:12s} {tokens:7d} tokens in {seconds:8.1f} s  = {tokens / seconds:8.1f} tokens/s", flush=True)
    results["generate_calls_lockstep"] = len(sent)
    results["lockstep_vs_sequential"] = results["lockstep"]["tokens_per_s"] / results["sequential"]["tokens_per_s"]
    results["lockstep_vs_raw"] = results["lockstep"]["tokens_per_s"] / results["raw_batched"]["tokens_per_s"]
    print(f"lockstep / sequential = {results['lockstep_vs_sequential']:.2f}x")
    print(f"lockstep / raw batched = {results['lockstep_vs_raw']:.3f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":  # vLLM spawns worker processes
    main()
