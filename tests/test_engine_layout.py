"""The engines' layout wired to model configs, pure: config -> plan -> what each engine or server is
started with; a layout that cannot fit refused before any engine is made. Published architectures
(tests/fixtures/architectures) stand for the paper's models on simulated 80 GB GPUs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from personalens.config.core import model_identity
from personalens.engines.config import ModelConfig, ModelConfigError
from personalens.engines.factory import EngineLoader
from personalens.engines.gpus import parse_nvidia_smi, simulated
from personalens.engines.layout import plan_layout
from personalens.engines.managed import serve_args, server_env
from personalens.engines.placement import GIB
from personalens.errors import PersonalensError

REPO = Path(__file__).resolve().parents[1]
ARCHITECTURES = Path(__file__).parent / "fixtures" / "architectures"
NODE_4X80 = simulated(4, 80)


def model_dir(tmp_path: Path, name: str) -> Path:
    """A model directory holding only config.json: the weights' size comes from the parameter count."""
    directory = tmp_path / name
    directory.mkdir(exist_ok=True)
    shutil.copy(ARCHITECTURES / f"{name}.json", directory / "config.json")
    return directory


def conf(tmp_path: Path, name: str, **overrides) -> dict:
    """conf/model/<name>.yaml with its path set to a fixture directory."""
    raw = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "model" / f"{name}.yaml"))
    return {**raw, "path": str(model_dir(tmp_path, name)), **overrides}


def paper_models(tmp_path: Path, **big) -> dict:
    """The paper's pairs: an 8B assistant, one 70B user agent and judge (tensor parallel 4)."""
    seventy = conf(tmp_path, "llama31_70b", **big)
    return {"assistant": conf(tmp_path, "llama31_8b"), "user_agent": seventy, "judge": dict(seventy)}


class Recorder:
    """Stands for the engine maker and the server starter: records, makes nothing."""

    def __init__(self):
        self.built: list[ModelConfig] = []
        self.served: list = []

    def build(self, config: ModelConfig):
        self.built.append(config)
        return config.name

    def serve(self, decisions, log_dir: Path) -> dict:
        self.served.extend(decisions)
        url = "http://127.0.0.1:{}/v1"
        return {
            d.config: ModelConfig(d.config.name, "server", server=_server(url.format(9000 + i)))
            for i, d in enumerate(decisions)
        }


def _server(url: str):
    from personalens.engines.config import ServerConfig

    return ServerConfig(base_url=url)


def loader(models: dict, tmp_path: Path, gpus, recorder: Recorder) -> EngineLoader:
    return EngineLoader(models, tmp_path / "logs", gpus=lambda: gpus, build=recorder.build, serve=recorder.serve)


def test_8b_assistant_with_70b_user_agent_and_judge_on_4x80gb_run_in_process_with_explicit_kv(tmp_path):
    recorder = Recorder()
    load = loader(paper_models(tmp_path), tmp_path, NODE_4X80, recorder)
    assistant, seventy = load.layout.decisions
    assert (assistant.roles, seventy.roles) == (("assistant",), ("user_agent", "judge"))
    assert {d.mode for d in load.layout.decisions} == {"in_process"}
    for d in (assistant, seventy):
        # the engine gets the planner's per-GPU KV bytes, and a memory share that covers only what it holds
        assert d.run_config.kv_cache_memory_bytes == d.placement.kv_cache_memory_bytes > 0
        held = d.placement.weights_per_gpu + 2 * GIB + d.placement.kv_cache_memory_bytes
        assert d.run_config.gpu_memory_utilization == pytest.approx(held / NODE_4X80.memory_bytes)
        assert d.placement.seqs_that_fit >= 32
    # GPU 0 holds both: their shares add up within the 90% vLLM may use
    assert assistant.run_config.gpu_memory_utilization + seventy.run_config.gpu_memory_utilization <= 0.9
    engines = load()
    assert engines == {
        "assistant": "Llama-3.1-8B-Instruct",
        "user_agent": "Llama-3.1-70B-Instruct",
        "judge": "Llama-3.1-70B-Instruct",
    }
    assert recorder.built == [assistant.run_config, seventy.run_config] and not recorder.served
    assert load() is engines  # made once
    lines = load.layout.lines()
    assert lines[0].startswith("placement on 4 GPU(s) of 80.0 GiB") and "in process on GPU 0,1,2,3" in lines[2]


@pytest.mark.parametrize("n_gpus", [1, 2])
def test_an_impossible_layout_is_refused_before_any_engine_is_made(tmp_path, n_gpus):
    recorder = Recorder()
    models = paper_models(tmp_path, tensor_parallel_size=n_gpus)
    with pytest.raises(PersonalensError, match=r"do not fit on .* GPU.*Llama-3.1-70B.*GiB per GPU.*Ways out"):
        loader(models, tmp_path, simulated(n_gpus, 80), recorder)
    assert recorder.built == [] and recorder.served == []


def test_models_too_large_to_share_get_managed_servers_on_their_own_gpus(tmp_path):
    recorder = Recorder()
    models = {"assistant": conf(tmp_path, "mixtral8x7b"), "user_agent": conf(tmp_path, "llama31_70b")}
    gpus = parse_nvidia_smi(
        "\n".join(f"{i}, GPU-{i}, 81559, 9.0" for i in range(8)), {"CUDA_VISIBLE_DEVICES": "7,6,5,4,3,2,1,0"}
    )
    load = loader(models, tmp_path, gpus, recorder)
    mixtral, seventy = load.layout.decisions
    assert [(d.mode, d.device_ids) for d in (mixtral, seventy)] == [
        ("managed_server", ("7", "6")),
        ("managed_server", ("5", "4", "3", "2")),
    ]
    assert mixtral.run_config.kv_cache_memory_bytes == mixtral.placement.kv_cache_memory_bytes
    engines = load()
    assert recorder.served == [mixtral, seventy]
    assert [c.engine for c in recorder.built] == ["server", "server"] and engines["assistant"] == mixtral.config.name


def test_explicit_gpus_and_placement(tmp_path):
    recorder = Recorder()
    models = {"assistant": conf(tmp_path, "llama31_8b", gpus=[3]), "judge": conf(tmp_path, "mistral7b_v02")}
    layout = loader(models, tmp_path, NODE_4X80, recorder).layout
    # GPU 3 is not where an in-process engine runs: the model gets a server there, and so does the other
    assert [(d.mode, d.device_ids) for d in layout.decisions] == [
        ("managed_server", ("3",)),
        ("managed_server", ("0",)),
    ]
    with pytest.raises(PersonalensError, match="placement in_process; an in-process engine uses GPUs"):
        loader(
            {"assistant": conf(tmp_path, "llama31_8b", gpus=[1], placement="in_process")}, tmp_path, NODE_4X80, recorder
        )
    forced = {"assistant": conf(tmp_path, "llama31_8b", placement="managed_server")}
    assert loader(forced, tmp_path, NODE_4X80, recorder).layout.decisions[0].mode == "managed_server"


def test_without_gpus_in_process_models_keep_todays_behaviour_and_forced_servers_are_honoured(tmp_path):
    recorder = Recorder()
    small = {"name": "a", "gpu_memory_utilization": 0.8, "kv_cache_memory_bytes": 2**29}
    served = {**small, "name": "b", "seed": 1, "placement": "managed_server", "cpu_reserved_cores": 0}
    load = loader({"user_agent": small, "assistant": dict(small), "judge": served}, tmp_path, None, recorder)
    a, b = load.layout.decisions
    assert (a.mode, a.roles, a.run_config.gpu_memory_utilization) == ("in_process", ("user_agent", "assistant"), 0.8)
    assert (b.mode, b.run_config, b.placement, b.device_ids) == ("managed_server", b.config, None, ())
    assert load.layout.lines()[0].startswith("placement not planned (no GPU")
    assert load.layout.as_dict()["models"][1] == {
        "model": "b",
        "roles": ["judge"],
        "mode": "managed_server",
        "kv_cache_memory_bytes": 2**29,
        "gpu_memory_utilization": 0.8,
    }
    engines = load()
    assert recorder.served == [b] and engines["judge"] == "b" and recorder.built[1].engine == "server"


def test_a_model_without_local_files_cannot_be_planned(tmp_path):
    with pytest.raises(PersonalensError, match=r"no .*config.json; placement sizes each model"):
        plan_layout({"assistant": ModelConfig("m", path=str(tmp_path))}, NODE_4X80)


def test_a_managed_server_gets_every_model_setting_on_vllms_command_line(tmp_path):
    config = ModelConfig(
        "served",
        tokenizer="/tok",
        dtype="bfloat16",
        tensor_parallel_size=2,
        kv_cache_memory_bytes=123,
        max_model_len=4096,
        enable_prefix_caching=False,
        enforce_eager=True,
        enable_chunked_prefill=False,
        seed=7,
        max_num_seqs=16,
        block_size=32,
        cpu_reserved_cores=0,
    )
    args = serve_args(config, "/weights", 8123, "bfloat16")
    pairs = dict(zip(args, args[1:]))
    assert pairs["--model"] == "/weights" and pairs["--served-model-name"] == "served" and pairs["--port"] == "8123"
    assert pairs["--host"] == "127.0.0.1" and pairs["--tokenizer"] == "/tok" and pairs["--dtype"] == "bfloat16"
    assert pairs["--tensor-parallel-size"] == "2" and pairs["--kv-cache-memory-bytes"] == "123"
    assert pairs["--max-model-len"] == "4096" and pairs["--seed"] == "7" and pairs["--max-num-seqs"] == "16"
    assert pairs["--block-size"] == "32" and pairs["--structured-outputs-config.backend"] == "xgrammar"
    for flag in (
        "--no-enable-prefix-caching",
        "--enforce-eager",
        "--no-enable-chunked-prefill",
        "--enable-prompt-tokens-details",
    ):
        assert flag in args
    plain = serve_args(ModelConfig("m"), "/w", 1, "auto")
    assert "--enable-prefix-caching" in plain and "--enforce-eager" not in plain and "--block-size" not in plain
    env = server_env(
        config,
        ("2", "3"),
        {"VLLM_CPU_NUM_OF_RESERVED_CPU": "1", "VLLM_API_KEY": "the user's"},
        tmp_path / "s.log",
        "k1",
    )
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"  # the user's wins
    assert env["VLLM_API_KEY"] == "k1" and not any("k1" in a for a in args)  # the key: not on the command line
    assert server_env(config, (), {}, tmp_path / "s.log", "k2")["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"


def test_nvidia_smi_rows_are_read_for_the_visible_gpus():
    rows = "0, GPU-a, 81559, 9.0\n1, GPU-b, 40960, 8.0\n2, GPU-c, 81559, 9.0\n"
    spec = parse_nvidia_smi(rows, {"CUDA_VISIBLE_DEVICES": "2,0"})
    assert (spec.count, spec.ids, spec.memory_bytes) == (2, ("2", "0"), 81559 * 2**20)
    assert spec.capabilities == ("9.0", "9.0")
    assert parse_nvidia_smi(rows, {}).memory_bytes == 40960 * 2**20  # the smallest of all three
    assert parse_nvidia_smi(rows, {"CUDA_VISIBLE_DEVICES": "GPU-b"}).ids == ("GPU-b",)
    assert parse_nvidia_smi("", {}) is None


def test_placement_settings_are_checked_and_left_out_of_the_fingerprint(tmp_path):
    config = ModelConfig.from_mapping({"name": "m", "tensor_parallel_size": 2, "gpus": [2, 3]})
    assert config.gpus == (2, 3) and hash(config)
    for raw, message in [
        ({"placement": "elsewhere"}, r"m\.placement: expected one of"),
        ({"gpus": [0, 0]}, r"m\.gpus: expected distinct GPU indices"),
        ({"gpus": "0"}, r"m\.gpus: expected a list"),
        ({"gpus": [0, 1]}, r"must list tensor_parallel_size=1"),
        (
            {"engine": "server", "server": {"base_url": "http://x/v1"}, "placement": "managed_server"},
            "apply to engine vllm",
        ),
    ]:
        with pytest.raises(ModelConfigError, match=message):
            ModelConfig.from_mapping({"name": "m", **raw}, where="m")
    base = OmegaConf.create(conf(tmp_path, "llama31_8b"))
    moved = OmegaConf.merge(base, {"placement": "managed_server", "gpus": [1]})
    assert model_identity(base) == model_identity(moved)


def test_the_layout_is_saved_with_the_run_config(tmp_path):
    from personalens.config.run import resolved

    load = loader(paper_models(tmp_path), tmp_path, NODE_4X80, Recorder())
    cfg = OmegaConf.create({role: {"engine": "vllm", "dtype": "auto"} for role in ("user_agent", "assistant")})
    saved = resolved(cfg, ("user_agent", "assistant"), load)
    assert saved["placement"]["planned"] is True
    assert [m["mode"] for m in saved["placement"]["models"]] == ["in_process", "in_process"]
    assert json.loads(json.dumps(saved))  # plain data, as the saved YAML needs
    assert "placement" not in resolved(cfg, ("user_agent",), lambda: {})  # scripted engines have no layout
