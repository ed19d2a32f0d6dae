"""The engines' layout wired to model configs, pure: config -> plan -> what each engine or server is
started with; a layout that cannot fit refused before any engine is made. Published architectures
(tests/fixtures/architectures) stand for the paper's models on simulated 80 GB GPUs."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from engine_fixtures import EVERY_SETTING
from omegaconf import OmegaConf

from personalens.config.core import model_identity
from personalens.engines.factory import EngineLoader
from personalens.engines.models.config import ModelConfig, ModelConfigError
from personalens.engines.models.embedded import EmbeddedModelError, embedded_model_dir
from personalens.engines.placement.gpus import GIB, parse_nvidia_smi, simulated
from personalens.engines.placement.layout import plan_layout
from personalens.engines.placement.sizing import model_need
from personalens.engines.replicated import ReplicatedEngine
from personalens.engines.serving.managed import log_path, serve_args, server_env
from personalens.engines.vllm.args import cli_flags, engine_args
from personalens.errors import PersonalensError

REPO = Path(__file__).resolve().parents[1]
ROLES_DIALOGUE = ("user_agent", "assistant")
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
    """Stands for the engine maker and the server starter: records, and makes engines that are only
    their name and config."""

    def __init__(self):
        self.built: list[ModelConfig] = []
        self.served: list = []

    def build(self, config: ModelConfig):
        self.built.append(config)
        return SimpleNamespace(name=config.name, config=config)

    def serve(self, decisions, log_dir: Path, shard: str, servers=None) -> dict:
        self.served.extend(decisions)
        self.shard = shard
        url = "http://127.0.0.1:{}/v1"
        return [
            ModelConfig(d.config.name, "server", server=_server(url.format(9000 + i))) for i, d in enumerate(decisions)
        ]


def _server(url: str):
    from personalens.engines.models.config import ServerConfig

    return ServerConfig(base_url=url)


def loader(models: dict, tmp_path: Path, gpus, recorder: Recorder, **kw) -> EngineLoader:
    return EngineLoader(models, tmp_path / "logs", gpus=lambda: gpus, build=recorder.build, serve=recorder.serve, **kw)


def test_8b_assistant_with_70b_user_agent_and_judge_on_4x80gb_run_in_process_with_explicit_kv(tmp_path):
    recorder = Recorder()
    load = loader(paper_models(tmp_path), tmp_path, NODE_4X80, recorder)
    assistant, seventy = load.layout.placements
    assert (assistant.roles, seventy.roles) == (("assistant",), ("user_agent", "judge"))
    assert {d.mode for d in load.layout.placements} == {"in_process"}
    for d in (assistant, seventy):
        # the engine gets the planner's per-GPU KV bytes, and a memory share that covers only what it holds
        assert d.run_config.kv_cache_memory_bytes == d.kv_cache_memory_bytes > 0
        p = d
        held = p.weights_per_gpu + 2 * GIB + p.activation_per_gpu + p.kv_cache_memory_bytes
        assert d.run_config.gpu_memory_utilization == pytest.approx(held / NODE_4X80.memory_bytes)
        assert p.max_len_seqs >= 1
    # GPU 0 holds both: their shares add up within the 90% vLLM may use
    assert assistant.run_config.gpu_memory_utilization + seventy.run_config.gpu_memory_utilization <= 0.9
    engines = load()
    assert {role: e.name for role, e in engines.items()} == {
        "assistant": "Llama-3.1-8B-Instruct",
        "user_agent": "Llama-3.1-70B-Instruct",
        "judge": "Llama-3.1-70B-Instruct",
    }
    assert recorder.built == [assistant.run_config, seventy.run_config] and not recorder.served
    assert load() is engines  # made once
    lines = load.layout.lines()
    assert lines[0].startswith("placement on 4 GPU(s) of 80.0 GiB") and "in process on GPU 0,1,2,3" in lines[2]
    # why: the other layout needs a GPU more than the node has
    assert lines[0].endswith("; every model in this process, sharing GPUs (own GPUs: they need 5 GPUs, the job has 4)")


@pytest.mark.parametrize("n_gpus", [1, 2])
def test_an_impossible_layout_is_refused_before_any_engine_is_made(tmp_path, n_gpus):
    recorder = Recorder()
    models = paper_models(tmp_path, tensor_parallel_size=n_gpus)
    with pytest.raises(PersonalensError, match=r"do not fit on .* GPU.*Llama-3.1-70B.*GiB per GPU.*Ways out"):
        loader(models, tmp_path, simulated(n_gpus, 80), recorder)
    assert recorder.built == [] and recorder.served == []


def test_models_too_large_to_share_get_gpus_of_their_own(tmp_path):
    recorder = Recorder()
    models = {"assistant": conf(tmp_path, "mixtral8x7b"), "user_agent": conf(tmp_path, "llama31_70b")}
    gpus = parse_nvidia_smi(
        "\n".join(f"{i}, GPU-{i}, 81559, 9.0" for i in range(8)), {"CUDA_VISIBLE_DEVICES": "7,6,5,4,3,2,1,0"}
    )
    load = loader(models, tmp_path, gpus, recorder, shard="shard-002-of-008")
    mixtral, seventy = load.layout.placements
    # the widest model on the first GPUs, in this process; the other a server on the next ones
    assert [(d.mode, d.device_ids, d.gpus) for d in (mixtral, seventy)] == [
        ("managed_server", ("3", "2"), (4, 5)),
        ("in_process", (), (0, 1, 2, 3)),
    ]
    assert mixtral.run_config.kv_cache_memory_bytes == mixtral.kv_cache_memory_bytes
    assert (
        load.layout.reason() == "each model on GPUs of its own (in process: they do not fit together on the first GPUs)"
    )
    # GPUs 6 and 7 hold a copy of Mixtral (the 70B needs four)
    assert [(c.device_ids, c.gpus) for c in mixtral.copies] == [(("1", "0"), (6, 7))]
    engines = load()
    assert recorder.served == [mixtral, *mixtral.copies] and recorder.shard == "shard-002-of-008"
    assert [c.engine for c in recorder.built] == ["server", "server", "vllm"]
    assert engines["assistant"].name == mixtral.config.name and len(engines["assistant"].engines) == 2


def test_free_gpus_hold_copies_by_work_and_replicas_n_asks_for_exactly_n(tmp_path):
    """8 x 80 GB: the 70B user agent in process on GPUs 0-3, the 8B assistant a server on GPU 4. `auto`
    gives GPUs 5-7 to copies of the 8B (the only model a copy of fits there), each a server with the KV
    cache it has alone on a GPU; one engine of the assistant then spreads the dialogues over all four."""
    recorder = Recorder()
    gpus = parse_nvidia_smi(
        "\n".join(f"{i}, GPU-{i}, 81920, 9.0" for i in range(8)), {"CUDA_VISIBLE_DEVICES": "7,6,5,4,3,2,1,0"}
    )
    dialogue = {"assistant": conf(tmp_path, "llama31_8b"), "user_agent": conf(tmp_path, "llama31_70b")}
    load = loader(dialogue, tmp_path, gpus, recorder)
    assistant, seventy = load.layout.placements
    assert [(c.copy, c.mode, c.gpus, c.device_ids) for c in assistant.copies] == [
        (1, "managed_server", (5,), ("2",)),
        (2, "managed_server", (6,), ("1",)),
        (3, "managed_server", (7,), ("0",)),
    ]
    assert seventy.copies == () and assistant.gpus == (4,)
    for c in assistant.copies:  # alone on a GPU of its own, as the 8B itself on GPU 4
        assert c.run_config == assistant.run_config and c.kv_cache_memory_bytes == assistant.kv_cache_memory_bytes
    lines = load.layout.lines()
    assert lines[1].endswith("memory share 0.900 + 3 copies in managed vLLM servers on GPU 5,6,7"), lines[1]
    assert lines[-1] == (
        "  copies: replicas auto shares the free GPUs out by work (3 copies of Llama-3.1-8B-Instruct: each next copy "
        "to the model whose engines take the longest per dialogue, as generated tokens x weights per GPU)"
    )
    saved = load.layout.as_dict()
    assert [c["cuda_visible_devices"] for c in saved["models"][0]["copies"]] == ["2", "1", "0"]
    engines = load()
    # the copies' servers start with the model's own, in one call
    assert recorder.served == [assistant, *assistant.copies]
    replicated = engines["assistant"]
    assert isinstance(replicated, ReplicatedEngine) and replicated.name == "Llama-3.1-8B-Instruct"
    assert [e.config.server.base_url for e in replicated.engines] == [
        f"http://127.0.0.1:{9000 + i}/v1" for i in range(4)
    ]
    assert engines["user_agent"].config == seventy.run_config  # built in this process, alone

    # replicas: 1 keeps the layout of before; replicas: 3, two copies, on the first free GPUs
    one = loader({**dialogue, "assistant": {**dialogue["assistant"], "replicas": 1}}, tmp_path, gpus, Recorder())
    assert [d.copies for d in one.layout.placements] == [(), ()] and len(one.layout.lines()) == 3
    three = loader({**dialogue, "assistant": {**dialogue["assistant"], "replicas": 3}}, tmp_path, gpus, Recorder())
    assert [c.gpus for c in three.layout.placements[0].copies] == [(5,), (6,)]
    assert three.layout.copies_why == "replicas 3 for Llama-3.1-8B-Instruct"
    # a judge alone: in process on GPUs 0-3, a copy on 4-7
    [judge] = loader({"judge": conf(tmp_path, "llama31_70b")}, tmp_path, gpus, Recorder()).layout.placements
    assert (judge.mode, [c.gpus for c in judge.copies]) == ("in_process", [(4, 5, 6, 7)])
    assert judge.line().endswith(" + 1 copy in a managed vLLM server on GPU 4,5,6,7")


def test_replicas_the_free_gpus_cannot_hold_are_refused_before_any_engine_is_made(tmp_path):
    recorder = Recorder()
    node = simulated(8, 80)
    for name, replicas, message in [
        (
            "llama31_8b",
            5,
            r"model Llama-3.1-8B-Instruct: replicas 5 asks for 5 engines: 4 more copies of 1 GPU\(s\) each need 4 "
            r"GPU\(s\), the layout leaves 3 free \(5, 6, 7\) of the job's 8\. Ways out: replicas auto",
        ),
        ("llama31_70b", 2, r"model Llama-3.1-70B-Instruct: replicas 2 asks for 2 engines: 1 more copy of 4 GPU"),
    ]:
        models = paper_models(tmp_path)
        for role in models:
            if models[role]["name"] == conf(tmp_path, name)["name"]:
                models[role] = {**models[role], "replicas": replicas}
        with pytest.raises(PersonalensError, match=message):
            loader({r: models[r] for r in ROLES_DIALOGUE}, tmp_path, node, recorder)
    assert recorder.built == [] and recorder.served == []


def test_without_gpus_replicas_are_managed_servers_or_refused(tmp_path):
    recorder = Recorder()
    small = {"name": "a", "kv_cache_memory_bytes": 2**29}
    with pytest.raises(
        PersonalensError, match=r"a \(assistant\): replicas 2: without GPUs .* set placement: managed_server"
    ):
        loader({"assistant": {**small, "replicas": 2}}, tmp_path, None, recorder)
    auto = loader({"assistant": small}, tmp_path, None, recorder)  # auto: one engine
    assert auto.layout.placements[0].copies == ()
    load = loader({"assistant": {**small, "replicas": 2, "placement": "managed_server"}}, tmp_path, None, recorder)
    [d] = load.layout.placements
    assert [(c.copy, c.mode, c.label) for c in d.copies] == [(1, "managed_server", "a (copy 1)")]
    assert d.line() == "  a (assistant): managed vLLM server, KV cache 0.50 GiB + 1 copy in a managed vLLM server"
    engines = load()
    assert recorder.served == [d, *d.copies] and isinstance(engines["assistant"], ReplicatedEngine)
    # a copy's server log is its own
    names = {log_path(tmp_path, d.run_config, "s", c.copy).name for c in (d, *d.copies)}
    assert len(names) == 2 and any(".copy1." in n for n in names)
    # scheduling=continuous keeps one engine of each dialogue model in this process
    with pytest.raises(
        PersonalensError, match=r"scheduling=continuous .* assistant: replicas 2 \(its copies are servers\)"
    ):
        loader(
            {"assistant": {**small, "replicas": 2}, "user_agent": small},
            tmp_path,
            NODE_4X80,
            recorder,
            in_process=frozenset(ROLES_DIALOGUE),
        )
    held = loader(paper_models(tmp_path), tmp_path, simulated(8, 80), recorder, in_process=frozenset(ROLES_DIALOGUE))
    assert all(d.copies == () for d in held.layout.placements)


def test_free_gpus_are_used_and_the_choice_is_said(tmp_path):
    recorder = Recorder()
    load = loader(paper_models(tmp_path), tmp_path, simulated(8, 80), recorder)
    assistant, seventy = load.layout.placements
    assert [(d.mode, d.gpus) for d in (assistant, seventy)] == [
        ("managed_server", (4,)),
        ("in_process", (0, 1, 2, 3)),
    ]
    assert (
        "each model on GPUs of its own: chosen, as it fits (each model gets whole GPUs; every model in this "
        in (load.layout.lines()[0])
    )
    # scheduling=continuous keeps the dialogue models in this process: they share the first GPUs
    held = loader(paper_models(tmp_path), tmp_path, simulated(8, 80), recorder, in_process=frozenset(ROLES_DIALOGUE))
    assert {d.mode for d in held.layout.placements} == {"in_process"}


def test_without_gpus_in_process_models_keep_todays_behaviour_and_forced_servers_are_honoured(tmp_path):
    recorder = Recorder()
    small = {"name": "a", "gpu_memory_utilization": 0.8, "kv_cache_memory_bytes": 2**29}
    served = {**small, "name": "b", "seed": 1, "placement": "managed_server", "cpu_reserved_cores": 0}
    load = loader({"user_agent": small, "assistant": dict(small), "judge": served}, tmp_path, None, recorder)
    a, b = load.layout.placements
    assert (a.mode, a.roles, a.run_config.gpu_memory_utilization) == ("in_process", ("user_agent", "assistant"), 0.8)
    assert (b.mode, b.run_config, b.planned, b.device_ids) == ("managed_server", b.config, False, ())
    assert load.layout.lines()[0].startswith("placement not planned (no GPU")
    assert load.layout.as_dict()["models"][1] == {
        "model": "b",
        "roles": ["judge"],
        "mode": "managed_server",
        "kv_cache_memory_bytes": 2**29,
        "gpu_memory_utilization": 0.8,
    }
    engines = load()
    assert recorder.served == [b] and engines["judge"].name == "b" and recorder.built[1].engine == "server"


def test_a_model_without_local_files_cannot_be_planned(tmp_path):
    with pytest.raises(PersonalensError, match=r"no .*config.json; placement sizes each model"):
        plan_layout({"assistant": ModelConfig("m", path=str(tmp_path))}, NODE_4X80)


def test_a_managed_server_gets_every_model_setting_on_vllms_command_line(tmp_path):
    config = EVERY_SETTING
    args = serve_args(config, "/weights", 8123, "bfloat16")
    pairs = dict(zip(args, args[1:]))
    assert pairs["--model"] == "/weights" and pairs["--served-model-name"] == "served" and pairs["--port"] == "8123"
    assert pairs["--host"] == "127.0.0.1" and pairs["--tokenizer"] == "/tok" and pairs["--dtype"] == "bfloat16"
    assert pairs["--tensor-parallel-size"] == "2" and pairs["--kv-cache-memory-bytes"] == "123"
    assert pairs["--max-model-len"] == "4096" and pairs["--seed"] == "7" and pairs["--max-num-seqs"] == "16"
    assert pairs["--block-size"] == "32" and pairs["--structured-outputs-config.backend"] == "xgrammar"
    assert pairs["--load-format"] == "dummy" and pairs["--max-num-batched-tokens"] == "8192"
    assert pairs["--kv-cache-dtype"] == "fp8" and pairs["--kv-offloading-size"] == "4.0"
    assert pairs["--kv-offloading-backend"] == "native" and pairs["--quantization"] == "fp8"
    for flag in (
        "--no-enable-prefix-caching",
        "--enforce-eager",
        "--no-enable-chunked-prefill",
        "--enable-prompt-tokens-details",
    ):
        assert flag in args
    # every engine argument of the in-process engine is among the server's flags, from the same source
    in_process = engine_args(config, "/weights", "bfloat16")
    assert args[: len(cli_flags(in_process))] == cli_flags(in_process)
    assert {f[2:].split(".")[0].replace("-", "_").removeprefix("no_") for f in args if f.startswith("--")} >= set(
        in_process
    )
    plain = serve_args(ModelConfig("m"), "/w", 1, "auto")
    assert "--enable-prefix-caching" in plain and "--no-enforce-eager" in plain and "--block-size" not in plain
    assert "--max-num-batched-tokens" not in plain and "--no-enable-chunked-prefill" not in plain  # vLLM's defaults
    assert not any(f.startswith("--kv-cache-dtype") or f.startswith("--kv-offloading") for f in plain)
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


def test_managed_server_logs_are_named_by_model_shard_and_config(tmp_path):
    a = ModelConfig("Llama 3/70B", seed=1)
    names = {
        log_path(tmp_path, c, shard).name
        for c in (a, dataclasses.replace(a, seed=2))
        for shard in ("shard-000-of-002", "shard-001-of-002")
    }
    assert len(names) == 4  # shards sharing an out_dir and a PID, or two configs of one name, never share a file
    name = log_path(tmp_path, a, "shard-001-of-002").name
    assert re.fullmatch(rf"vllm-server\.Llama_3_70B\.shard-001-of-002\.[0-9a-f]{{8}}\.{os.getpid()}\.log", name)


def test_a_dtype_override_changes_the_weights_size(tmp_path):
    """dtype float32 on the bfloat16 checkpoint: twice the weights and KV per token, sized from its files."""
    model = model_dir(tmp_path, "llama31_8b")
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 16_060_522_496}}))
    as_is = model_need(ModelConfig("m", path=str(model)), ("assistant",), "m")
    wide = model_need(ModelConfig("m", path=str(model), dtype="float32"), ("assistant",), "m")
    assert as_is.weights == 16_060_522_496 and wide.weights == 2 * as_is.weights
    assert wide.kv_per_token == 2 * as_is.kv_per_token
    # unset, max_model_len is the model's context; chunked prefill off makes vLLM batch a whole one
    assert (as_is.max_model_len, as_is.batched_tokens) == (131_072, 16_384)
    whole = model_need(ModelConfig("m", path=str(model), enable_chunked_prefill=False), ("assistant",), "m")
    assert whole.batched_tokens == 131_072


def test_continuous_scheduling_with_a_model_served_elsewhere_is_refused_before_anything_loads(tmp_path):
    recorder = Recorder()
    server = {"name": "s", "engine": "server", "server": {"base_url": "http://gpu-node:8000/v1"}}
    local = {"name": "a", "kv_cache_memory_bytes": 2**29}
    dialogue = frozenset(ROLES_DIALOGUE)
    cases = [
        ({"user_agent": server, "assistant": local}, r"user_agent: engine server at http://gpu-node:8000/v1"),
        (
            {"user_agent": local, "assistant": {**local, "name": "b", "placement": "managed_server"}},
            "placement managed",
        ),
    ]
    for models, reason in cases:
        for gpus in (None, NODE_4X80):
            with pytest.raises(
                PersonalensError, match=rf"scheduling=continuous runs the assistant and user_agent .*{reason}"
            ):
                loader(models, tmp_path, gpus, recorder, in_process=dialogue)
    assert recorder.built == [] and recorder.served == []
    # the judge may be served elsewhere: only the dialogue roles run in this process
    judged = loader({"assistant": local, "judge": server}, tmp_path, None, recorder, in_process=dialogue)
    assert [d.mode for d in judged.layout.placements] == ["in_process", "server"]


def test_nvidia_smi_rows_are_read_for_the_visible_gpus():
    rows = "0, GPU-a, 81559, 9.0\n1, GPU-b, 40960, 8.0\n2, GPU-c, 81559, 9.0\n"
    spec = parse_nvidia_smi(rows, {"CUDA_VISIBLE_DEVICES": "2,0"})
    assert (spec.count, spec.ids, spec.memory_bytes) == (2, ("2", "0"), 81559 * 2**20)
    assert spec.capabilities == ("9.0", "9.0")
    assert parse_nvidia_smi(rows, {}).memory_bytes == 40960 * 2**20  # the smallest of all three
    assert parse_nvidia_smi(rows, {"CUDA_VISIBLE_DEVICES": "GPU-b"}).ids == ("GPU-b",)
    assert parse_nvidia_smi("", {}) is None


def test_gpus_named_by_a_start_of_their_uuid_are_planned_and_mig_instances_are_warned_about(caplog):
    rows = "0, GPU-8932f937-d72c, 81559, 9.0\n1, GPU-1f2e3d4c-aaaa, 40960, 8.0\n"
    # CUDA takes a unique start of a UUID as the GPU
    spec = parse_nvidia_smi(rows, {"CUDA_VISIBLE_DEVICES": "GPU-1f2e,GPU-8932f937-d72c"})
    assert (spec.count, spec.ids, spec.memory_bytes) == (2, ("GPU-1f2e", "GPU-8932f937-d72c"), 40960 * 2**20)
    assert caplog.text == ""
    # a MIG instance is no GPU nvidia-smi lists: said, not taken quietly for a machine without GPUs
    with caplog.at_level(logging.WARNING, logger="personalens.engines.gpus"):
        assert parse_nvidia_smi(rows, {"CUDA_VISIBLE_DEVICES": "MIG-5c3d1a2b-0000"}) is None
    assert "the visible GPU(s) MIG-5c3d1a2b-0000 are no whole GPU that nvidia-smi lists" in caplog.text
    assert "every model runs in this process" in caplog.text


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
        ({"engine": "server", "server": {"base_url": "http://x/v1", "retries": -1}}, r"m\.server\.retries: must be 0"),
        (
            {"engine": "server", "server": {"base_url": "http://x/v1", "max_concurrency": 0}},
            "max_concurrency: must be at",
        ),
        ({"engine": "server", "server": {"base_url": "http://x/v1", "timeout_s": 0}}, "timeout_s: must be positive"),
        ({"tensor_parallel_size": 0}, r"m\.tensor_parallel_size: must be a positive"),
        ({"max_num_batched_tokens": -5}, "max_num_batched_tokens: must be a positive"),
        ({"kv_cache_memory_bytes": 0}, "kv_cache_memory_bytes: must be a positive"),
        ({"dtype": "fp8"}, r"m\.dtype: expected one of"),
        ({"replicas": 0}, r"m\.replicas: expected auto or a whole number of engines \(1 or more\), got 0"),
        ({"replicas": "two"}, r"m\.replicas: expected auto or a whole number .* got 'two'"),
        ({"replicas": True}, r"m\.replicas: expected int \| str, got True"),
        (
            {"engine": "server", "server": {"base_url": "http://x/v1"}, "replicas": 2},
            r"m\.replicas: 2 applies to engine vllm",
        ),
    ]:
        with pytest.raises(ModelConfigError, match=message):
            ModelConfig.from_mapping({"name": "m", **raw}, where="m")
    base = OmegaConf.create(conf(tmp_path, "llama31_8b"))
    moved = OmegaConf.merge(base, {"placement": "managed_server", "gpus": [1], "replicas": 3})
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


def test_what_the_config_alone_rules_out_is_refused_in_one_line_before_anything_is_written(tmp_path):
    """`personalens run` with a server-backed user agent under scheduling=continuous, a server with
    retries -1, or replicas a CPU cannot start or no number of engines: exit status 2 and one line,
    before any model loads or any output is written."""
    from cli_helpers import run_cli

    served = ["model@user_agent=server", "user_agent.name=remote", "user_agent.server.base_url=http://127.0.0.1:9/v1"]
    for extra, message in [
        (["scheduling=continuous"], "scheduling=continuous runs the assistant and user_agent in this process"),
        (["user_agent.server.retries=-1"], "model@user_agent.server.retries: must be 0 or more, got -1"),
        (["assistant.replicas=2"], "replicas 2: without GPUs (vLLM's CPU build, or none visible) several engines"),
        (["assistant.replicas=0"], "model@assistant.replicas: expected auto or a whole number of engines (1 or more)"),
    ]:
        out = tmp_path / extra[0].replace("=", "-")
        proc = run_cli("run", "data.users=0", *served, *extra, f"run.out_dir={out}", check=False)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert len([line for line in proc.stderr.splitlines() if "error" in line.lower()]) == 1, proc.stderr
        assert not (out / "generate.yaml").exists() and not (out / "dialogues").exists()


def test_a_gpu_assistant_beside_the_default_user_agent_and_judge_plans_on_one_80gb_gpu(tmp_path):
    """`model@assistant=llama31_8b` beside the embedded default (its CPU memory share 0.15, a fixed 2
    GiB KV cache): both on GPU 0, the default within its own share, the 8B up to its own 0.9."""
    try:
        embedded_model_dir()
    except EmbeddedModelError as err:
        pytest.skip(str(err))
    small = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "model" / "smollm2.yaml"))
    models = {"user_agent": small, "assistant": conf(tmp_path, "llama31_8b"), "judge": dict(small)}
    load = loader(models, tmp_path, simulated(1, 80), Recorder())
    default, eight = load.layout.placements
    assert (default.roles, default.mode, default.gpus) == (("user_agent", "judge"), "in_process", (0,))
    assert (eight.mode, eight.gpus) == ("in_process", (0,)) and eight.max_len_seqs >= 1
    assert default.kv_cache_memory_bytes == 2 * GIB and default.run_config.gpu_memory_utilization <= 0.15
    total = default.run_config.gpu_memory_utilization + eight.run_config.gpu_memory_utilization
    assert 0.85 < total <= 0.9  # the 8B's KV cache takes the rest of its own share


def test_max_model_len_auto_takes_the_largest_that_fits(tmp_path):
    """The README's cluster example with Qwen2.5-72B's published sizes: a 72B user agent and judge (tp
    4) with an 8B assistant do not fit 4 x 80 GB at max_model_len 65,536; the refusal names the
    largest that does, and `auto` plans there (the 8B, alone at its own context, is left as it is)."""
    qwen = {
        **conf(tmp_path, "llama31_70b"),
        "name": "Qwen2.5-72B-Instruct",
        "path": str(model_dir(tmp_path, "qwen25_72b")),
    }
    models = {"assistant": conf(tmp_path, "llama31_8b"), "user_agent": qwen, "judge": dict(qwen)}
    with pytest.raises(PersonalensError, match=r"Ways out: .*max_model_len ([\d,]+) \(the largest that fits\)") as err:
        loader(models, tmp_path, NODE_4X80, Recorder())
    fitting = int(re.search(r"max_model_len ([\d,]+) \(the largest", str(err.value))[1].replace(",", ""))
    assert 16_384 <= fitting < 65_536
    auto = {**models, "user_agent": {**qwen, "max_model_len": "auto"}, "judge": {**qwen, "max_model_len": "auto"}}
    eight, seventy_two = loader(auto, tmp_path, NODE_4X80, Recorder()).layout.placements
    assert seventy_two.run_config.max_model_len % 256 == 0 and seventy_two.run_config.max_model_len < 65_536
    assert (
        seventy_two.max_len_seqs >= 1
        and "max_model_len " + str(seventy_two.run_config.max_model_len) in seventy_two.line()
    )
    assert eight.run_config.max_model_len == 65_536 and seventy_two.config.max_model_len == "auto"
    # without GPUs auto is vLLM's default (the model's context); a bad value is refused
    [unplanned] = loader(
        {"judge": {"name": "a", "max_model_len": "auto"}}, tmp_path, None, Recorder()
    ).layout.placements
    assert (unplanned.config.max_model_len, unplanned.run_config.max_model_len) == ("auto", None)
    with pytest.raises(ModelConfigError, match=r"m\.max_model_len: expected a number of tokens or auto"):
        ModelConfig.from_mapping({"name": "m", "max_model_len": "long"}, where="m")
