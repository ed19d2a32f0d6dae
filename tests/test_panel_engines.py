"""A judge panel of two models on 8 simulated 80 GiB GPUs, through `personalens judge` with scripted
managed servers: real processes, started and stopped by the loader as vLLM servers are, each holding
its planned memory on its GPUs while it runs (the simulated GPUs' free memory is what the running ones
leave). Every judge's layout is planned before any server starts; each model's servers, copies
included, have exited before the next model's start is checked against the free memory; a start
onto memory still held is refused in one line."""

from __future__ import annotations

import dataclasses
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from test_engine_layout import model_dir
from test_fidelity import config
from test_judge_panel import Judge, by_key, generated

from personalens.engines import factory
from personalens.engines.models.config import ModelConfig, ServerConfig
from personalens.engines.models.embedded import embedded_model_dir
from personalens.engines.placement import free
from personalens.engines.placement.gpus import GpuSpec, simulated
from personalens.errors import PersonalensError
from personalens.judge import command as judge_command

DIALOGUE = "SmolLM2-135M-Instruct"  # the default user agent's and assistant's model
SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


class Node:
    """Simulated GPUs whose free memory is their total less what the live scripted servers hold."""

    def __init__(self, count: int = 8, gib: float = 80):
        self.spec = simulated(count, gib)
        self.servers: list[tuple] = []  # (model, Launched, gpus, bytes per GPU)
        self.events: list[tuple] = []  # ("read", held) | ("start", model, models still running)

    def live(self) -> list[tuple]:
        return [s for s in self.servers if s[1].process.poll() is None]

    def gpus(self) -> GpuSpec:
        held: dict[int, int] = defaultdict(int)
        for _, _, gpus, nbytes in self.live():
            for g in gpus:
                held[g] += nbytes
        self.events.append(("read", sum(held.values())))
        return dataclasses.replace(self.spec, free_bytes=tuple(self.spec.memory_bytes - held[g] for g in range(8)))

    def serve(self, decisions, log_dir: Path, shard: str, stop, servers) -> list[ModelConfig]:
        out = []
        for i, d in enumerate(decisions):
            self.events.append(("start", d.config.name, sorted({s[0] for s in self.live()})))
            launched = servers.launch(d.label, SLEEPER, {}, log_dir / f"scripted-{i}.log", 0, 2.0)
            held = int(d.run_config.gpu_memory_utilization * self.spec.memory_bytes)
            self.servers.append((d.config.name, launched, d.gpus, held))
            out.append(
                ModelConfig(d.config.name, "server", server=ServerConfig(base_url=f"http://127.0.0.1:{9000 + i}/v1"))
            )
        return out


def panel_config(tmp_path: Path, out: Path, *extra: str):
    """model@judge a Llama 3.1 70B, a second judge a Mixtral 8x7B, each as managed servers (the
    architectures' config.json for their sizes, the embedded model's tokenizer for their templates)."""
    seventy, mixtral = model_dir(tmp_path, "llama31_70b"), model_dir(tmp_path, "mixtral8x7b")
    tokenizer = embedded_model_dir()
    return config(
        f"run.out_dir={out}",
        "data.kinds=SD",
        "model@judge=llama31_70b",
        f"judge.path={seventy}",
        f"judge.tokenizer={tokenizer}",
        "judge.placement=managed_server",
        f"judges=[{{name: mix, model: mixtral8x7b, set: {{path: '{mixtral}', tokenizer: '{tokenizer}', "
        "placement: managed_server}}]",
        *extra,
    )


@pytest.fixture
def node(monkeypatch) -> Node:
    node = Node()
    judges: dict[str, Judge] = {}
    monkeypatch.setattr(factory, "visible_gpu_spec", node.gpus)
    monkeypatch.setattr(factory, "start_servers", node.serve)
    monkeypatch.setattr(factory, "build_engine", lambda config, stop=None: judges.setdefault(config.name, Judge()))
    node.judges = judges
    return node


def test_each_judge_model_starts_on_gpus_the_one_before_it_freed(tmp_path, node):
    out, _ = generated(tmp_path)
    assert judge_command.judge(panel_config(tmp_path, out)) == 0
    starts = [e for e in node.events if e[0] == "start"]
    # both layouts planned (the GPUs read once per model) before any server started
    assert [e[0] for e in node.events[:2]] == ["read", "read"] and node.events.index(starts[0]) > 2
    models = [e[1] for e in starts]
    assert models[0] == "Llama-3.1-70B-Instruct" and models[-1] == "Mixtral-8x7B-Instruct-v0.1"
    assert models.count("Llama-3.1-70B-Instruct") == 2 and models.count("Mixtral-8x7B-Instruct-v0.1") == 4  # copies
    first_mixtral = models.index("Mixtral-8x7B-Instruct-v0.1")
    # when the second model's servers start, none of the first's runs: its read before them saw all memory free
    assert starts[first_mixtral][2] == []
    read = node.events[node.events.index(starts[first_mixtral]) - 1]
    assert read == ("read", 0)
    assert not node.live()  # the last model's servers stopped too, the command ended
    keys = by_key(out)
    assert len(keys) == 2 and len(set(keys.values())) == 1  # both judges scored every dialogue
    assert set(node.judges) == {"Llama-3.1-70B-Instruct", "Mixtral-8x7B-Instruct-v0.1"}


def test_a_start_onto_memory_still_held_is_refused_in_one_line(tmp_path, node, monkeypatch):
    from personalens.engines.stop import Stop

    out, _ = generated(tmp_path)
    cfg = panel_config(tmp_path, out)
    stop = Stop()
    try:
        (first, second) = judge_command.judge_groups(cfg, None, stop)
        first.load()  # the first model's servers up, and not freed
        monkeypatch.setattr(free, "WAIT_S", 1.0)
        with pytest.raises(PersonalensError, match=r"do not hold free the memory .*GPU 0 \(0\) has .* GiB free"):
            second.load()
        assert [e[1] for e in node.events if e[0] == "start"] == ["Llama-3.1-70B-Instruct"] * 2  # nothing started
    finally:
        stop.close()
    assert not node.live()


def test_personalens_run_frees_the_dialogue_engines_before_the_judges_start(tmp_path, node, monkeypatch):
    """`personalens run` with the panel: the dialogue model (the embedded default, in this process
    and in copies on the GPUs it leaves free) is closed and its servers stopped before the first
    judge server starts, and the report has a Table 3 per judge."""
    from test_fidelity import PromptRecorder

    from personalens import cli

    class Dialogue(PromptRecorder):
        def close(self):
            node.events.append(("close", "dialogue"))

    scripted = Dialogue()
    judges = node.judges
    monkeypatch.setattr(
        factory,
        "build_engine",
        lambda config, stop=None: scripted if config.name == DIALOGUE else judges.setdefault(config.name, Judge()),
    )
    out = tmp_path / "run"
    assert cli.run(panel_config(tmp_path, out, "report.bootstrap=50")) == 0
    starts = [e for e in node.events if e[0] == "start"]
    first_judge = next(e for e in starts if e[1] != DIALOGUE)
    assert starts[0][1] == DIALOGUE and first_judge[2] == []  # the dialogue copies stopped before it
    assert ("close", "dialogue") in node.events[: node.events.index(first_judge)]
    assert scripted.requests and set(judges) == {"Llama-3.1-70B-Instruct", "Mixtral-8x7B-Instruct-v0.1"}
    assert (out / "report" / "table3_judge.csv").is_file() and (out / "report" / "table3_judge-mix.csv").is_file()
    assert not node.live()
