"""One configuration run several ways: how many dialogues come out identical, where the others first
differ, what that does to every Table 3 cell, and whether the judge gives the same scores in
batches of other sizes (docs/reproducibility.md).

The ways, each into its own output folder, each compared with `baseline` (one shard, the defaults):

- `repeat`: the same generate again;
- `shards-2`, `shards-4`: the same selection as 2 and 4 shards, one generate per shard in turn;
- `requests-per-call-4`: `lockstep.max_requests_per_call=4` (the baseline's 4096 puts a step's
  requests in one call);
- `continuous`: `scheduling=continuous`;
- `killed-resumed`: the real CLI in its own process, SIGKILLed (its process group, vLLM's
  processes too) as soon as its first dialogues are on disk, then run again, which resumes;
- `judge-chunk-N`: the baseline's dialogues (with `--judge-users`, those of some users) judged
  again with `judging.chunk=N`; `judge-chunk-512`, one call for all of them as `personalens run`
  makes it, is the reference of the others.

Everything but `killed-resumed` runs the real `generate` and `judge` commands in this process on one
engine (the embedded model loaded once; its prefix cache emptied before each command, so each starts
as a fresh process does). The Table 3 of each generate way is judged in one pass over every distinct
dialogue of all of them, so a cell's change comes from the dialogues alone (a later run of the bench
with more ways judges only the dialogues not judged before); the judge ways show what batch sizes do
to the judge on its own. Table 3 comes from the report's loader and table code, its
intervals from the report's bootstrap (1000 resamples, seed 0).

    python bench/reproducibility.py                   # everything, on the bundled sample's users 0-2
    python bench/reproducibility.py --only baseline,repeat,judge-chunk-512,judge-chunk-16

Ways run in the order given. A way whose folder holds its record (`bench.json`) is not run again,
so a stopped bench resumes; `--fresh` starts over; `--no-run` compares the ways recorded so far.
It prints its measurements and writes them to `<out>/results.json`.

Two checks stand apart from the ways (each alone, then nothing else runs):

    python bench/reproducibility.py --same-command 2  # the CLI in fresh processes, without and with reproducible=true
    python bench/reproducibility.py --vllm-alone 3    # vLLM alone: the same batch 3 times, compared bit for bit

`--set KEY=VALUE` (repeatable) adds a config override to every run, after the defaults above
(`--set protocol=paper` replaces `protocol=quick`).

`--same-command N` runs `personalens generate` N times without and N times with `reproducible=true`
(alternately, each in a fresh process), and gives each mode's generated tokens/s and how many
dialogues of each later run equal the first run's of its mode. `--vllm-alone N` gives one batch of
prompts to `vllm.LLM` N times in one process, its engine core in this process so that the batches are
the same (greedy, prefix caching off), and counts the prompts whose token ids and log-probabilities
came back bit-identical: whether vLLM's kernels on this machine give the same numbers for the same batch.
Both write `<out>/same-command.json` or `<out>/vllm-alone.json`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from personalens.config import register_resolvers
from personalens.config import run as R
from personalens.engines.dtype import read_cpu_flags
from personalens.judge.command import judge
from personalens.paths import PROJECT_ROOT
from personalens.report.paper_tables import table3
from personalens.simulate.command import generate
from personalens.store import (
    DIALOGUE_SCHEMA,
    JUDGMENT_KEY,
    JUDGMENT_SCHEMA,
    KEY_COLUMNS,
    PartWriter,
    read_summaries,
    read_table,
    shard_dir,
)
from personalens.store.results import load_runs
from personalens.tables.model import Table
from personalens.tables.stats import Bootstrap, Estimate

BASELINE = "baseline"
REFERENCE_JUDGE = "judge-chunk-512"
GENERATE_WAYS = ("baseline", "repeat", "shards-2", "shards-4", "requests-per-call-4", "continuous", "killed-resumed")
JUDGE_WAYS = (REFERENCE_JUDGE, "judge-chunk-16", "judge-chunk-1")
UNION = "judged-together"  # every distinct dialogue of the generate ways, judged in one pass


def loadavg() -> float:
    return round(os.getloadavg()[0], 2)


def timed(label: str, work: Callable[[], object]) -> dict:
    """Runs `work`; its wall time and the 1-minute load average before and after."""
    before, started = loadavg(), time.monotonic()
    work()
    return {"what": label, "seconds": round(time.monotonic() - started, 1), "load": [before, loadavg()]}


class Bench:
    def __init__(self, out: Path, users: str, judge_users: str | None = None, overrides: Sequence[str] = ()):
        self.out = out
        given = {o.split("=", 1)[0] for o in overrides}  # an override replaces a default's value
        defaults = [f"data.users={users}", "protocol=quick", "progress=false"]
        self.base = [o for o in defaults if o.split("=", 1)[0] not in given] + list(overrides)
        # the judge ways' selection: the baseline's dialogues of these users only (None: all)
        self.judge_users = [f"data.users={judge_users}"] if judge_users else []
        self._engines = None

    def config(self, folder: Path, *overrides: str) -> DictConfig:
        register_resolvers()
        with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
            given = {o.split("=", 1)[0] for o in overrides}  # an override replaces the base's value
            base = [o for o in self.base if o.split("=", 1)[0] not in given]
            return compose("config", overrides=[*base, f"run.out_dir={folder}", *overrides])

    def engines(self) -> Callable[[], dict]:
        """The one engine loader every in-process command shares, with an empty prefix cache."""
        if self._engines is None:
            self._engines = R.engines(self.config(self.out), ("user_agent", "assistant", "judge"))
        for engine in {id(e): e for e in self._engines().values()}.values():
            engine.reset_prefix_cache()
        return self._engines

    # ---- the ways ----------------------------------------------------------------------------------

    def run_way(self, name: str) -> list[dict]:
        folder = self.out / name
        folder.mkdir(parents=True)
        if name in (BASELINE, "repeat"):
            return [self.generate(folder)]
        if name.startswith("shards-"):
            n = int(name.split("-")[1])
            return [self.generate(folder, f"shard.index={i}", f"shard.count={n}") for i in range(n)]
        if name == "requests-per-call-4":
            return [self.generate(folder, "lockstep.max_requests_per_call=4")]
        if name == "continuous":
            return [self.generate(folder, "scheduling=continuous")]
        if name == "killed-resumed":
            first = self.cli_generate(folder, kill_when_written=True)
            written = sorted(map(list, keys_of(folder / "dialogues")))
            (folder / "before-kill.json").write_text(json.dumps(written))
            return [first, self.cli_generate(folder)]
        if name.startswith("judge-chunk-"):
            shutil.copytree(self.out / BASELINE / "dialogues", folder / "dialogues")
            chunk = name.rsplit("-", 1)[1]
            return [
                timed(
                    f"judge chunk {chunk}", lambda: judge(self.config(folder, f"judging.chunk={chunk}"), self.engines())
                )
            ]
        raise SystemExit(f"unknown way {name!r}")

    def generate(self, folder: Path, *overrides: str) -> dict:
        cfg = self.config(folder, *overrides)
        return timed(" ".join(["generate", *overrides]), lambda: generate(cfg, self.engines()))

    def cli_generate(self, folder: Path, *overrides: str, kill_when_written: bool = False) -> dict:
        """`personalens generate` in its own process group; with `kill_when_written`, SIGKILLed once
        its first dialogue part file is on disk."""
        args = ["generate", *self.base, *overrides, f"run.out_dir={folder}"]
        env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
        before, started, killed = loadavg(), time.monotonic(), False
        with open(folder / "cli.log", "a") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "personalens.cli", *args],
                cwd=PROJECT_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                while proc.poll() is None:
                    if kill_when_written and any((folder / "dialogues").rglob("part-*.parquet")):
                        os.killpg(proc.pid, signal.SIGKILL)
                        killed = True
                        break
                    time.sleep(0.2)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if proc.returncode != 0 and not killed:
            raise SystemExit(f"personalens {' '.join(args)} exited {proc.returncode}; see {folder / 'cli.log'}")
        what = "personalens generate (process" + (", SIGKILLed)" if killed else ")")
        return {"what": what, "seconds": round(time.monotonic() - started, 1), "load": [before, loadavg()]}

    def judge_together(self, ways: Sequence[str]) -> dict:
        """Judges every distinct dialogue of `ways` once, in one pass, then gives each way the
        judgments of its own dialogues, for the report's loader. Dialogues judged by an earlier pass
        are not judged again: each distinct one gets a trial number of its own, so the judge's
        resume skips them."""
        union = self.out / UNION
        folder = shard_dir(union, "dialogues", 0, 1)
        present = read_table(folder, ["run_id"])
        known = set(present.column("run_id").to_pylist()) if present is not None else set()
        new: dict[str, dict] = {}
        for name in ways:
            for row in read_table(self.out / name / "dialogues").to_pylist():
                if identity(row) not in known and identity(row) not in new:
                    new[identity(row)] = {**row, "run_id": identity(row), "trial": len(known) + len(new)}
        PartWriter(folder, DIALOGUE_SCHEMA).write(list(new.values()))
        spent = timed(f"judge {len(new)} distinct dialogues", lambda: judge(self.config(union), self.engines()))
        judged: dict[str, list[dict]] = {}
        for row in read_table(union / "judgments").to_pylist():
            judged.setdefault(row["run_id"], []).append(row)
        for name in ways:
            target = self.out / name / "judgments"
            shutil.rmtree(target, ignore_errors=True)
            mine = [
                {**j, "run_id": row["run_id"], "trial": row["trial"]}
                for row in read_table(self.out / name / "dialogues").to_pylist()
                for j in judged[identity(row)]
            ]
            PartWriter(shard_dir(self.out / name, "judgments", 0, 1), JUDGMENT_SCHEMA).write(mine)
        return {**spent, "ways": list(ways), "distinct_dialogues": len(known) + len(new), "judged_now": len(new)}


# ---- the checks apart from the ways ----------------------------------------------------------------


def same_command(bench: Bench, repeats: int) -> dict:
    """`personalens generate` `repeats` times per mode (without and with reproducible=true, alternately),
    each in a fresh process: each run's tokens/s, and each later run's dialogues against the first run
    of its mode."""
    modes = {"default": (), "reproducible": ("reproducible=true",)}
    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    for i in range(1, repeats + 1):
        for mode, overrides in modes.items():
            folder = bench.out / "same-command" / f"{mode}-{i}"
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            record = bench.cli_generate(folder, *overrides)
            (summary,) = read_summaries(folder, "generate")
            runs[mode].append({**record, **rate(summary), "folder": str(folder)})
            print(f"{mode}-{i}: {runs[mode][-1]}", flush=True)
    for mode_runs in runs.values():
        first = dialogue_turns(Path(mode_runs[0]["folder"]))
        for run in mode_runs[1:]:
            run["against_first"] = compare_dialogues(first, dialogue_turns(Path(run["folder"])))
    return {"machine": machine(), "overrides": bench.base, "runs": runs}


def rate(summary: dict) -> dict:
    """A generate summary's generated tokens, its generating seconds (the engine's load left out) and
    their rate."""
    seconds = summary["seconds"]
    tokens = summary["completion_tokens"]
    return {"tokens": tokens, "generate_s": round(seconds, 1), "tokens_per_s": round(tokens / seconds, 1)}


PROMPTS = tuple(
    f"In two sentences, {ask}"
    for ask in (
        "how do trains keep to a timetable?", "why is the sky blue?", "what makes a good restaurant review?",
        "how should I pick a movie for a rainy evening?", "what is a library card for?", "how do you book a hotel?",
        "why do birds migrate?", "what is the best way to learn to cook?", "how does a bicycle stay upright?",
        "what should I pack for a weekend trip?", "why do people keep diaries?", "how do you make a budget?",
        "what is jazz?", "how can I sleep better?", "why do leaves change color?", "what is a good first novel to read?",
    )
)  # fmt: skip


def vllm_alone(repeats: int) -> dict:
    """The same batch (PROMPTS, greedy, 64 tokens, each token's log-probability) given to one in-process
    `vllm.LLM` `repeats` times, its engine core in this process: per repeat, the prompts whose token
    ids and log-probabilities equal the first repeat's bit for bit."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # read when the engine is made
    from vllm import LLM, SamplingParams

    from personalens.engines.dtype import local_dtype
    from personalens.engines.models.config import ModelConfig
    from personalens.engines.models.embedded import model_path

    config = ModelConfig(name="SmolLM2-135M-Instruct")
    llm = LLM(
        model=model_path(config), dtype=local_dtype("auto").dtype, enforce_eager=True, enable_prefix_caching=False,
        kv_cache_memory_bytes=512 * 2**20, max_model_len=2048, block_size=32, seed=0,
    )  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=64, logprobs=1)
    messages = [[{"role": "user", "content": p}] for p in PROMPTS]
    outputs = []
    for _ in range(repeats):
        before, started = loadavg(), time.monotonic()
        replies = llm.chat(messages, params, use_tqdm=False)
        numbers = [replies_numbers(r.outputs[0]) for r in replies]
        outputs.append({"seconds": round(time.monotonic() - started, 1), "load": [before, loadavg()], "out": numbers})
    first = outputs[0]["out"]
    return {
        "machine": machine(),
        "dtype": local_dtype("auto").dtype,
        "prompts": len(PROMPTS),
        "repeats": [
            {"seconds": o["seconds"], "load": o["load"], "identical": same_numbers(first, o["out"])}
            for o in outputs[1:]
        ],
    }


def replies_numbers(output) -> list[tuple[int, float]]:
    """A completion's token ids, each with the log-probability vLLM gave it."""
    return [(token, step[token].logprob) for token, step in zip(output.token_ids, output.logprobs)]


def same_numbers(first: Sequence[list], other: Sequence[list]) -> int:
    """How many prompts' (token id, log-probability) lists are equal bit for bit."""
    return sum(a == b for a, b in zip(first, other, strict=True))


# ---- comparisons ----------------------------------------------------------------------------------


def identity(row: dict) -> str:
    """A dialogue's key and text: equal exactly when two runs made the same dialogue."""
    text = json.dumps([[row[c] for c in KEY_COLUMNS], [[t["role"], t["text"]] for t in row["turns"]]])
    return "d" + hashlib.sha256(text.encode()).hexdigest()[:16]


def keys_of(folder: Path) -> set[tuple]:
    table = read_table(folder, KEY_COLUMNS)
    return set() if table is None else set(zip(*(table.column(c).to_pylist() for c in KEY_COLUMNS)))


def dialogue_turns(run: Path) -> dict[tuple, list[tuple[str, str]]]:
    """(user, task, setting, trial) -> [(role, text), ...] of every dialogue of a run."""
    rows = read_table(run / "dialogues", [*KEY_COLUMNS, "turns"]).to_pylist()
    return {tuple(r[c] for c in KEY_COLUMNS): [(t["role"], t["text"]) for t in r["turns"]] for r in rows}


def first_difference(a: list[tuple[str, str]], b: list[tuple[str, str]]) -> int | None:
    """The index of the first turn (0: the user agent's opening) where two dialogues differ; one that
    stops earlier differs where it stops; None when they are identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_dialogues(base: dict, other: dict, subset: set[tuple] | None = None) -> dict:
    keys = sorted(k for k in base if subset is None or k in subset)
    absent = [k for k in keys if k not in other]
    if absent:
        raise SystemExit(f"{len(absent)} dialogues of the baseline are missing, e.g. {absent[0]}")
    firsts = {k: first_difference(base[k], other[k]) for k in keys}
    differing = {k: i for k, i in firsts.items() if i is not None}
    return {
        "dialogues": len(keys),
        "identical": len(keys) - len(differing),
        "first_differing_turn": dict(sorted(Counter(differing.values()).items())),
        "first_differing_role": dict(
            Counter(base[k][i][0] if i < len(base[k]) else "end" for k, i in differing.items())
        ),
    }


def judgments_of(run: Path) -> dict[tuple, tuple[float | None, str]]:
    table = read_table(run / "judgments", [*JUDGMENT_KEY, "score", "judge_text"])
    return {tuple(r[c] for c in JUDGMENT_KEY): (r["score"], r["judge_text"]) for r in table.to_pylist()}


def compare_judgments(base: dict, other: dict) -> dict:
    """The same judgments (same dialogues, same prompts) in two runs: same output, same score."""
    keys = sorted(base.keys() & other.keys())
    changed = Counter(k[4] for k in keys if base[k][0] != other[k][0])  # by dimension
    return {
        "judgments": len(keys),
        "same_text": sum(base[k][1] == other[k][1] for k in keys),
        "same_score": sum(base[k][0] == other[k][0] for k in keys),
        "score_changed_by_dimension": dict(changed),
        "unparsed": [sum(run[k][0] is None for k in keys) for run in (base, other)],
    }


def table3_of(run: Path) -> Table:
    return table3(load_runs([run]).judgments, Bootstrap(1000, 0))


def cell_changes(base: Table, other: Table) -> list[dict]:
    """Every Table 3 cell: the reference's mean, its 95% interval and n, and the other run's change."""
    out = []
    for (labels, cells), (other_labels, other_cells) in zip(base.rows, other.rows):
        if labels != other_labels:
            raise SystemExit(f"Table 3 rows differ: {labels} vs {other_labels}")
        for column, a, b in zip(base.columns, cells, other_cells):
            if isinstance(a, Estimate) and isinstance(b, Estimate):
                out.append(
                    {
                        "row": " / ".join(labels),
                        "cell": column.key,
                        "mean": round(a.mean, 3),
                        "lo": round(a.lo, 3),
                        "hi": round(a.hi, 3),
                        "n": a.n,
                        "change": round(b.mean - a.mean, 3),
                    }
                )
    return out


# ---- the whole bench ------------------------------------------------------------------------------


def machine() -> dict:
    with open("/proc/cpuinfo") as f:
        name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    flags = read_cpu_flags()
    return {
        "cpu": name,
        "cores": os.cpu_count(),
        "flags": [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags],
    }


def judged_ways(passes: Sequence[dict]) -> set[str]:
    return {way for p in passes for way in p["ways"]}


def judge_passes(bench: Bench, generated: Sequence[str], run: bool) -> list[dict]:
    """The judge passes over the generate ways' dialogues so far; with `run`, one more when a way
    is not judged yet."""
    record = bench.out / UNION / "bench.json"
    passes = json.loads(record.read_text()) if record.exists() else []
    if run and set(generated) - judged_ways(passes):
        passes.append(bench.judge_together(generated))
        record.write_text(json.dumps(passes, indent=1))
    return passes


def measure(bench: Bench, ways: Sequence[str], fresh: bool, run: bool = True) -> dict:
    """Runs the ways not yet recorded (none when not `run`), then compares those that are."""
    results = {"machine": machine(), "overrides": bench.base, "judge_ways": bench.judge_users, "ways": {}}
    for name in ways:
        folder, record = bench.out / name, bench.out / name / "bench.json"
        if run and folder.exists() and (fresh or not record.exists()):
            shutil.rmtree(folder)  # asked to, or a way that stopped half-way: start it over
        if run and not record.exists():
            record.write_text(json.dumps(bench.run_way(name), indent=1))
        if run and name in GENERATE_WAYS and name != BASELINE:
            # judged (with the baseline's) as soon as it is made, so a stopped bench has its Table 3
            judge_passes(bench, [w for w in ways[: ways.index(name) + 1] if w in GENERATE_WAYS], run=True)
        if record.exists():
            results["ways"][name] = {"runs": json.loads(record.read_text())}
            print(f"{name}: {sum(r['seconds'] for r in results['ways'][name]['runs']):.0f} s", flush=True)
    if BASELINE not in results["ways"]:
        return results

    generated = [w for w in ways if w in GENERATE_WAYS and w in results["ways"]]
    passes = judge_passes(bench, generated, run=False)
    judged = judged_ways(passes)
    if passes:
        results["judged_together"] = passes

    base_turns = dialogue_turns(bench.out / BASELINE)
    base_table = table3_of(bench.out / BASELINE) if BASELINE in judged else None
    for name in generated[1:]:
        entry, folder = results["ways"][name], bench.out / name
        turns = dialogue_turns(folder)
        entry["dialogues"] = compare_dialogues(base_turns, turns)
        if base_table and name in judged:
            entry["table3"] = cell_changes(base_table, table3_of(folder))
        if name == "killed-resumed":
            before = {tuple(k) for k in json.loads((folder / "before-kill.json").read_text())}
            entry["written_before_kill"] = compare_dialogues(base_turns, turns, before)
            entry["written_after_resume"] = compare_dialogues(base_turns, turns, set(base_turns) - before)
    if REFERENCE_JUDGE in results["ways"]:
        reference = bench.out / REFERENCE_JUDGE
        ref_judgments, ref_table = judgments_of(reference), table3_of(reference)
        others = [w for w in JUDGE_WAYS if w in results["ways"] and w != REFERENCE_JUDGE]
        for name in others:
            entry = results["ways"][name]
            entry["judgments"] = compare_judgments(ref_judgments, judgments_of(bench.out / name))
            entry["judgments"]["table3"] = cell_changes(ref_table, table3_of(bench.out / name))
        if BASELINE in judged:  # the same judgments made in the passes over every way's dialogues
            results["ways"][BASELINE]["judgments"] = compare_judgments(
                ref_judgments, judgments_of(bench.out / BASELINE)
            )
    return results


def markdown(results: dict) -> str:
    m, ways = results["machine"], results["ways"]
    out = [
        f"machine: {m['cpu']}, {m['cores']} cores, flags {' '.join(m['flags'])}; overrides {' '.join(results['overrides'])}"
        + (f"; judge ways: {' '.join(results['judge_ways'])}" if results["judge_ways"] else ""),
        "",
        "| way | wall s (load avg 1 min at start-end) | identical dialogues | first differing turn: dialogues "
        "| Table 3 cells changed | largest change |",
        "| --- | --- | --- | --- | --- | --- |",
    ]

    def runs(entry: dict) -> str:
        return "; ".join(
            f"{r['what']}: {r['seconds']:.0f} ({r['load'][0]:.1f}-{r['load'][1]:.1f})" for r in entry["runs"]
        )

    def changes(cells: list[dict] | None) -> str:
        if cells is None:
            return "not judged yet | -"
        changed = [c for c in cells if c["change"] != 0]
        largest = max(changed, key=lambda c: abs(c["change"]), default=None)
        biggest = f"{largest['change']:+.2f} ({largest['cell']})" if largest else "-"
        return f"{len(changed)} of {len(cells)} | {biggest}"

    for name, entry in ways.items():
        if "dialogues" in entry:
            d = entry["dialogues"]
            first = ", ".join(f"turn {t}: {n}" for t, n in d["first_differing_turn"].items()) or "-"
            out.append(
                f"| {name} | {runs(entry)} | {d['identical']} of {d['dialogues']} | {first} | {changes(entry['table3'])} |"
            )
        elif name in GENERATE_WAYS:
            out.append(f"| {name} | {runs(entry)} | | | | |")
    resumed = ways.get("killed-resumed", {})
    for part in ("written_before_kill", "written_after_resume"):
        if part in resumed:
            d = resumed[part]
            out.append(f"\nkilled-resumed, {part.replace('_', ' ')}: {d['identical']} of {d['dialogues']} identical")
    for r in results.get("judged_together", []):
        out.append(
            f"\nTable 3 of {', '.join(r['ways'])}: {r['distinct_dialogues']} distinct dialogues, {r['judged_now']} "
            f"judged in this pass, {r['seconds']:.0f} s (load {r['load'][0]:.1f}-{r['load'][1]:.1f})"
        )
    judged = [(n, e, e["judgments"]) for n, e in ways.items() if "judgments" in e]
    if judged:
        out += [
            "",
            f"Judging the baseline's dialogues, against {REFERENCE_JUDGE} (one call):",
            "",
            "| judged | wall s | same output | same score | scores changed, by dimension | unparsed (reference, this) "
            "| Table 3 cells changed | largest change |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for name, entry, j in judged:
            label = "in the passes over every way's dialogues" if name == BASELINE else name
            seconds = "" if name == BASELINE else f"{entry['runs'][0]['seconds']:.0f}"
            dims = ", ".join(f"{d}: {n}" for d, n in j["score_changed_by_dimension"].items()) or "-"
            out.append(
                f"| {label} | {seconds} | {j['same_text']} of {j['judgments']} | {j['same_score']} of {j['judgments']} "
                f"| {dims} | {j['unparsed'][0]}, {j['unparsed'][1]} | {changes(j.get('table3'))} |"
            )
    cells = [(n, e["table3"]) for n, e in ways.items() if "table3" in e]
    if cells:
        out += ["", "Table 3, baseline mean [95% CI] (n) and each generate way's change:", ""]
        out.append("| row | cell | baseline | " + " | ".join(n for n, _ in cells) + " |")
        out.append("| --- | --- | --- | " + " | ".join("---" for _ in cells) + " |")
        for k, c in enumerate(cells[0][1]):
            out.append(
                f"| {c['row']} | {c['cell']} | {c['mean']:.2f} [{c['lo']:.2f}, {c['hi']:.2f}] ({c['n']}) | "
                + " | ".join(f"{t[k]['change']:+.2f}" for _, t in cells)
                + " |"
            )
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "runs" / "reproducibility")
    every = ",".join((*GENERATE_WAYS, *JUDGE_WAYS))
    parser.add_argument("--only", default=every, help=f"ways, comma-separated (default: all, {every})")
    parser.add_argument("--users", default="0-2", help="data.users of the bundled sample (default 0-2)")
    parser.add_argument("--judge-users", help="judge ways: judge the baseline's dialogues of these users only")
    parser.add_argument("--fresh", action="store_true", help="run every way again")
    parser.add_argument("--no-run", action="store_true", help="run nothing: compare the ways already recorded")
    parser.add_argument("--same-command", type=int, metavar="N", help="only: the CLI N times per mode (see above)")
    parser.add_argument("--vllm-alone", type=int, metavar="N", help="only: vLLM alone, one batch N times")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a config override for every run (repeatable)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the commands' summary lines
    bench = Bench(args.out.resolve(), args.users, args.judge_users, args.set)
    for name, count, check in (
        ("same-command", args.same_command, lambda n: same_command(bench, n)),
        ("vllm-alone", args.vllm_alone, vllm_alone),
    ):
        if count:
            args.out.mkdir(parents=True, exist_ok=True)
            results = check(count)
            (args.out / f"{name}.json").write_text(json.dumps(results, indent=1))
            print(json.dumps(results, indent=1))
            return 0
    ways = [w for w in args.only.split(",") if w in (*GENERATE_WAYS, *JUDGE_WAYS)]  # in the order given
    unknown = {w for w in args.only.split(",") if w} - set(ways)
    if unknown:
        parser.error(f"unknown way(s) {sorted(unknown)}; the ways are {every}")
    ways = [BASELINE, *(w for w in ways if w != BASELINE)]
    results = measure(bench, ways, args.fresh, run=not args.no_run)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
