"""`reproducible: true`: the platform decision on published GPU facts, the environment handed to
in-process engines and managed servers, the refusal on this CPU through the real command line, the
fingerprint, the saved config and the report."""

from __future__ import annotations

import json
import os

import pytest
from cli_helpers import run_cli
from omegaconf import OmegaConf, open_dict
from test_engine_layout import Recorder, conf, paper_models
from test_fidelity import PromptRecorder, config

from personalens.config.run import resolved
from personalens.engines.factory import EngineLoader
from personalens.engines.placement.gpus import GpuSpec, parse_nvidia_smi, simulated
from personalens.engines.serving.managed import server_env
from personalens.engines.vllm import invariance
from personalens.errors import PersonalensError
from personalens.judge import command as judge_command
from personalens.report import build_report
from personalens.simulate import command as simulate_command

# compute capabilities as NVIDIA publishes them (developer.nvidia.com/cuda-gpus)
PUBLISHED = {
    "B200": "10.0",
    "H200": "9.0",
    "H100": "9.0",
    "L40S": "8.9",
    "L4": "8.9",
    "A10": "8.6",
    "A100": "8.0",
    "T4": "7.5",
    "V100": "7.0",
    "P100": "6.0",
}


def node(*capabilities: str) -> GpuSpec:
    rows = "\n".join(f"{i}, GPU-{i}, 81559, {cap}" for i, cap in enumerate(capabilities))
    return parse_nvidia_smi(rows, {})


@pytest.mark.parametrize("gpu", PUBLISHED)
def test_batch_invariance_is_accepted_from_compute_capability_8_0(gpu):
    why = invariance.refusal(node(PUBLISHED[gpu], PUBLISHED[gpu]), cpu_build=False)
    if invariance.capability(PUBLISHED[gpu]) >= (8, 0):
        assert why is None
    else:
        assert why.startswith("reproducible: true refused:") and f"compute capability {PUBLISHED[gpu]}" in why
        assert "shard count" in why and "\n" not in why


def test_the_refusal_names_what_the_platform_lacks():
    assert "10.0" not in invariance.refusal(node("10.0", "7.0"), cpu_build=False)  # the one that cannot
    assert "vLLM's CPU build has none" in invariance.refusal(None, cpu_build=True)
    assert "no NVIDIA GPU is visible" in invariance.refusal(None, cpu_build=False)
    # GPUs described to `plan`, or a capability nvidia-smi could not read, are not taken on trust
    assert "unknown" in invariance.refusal(simulated(4, 80), cpu_build=False)
    assert "unknown" in invariance.refusal(node("9.0", "[N/A]"), cpu_build=False)
    assert invariance.capability("12.1") > invariance.capability("9.0") > invariance.capability("8.9")


def test_batch_invariant_engines_and_servers_get_the_environment_when_they_start(tmp_path, monkeypatch):
    # set, then deleted: monkeypatch then restores "unset" at teardown, whatever the loader set (a bare
    # delenv of an absent variable records nothing, and the later delenv would restore "1" for every
    # test after this one, engines and SLURM jobs included)
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "unset")
    monkeypatch.delenv("VLLM_BATCH_INVARIANT")
    seen = []

    class Starting(Recorder):
        """Records what the in-process engines and the managed servers would be started with."""

        def build(self, config):
            seen.append(("engine", config.engine, os.environ.get("VLLM_BATCH_INVARIANT")))
            return super().build(config)

        def serve(self, decisions, log_dir, shard=""):
            for d in decisions:  # the launch environment start_servers builds from this process's
                env = server_env(d.run_config, d.device_ids, os.environ, log_dir / "s.log", "key")
                seen.append(("server", d.config.name, env.get("VLLM_BATCH_INVARIANT")))
            return super().serve(decisions, log_dir, shard)

    h100s = node(*["9.0"] * 4)
    # the paper's models share the GPUs in this process (the 70B holds four); a forced server gets its own
    in_process = paper_models(tmp_path)
    managed = {
        "assistant": conf(tmp_path, "llama31_8b"),
        "judge": conf(tmp_path, "mistral7b_v02", placement="managed_server"),
    }
    for models, started in (
        (in_process, [("engine", "vllm"), ("engine", "vllm")]),
        (
            managed,
            # the 8B on the first GPU in this process, the forced one a server on the next, a copy of
            # each (shared out by work) servers on the two GPUs left: every server gets the environment,
            # as the engine does
            [
                ("server", "Mistral-7B-Instruct-v0.2"),
                ("server", "Llama-3.1-8B-Instruct"),
                ("server", "Mistral-7B-Instruct-v0.2"),
                ("engine", "vllm"),
                *[("engine", "server")] * 3,
            ],
        ),
    ):
        for reproducible, value in ((False, None), (True, "1")):
            seen.clear()
            starting = Starting()
            load = EngineLoader(
                models,
                tmp_path / "logs",
                reproducible=reproducible,
                gpus=lambda: h100s,
                build=starting.build,
                serve=starting.serve,
            )
            assert "VLLM_BATCH_INVARIANT" not in os.environ  # nothing is set before an engine starts
            load()
            assert seen == [(*where, value) for where in started]
            if reproducible:
                assert load.batch_invariance.startswith("VLLM_BATCH_INVARIANT=1 for Llama-3.1-")
                assert load.batch_invariance.endswith("compute capability 9.0")
                # what ran is kept beside the saved config
                cfg = OmegaConf.create({"assistant": {"engine": "vllm", "dtype": "auto"}})
                assert resolved(cfg, ("assistant",), load)["batch_invariance"] == load.batch_invariance
                monkeypatch.delenv("VLLM_BATCH_INVARIANT")
            else:
                assert load.batch_invariance is None


def test_gpus_without_batch_invariant_kernels_are_refused_before_any_engine_is_made(tmp_path):
    recorder = Recorder()
    v100s = node(*["7.0"] * 4)
    with pytest.raises(PersonalensError, match=r"refused: .* compute capability 7\.0"):
        EngineLoader(
            paper_models(tmp_path), tmp_path / "logs", reproducible=True, gpus=lambda: v100s, build=recorder.build
        )
    assert recorder.built == [] and recorder.served == []


def test_endpoints_alone_need_no_platform(tmp_path, caplog):
    endpoint = {"name": "remote", "engine": "server", "server": {"base_url": "http://127.0.0.1:9/v1"}}
    invariant = EngineLoader({"judge": endpoint}, tmp_path / "logs", reproducible=True, gpus=lambda: None)
    assert invariant.batch_invariance is None  # nothing is started here: nothing to make invariant
    assert "remote answer(s) from an endpoint personalens does not start" in caplog.text


def test_refused_on_this_cpu_in_one_line_before_anything_is_saved(tmp_path):
    out = tmp_path / "run"
    for command in ("run", "generate"):
        proc = run_cli(
            command, "data.users=0", "protocol=quick", "reproducible=true", f"run.out_dir={out}", check=False
        )
        assert proc.returncode == 2
        errors = [line for line in proc.stderr.splitlines() if "error" in line]
        assert len(errors) == 1 and "vLLM's CPU build has none" in errors[0] and "docs/reproducibility.md" in errors[0]
        assert not (out / "generate.yaml").exists() and not (out / "dialogues").exists()


def test_the_option_is_in_the_fingerprint_the_saved_config_and_the_report(tmp_path):
    engine = PromptRecorder()
    engines = lambda: {"user_agent": engine, "assistant": engine, "judge": engine}  # noqa: E731
    before, off, on = tmp_path / "before", tmp_path / "off", tmp_path / "on"
    old = config(f"run.out_dir={before}")
    with open_dict(old):
        del old["reproducible"]  # a config as saved before the option existed
    assert simulate_command.generate(old, engines) == 0 and judge_command.judge(old, engines) == 0
    for out, value in ((off, "false"), (on, "true")):
        cfg = config(f"run.out_dir={out}", f"reproducible={value}")
        assert simulate_command.generate(cfg, engines) == 0 and judge_command.judge(cfg, engines) == 0

    def saved(out, step):
        return OmegaConf.load(out / f"{step}.yaml")

    for step in ("generate", "judge"):
        # without the option a run keeps the fingerprint it had before the option existed (and resumes)
        assert saved(off, step).fingerprint == saved(before, step).fingerprint != saved(on, step).fingerprint
        assert saved(on, step).config.reproducible is True and saved(off, step).config.reproducible is False
    with pytest.raises(PersonalensError, match="different configuration"):
        simulate_command.generate(config(f"run.out_dir={on}"), engines)  # not mixed into one output

    for out, named in ((on, "batch-invariant engines (reproducible: true) in generate and judge"),
                       (before, "engines not batch-invariant")):  # fmt: skip
        report = build_report([out], out / "report", bootstrap=20)
        md = (out / "report" / "report.md").read_text()
        assert named in md and named.capitalize() in (out / "report" / "table3.md").read_text()
        assert report.setups[0].engines == named


def test_plan_states_the_mode_its_cost_and_whether_this_machine_takes_it(tmp_path):
    def plan(*args: str):
        out = tmp_path / "plan.json"
        proc = run_cli("plan", "protocol=quick", "data.users=0", *args, f"plan.out={out}", timeout=120)
        return proc.stdout, json.loads(out.read_text())["reproducible"]

    stdout, mode = plan()
    assert mode["on"] is False and "reproducible: off; engines are not batch-invariant" in stdout
    stdout, mode = plan("reproducible=true")
    assert mode["env"] == {"VLLM_BATCH_INVARIANT": "1"} and "throughput cost" in mode["cost"]
    assert "reproducible: on: every engine started batch-invariant (VLLM_BATCH_INVARIANT=1)" in stdout
    assert "on this machine: reproducible: true refused: " in stdout and "CPU build has none" in mode["here"]
    _, mode = plan("reproducible=true", "plan.gpus=4", "plan.gpu_memory_gib=80")
    assert mode["here"].startswith("on the GPUs given: needs compute capability 8.0 or higher")
