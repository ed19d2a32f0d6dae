"""`reproducible: true`: the platform decision on published GPU facts, the environment handed to
in-process engines and managed servers, the CPU build's mode (engine cores in this process, prefix
caching off, one cohort, managed servers refused through the real command line), the fingerprint, the
saved config and the report; and, through the real vLLM engine on this CPU, a run of the same command
stopped at a step boundary and resumed giving the same dialogues as the first."""

from __future__ import annotations

import gc
import json
import os

import pytest
from cli_helpers import read_rows, run_cli
from omegaconf import OmegaConf, open_dict
from test_engine_layout import Recorder, conf, paper_models
from test_fidelity import PromptRecorder, config

from personalens.config import run as R
from personalens.config.run import resolved
from personalens.engines import factory
from personalens.engines.factory import EngineLoader
from personalens.engines.placement.cohorts import setting as cohorts_setting
from personalens.engines.placement.gpus import GpuSpec, parse_nvidia_smi, simulated
from personalens.engines.serving.managed import server_env
from personalens.engines.stop import RESUMABLE, Stop, Stopped
from personalens.engines.vllm import invariance
from personalens.engines.vllm.args import cli_flags, engine_args
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
    assert "no NVIDIA GPU is visible" in invariance.refusal(None, cpu_build=False)
    # GPUs described to `plan`, or a capability nvidia-smi could not read, are not taken on trust
    assert "unknown" in invariance.refusal(simulated(4, 80), cpu_build=False)
    assert "unknown" in invariance.refusal(node("9.0", "[N/A]"), cpu_build=False)
    assert invariance.capability("12.1") > invariance.capability("9.0") > invariance.capability("8.9")


def test_the_mode_follows_the_platform():
    # vLLM's CPU build without GPUs makes the same batches (its engine cores in this process); GPUs
    # (NVIDIA's, or ones a plan describes) take the batch-invariant kernels, or are refused
    assert invariance.mode(None, cpu_build=True) is invariance.ENGINE_CORE_HERE
    assert invariance.refusal(None, cpu_build=True) is None
    assert invariance.ENGINE_CORE_HERE.env == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    for gpus, cpu_build in ((node("9.0"), True), (node("9.0"), False), (None, False)):
        assert invariance.mode(gpus, cpu_build) is invariance.BATCH_INVARIANT
    assert invariance.BATCH_INVARIANT.env == {"VLLM_BATCH_INVARIANT": "1"}
    assert not invariance.BATCH_INVARIANT.in_process_core


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

        def serve(self, decisions, log_dir, shard="", servers=None):
            for d in decisions:  # the launch environment start_servers builds from this process's
                env = server_env(d.run_config, d.device_ids, os.environ, log_dir / "s.log", "key")
                seen.append(("server", d.config.name, env.get("VLLM_BATCH_INVARIANT")))
            return super().serve(decisions, log_dir, shard, servers)

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
                assert load.batch_invariance.startswith("VLLM_BATCH_INVARIANT=1 and prefix caching off for Llama-3.1-")
                assert load.batch_invariance.endswith("compute capability 9.0")
                # what ran is kept beside the saved config
                cfg = OmegaConf.create({"assistant": {"engine": "vllm", "dtype": "auto"}})
                assert resolved(cfg, ("assistant",), load)["batch_invariance"] == load.batch_invariance
                monkeypatch.delenv("VLLM_BATCH_INVARIANT")
            else:
                assert load.batch_invariance is None


def test_on_gpus_the_mode_runs_engines_and_managed_servers_without_prefix_caching(tmp_path, monkeypatch):
    """A cached prompt prefix holds keys and values computed in other batches, which vLLM's batch
    invariance (a batch's size and order) does not cover: the vLLM arguments of every engine and
    managed server a planned GPU layout starts have prefix caching off in the mode, as on the CPU."""
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "unset")
    monkeypatch.delenv("VLLM_BATCH_INVARIANT")
    monkeypatch.setattr(factory, "vllm_is_cpu_build", lambda: False)
    managed = {
        "assistant": conf(tmp_path, "llama31_8b"),
        "judge": conf(tmp_path, "mistral7b_v02", placement="managed_server"),
    }
    for reproducible in (False, True):
        starting = Recorder()
        load = EngineLoader(
            managed,
            tmp_path / "logs",
            reproducible=reproducible,
            gpus=lambda: node(*["9.0"] * 4),
            build=starting.build,
            serve=starting.serve,
        )
        load()
        started = [d.run_config for d in starting.served] + [c for c in starting.built if c.engine == "vllm"]
        assert len(started) == 4  # the 8B in this process, three servers (the forced one and two copies)
        for model in started:
            args = engine_args(model, "/models/m", "bfloat16")
            assert args["enable_prefix_caching"] is not reproducible
            assert ("--no-enable-prefix-caching" in cli_flags(args)) is reproducible
        if reproducible:
            monkeypatch.delenv("VLLM_BATCH_INVARIANT")


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


def embedded(**override) -> dict:
    """The embedded model's config as conf/model/smollm2.yaml gives it."""
    return {"name": "SmolLM2-135M-Instruct", "enable_prefix_caching": True, **override}


def test_on_the_cpu_build_engines_run_their_core_here_without_prefix_caching(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "unset")  # restored "unset" at teardown
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING")
    monkeypatch.setattr(factory, "vllm_is_cpu_build", lambda: True)
    seen = []

    def build(config):
        seen.append((config.name, config.enable_prefix_caching, os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")))
        return Recorder().build(config)

    # distinct user agent and assistant configs: two engines, both started in the mode
    models = {"user_agent": embedded(), "assistant": embedded(max_num_seqs=64)}
    for reproducible, started in ((False, (True, None)), (True, (False, "0"))):
        seen.clear()
        load = EngineLoader(models, tmp_path / "logs", reproducible=reproducible, gpus=lambda: None, build=build)
        assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ  # nothing is set before an engine starts
        load()
        assert seen == [("SmolLM2-135M-Instruct", *started)] * 2
        assert load.in_process_core is reproducible
        if reproducible:
            assert load.batch_invariance == (
                "VLLM_ENABLE_V1_MULTIPROCESSING=0 and prefix caching off for SmolLM2-135M-Instruct on vLLM's CPU "
                "build: each engine's core in this process, one lockstep cohort"
            )
            assert "VLLM_BATCH_INVARIANT" not in os.environ
            monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING")
        else:
            assert load.batch_invariance is None


def test_on_the_cpu_build_generate_runs_one_cohort(tmp_path, monkeypatch):
    assert cohorts_setting("auto", one=True) == 1 and cohorts_setting("auto") == 0
    assert cohorts_setting(1, one=True) == 1 and cohorts_setting(3) == 3
    with pytest.raises(PersonalensError, match=r"lockstep.cohorts=2: reproducible: true on vLLM's CPU build runs one"):
        cohorts_setting(2, one=True)
    # through the command: refused with the loader of the mode, before anything is saved or loaded
    monkeypatch.setattr(factory, "vllm_is_cpu_build", lambda: True)
    recorder, out = Recorder(), tmp_path / "run"
    cfg = config(f"run.out_dir={out}", "reproducible=true", "lockstep.cohorts=2")
    load = EngineLoader(
        {"user_agent": embedded(), "assistant": embedded()}, tmp_path / "logs", reproducible=True,
        gpus=lambda: None, build=recorder.build,
    )  # fmt: skip
    with pytest.raises(PersonalensError, match="runs one cohort"):
        simulate_command.generate(cfg, load)
    assert recorder.built == [] and not (out / "generate.yaml").exists()


def test_managed_servers_are_refused_on_this_cpu_in_one_line_before_anything_is_saved(tmp_path, monkeypatch):
    monkeypatch.setattr(factory, "vllm_is_cpu_build", lambda: True)
    recorder = Recorder()
    with pytest.raises(PersonalensError, match="SmolLM2-135M-Instruct would run as a managed vLLM server"):
        EngineLoader(
            {"judge": embedded(placement="managed_server")}, tmp_path / "logs", reproducible=True,
            gpus=lambda: None, build=recorder.build, serve=recorder.serve,
        )  # fmt: skip
    assert recorder.built == [] and recorder.served == []
    # through the real command line on this machine's vLLM (its CPU build)
    out = tmp_path / "run"
    proc = run_cli(
        "generate", "data.users=0", "protocol=quick", "reproducible=true", "assistant.placement=managed_server",
        f"run.out_dir={out}", check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "would run as a managed vLLM server" in errors[0], proc.stderr[-2000:]
    assert "docs/reproducibility.md" in errors[0]
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

    for out, named in ((on, "reproducible engines (reproducible: true) in generate and judge"),
                       (before, "engines not batch-invariant")):  # fmt: skip
        report = build_report([out], out / "report", bootstrap=20)
        md = (out / "report" / "report.md").read_text()
        assert named in md and named.capitalize() in (out / "report" / "table3.md").read_text()
        assert report.setups[0].engines == named


def test_a_resume_that_changes_the_batch_settings_is_refused_in_the_mode_in_one_line(tmp_path):
    engine = PromptRecorder()
    engines = lambda: {"user_agent": engine, "assistant": engine, "judge": engine}  # noqa: E731
    on, off = tmp_path / "on", tmp_path / "off"
    for out, value in ((on, "true"), (off, "false")):
        cfg = config(f"run.out_dir={out}", f"reproducible={value}")
        assert simulate_command.generate(cfg, engines) == 0 and judge_command.judge(cfg, engines) == 0
    refused = [
        (simulate_command.generate, "assistant.max_num_seqs=7", "assistant.max_num_seqs (saved 256, now 7)"),
        (simulate_command.generate, "user_agent.block_size=64", "user_agent.block_size (saved 32, now 64)"),
        (simulate_command.generate, "assistant.max_num_batched_tokens=512", "assistant.max_num_batched_tokens"),
        (simulate_command.generate, "lockstep.max_requests_per_call=4", "lockstep.max_requests_per_call (saved 4096, now 4)"),
        (judge_command.judge, "judge.max_num_seqs=7", "judge.max_num_seqs (saved 256, now 7)"),
        (judge_command.judge, "judging.chunk=3", "judging.chunk (saved 512, now 3)"),
    ]  # fmt: skip
    for command, override, named in refused:
        with pytest.raises(PersonalensError) as err:
            command(config(f"run.out_dir={on}", "reproducible=true", override), engines)
        line = str(err.value)
        assert "\n" not in line and line.startswith("reproducible: true: this ") and named in line, line
        # without the mode they change how fast a run goes, not what it may resume
        assert command(config(f"run.out_dir={off}", "reproducible=false", override), engines) == 0
    # the same settings, or those that decide nothing about the batches, resume
    assert simulate_command.generate(config(f"run.out_dir={on}", "reproducible=true", "progress=false"), engines) == 0


def test_plan_states_the_mode_its_cost_and_whether_this_machine_takes_it(tmp_path):
    def plan(*args: str):
        out = tmp_path / "plan.json"
        proc = run_cli("plan", "protocol=quick", "data.users=0", *args, f"plan.out={out}", timeout=120)
        return proc.stdout, json.loads(out.read_text())["reproducible"]

    stdout, mode = plan()
    assert mode["on"] is False and "reproducible: off; engines are not batch-invariant" in stdout
    stdout, mode = plan("reproducible=true")  # this machine: vLLM's CPU build, no GPU
    assert mode["env"] == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} and "prefix caching off" in mode["cost"]
    assert "reproducible: on: same batches on vLLM's CPU build (VLLM_ENABLE_V1_MULTIPROCESSING=0)" in stdout
    assert "on this machine (vLLM's CPU build): each in-process engine's core in this process" in stdout
    assert "one lockstep cohort; managed servers refused" in mode["here"]
    stdout, mode = plan("reproducible=true", "plan.gpus=4", "plan.gpu_memory_gib=80")
    assert mode["env"] == {"VLLM_BATCH_INVARIANT": "1"} and "throughput cost" in mode["cost"]
    assert "reproducible: on: batch-invariant kernels (VLLM_BATCH_INVARIANT=1)" in stdout
    assert mode["here"].startswith("on the GPUs given: needs compute capability 8.0 or higher")


class Recording:
    """An engine that records each call's requests (seed, prompt token ids) and replies, and requests
    `stop` once `stop_after` calls have finished; everything else is the engine's."""

    def __init__(self, engine, stop: Stop | None = None, stop_after: int = 0):
        self.engine, self.stop, self.stop_after = engine, stop, stop_after
        self.calls: list[list[tuple]] = []

    def generate(self, requests, on_finished=None):
        replies = self.engine.generate(requests, on_finished)
        self.calls.append([(r.sampling.seed, tuple(r.prompt_ids or ()), g.text) for r, g in zip(requests, replies)])
        if len(self.calls) == self.stop_after:
            self.stop.request(Stopped("stopped by the test", RESUMABLE))
        return replies

    def __getattr__(self, name):
        return getattr(self.engine, name)


# user 0's 4 single-domain dialogues of up to 2 rounds, short replies, a small KV cache: 5 or 6 steps of
# one call each
SMALL = (
    "reproducible=true", "data.kinds=SD", "protocol.max_rounds_sd=2", "protocol.user_agent.max_tokens=16",
    "protocol.assistant.max_tokens=24",
    *(f"{role}.{k}={v}" for role in ("user_agent", "assistant")
      for k, v in (("kv_cache_memory_bytes", 256 * 2**20), ("max_model_len", 2048))),
)  # fmt: skip


@pytest.mark.vllm
def test_on_this_cpu_a_stopped_and_resumed_run_of_the_same_command_gives_the_same_dialogues(tmp_path, monkeypatch):
    pytest.importorskip("vllm")
    from vllm import envs

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "unset")  # restored "unset" at teardown
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING")
    # set by the engine when it starts (cpu_reserved_cores); restored as it was at teardown
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "0"))
    # one engine, loaded in the mode by the command's own loader, runs the command twice: once whole,
    # then stopped at the end of its second step and run again, which resumes
    load = R.engines(config(f"run.out_dir={tmp_path / 'whole'}", *SMALL), simulate_command.ROLES)
    assert load.in_process_core  # this machine's vLLM is its CPU build
    engine = load()["assistant"]
    try:
        assert engine is load()["user_agent"] and engine.overlaps is False

        def run(name: str, recording: Recording, stop: Stop | None = None):
            cfg = config(f"run.out_dir={tmp_path / name}", *SMALL)
            return simulate_command.generate(cfg, lambda: {"user_agent": recording, "assistant": recording}, stop)

        whole = Recording(engine)
        assert run("whole", whole) == 0
        stop = Stop()
        stopped, resumed = Recording(engine, stop, stop_after=2), Recording(engine)
        with pytest.raises(Stopped):
            run("resumed", stopped, stop)
        assert len(stopped.calls) == 2 and len(whole.calls) > 3  # stopped mid-dialogue, at a step's end
        assert run("resumed", resumed) == 0
    finally:
        engine.close()
        # vLLM's engine core in this process caches vLLM's environment and freezes the heap it found
        envs.disable_envs_cache()
        gc.unfreeze()
        gc.collect()

    def rows(name: str) -> dict[tuple, dict]:
        got = {(r["user_id"], r["task_id"], r["trial"]): r for r in read_rows(tmp_path / name / "dialogues")}
        return {key: {f: r[f] for f in ("turns", "rounds", "ended", "error", "seed")} for key, r in got.items()}

    # every call the same: its requests in order, their seeds and prompt token ids, and their replies
    assert stopped.calls + resumed.calls == whole.calls
    assert len(rows("whole")) == 4 and rows("resumed") == rows("whole")
