"""A model's settings (one `conf/model/*.yaml`), checked once so engines can trust them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from personalens.engines.models.hub import (
    TOKENIZER_FILES,
    WEIGHT_FILES,
    HubSnapshot,
    cache_dir,
    download_command,
    find_snapshot,
    is_valid_id,
)
from personalens.engines.models.sampling import ModelSampling, model_sampling
from personalens.engines.models.speculative import speculative_settings
from personalens.errors import PersonalensError

ENGINE_KINDS = ("vllm", "server")
# where an engine: vllm model runs (engines/placement/layout.py): planned from its size, in this process, or
# in a vLLM server that personalens starts and stops (engines/serving/managed.py)
PLACEMENTS = ("auto", "in_process", "managed_server")
# engines of one model (engines/replicated.py): auto gives the GPUs a layout leaves free to copies of a
# model (engines/placement/layout.py, `replicas`, shared out by work), and means 1 without GPUs; N asks for exactly N
REPLICAS_AUTO = "auto"
MAX_MODEL_LEN_AUTO = "auto"
# how much of its own earlier thinking a reasoning model sees again in its history (docs/models.md): family gives
# its chat template the answers alone, as every configured family's template keeps of earlier turns; none gives
# the same answers and says so; last gives the thinking of its latest reply, all that of every earlier reply,
# as the `reasoning_content` of its chat turns, for templates that render it (others are refused before loading)
HISTORY_REASONING = ("family", "none", "last", "all")
DTYPES = ("auto", "bfloat16", "float16", "half", "float32", "float")  # vLLM's names
# the KV cache's dtypes personalens sizes (vLLM's kv_cache_dtype names): auto is the model's dtype; the fp8
# ones (fp8 is fp8_e4m3) take one byte per value (engines/vllm/kv.py says where vLLM runs them)
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
# the weight quantizations personalens sizes and passes to vLLM (its `quantization` names): fp8 quantizes a
# 16-bit checkpoint when it loads (or names an fp8 checkpoint's method), the others name a quantized
# checkpoint's method (its config.json's quantization_config); engines/vllm/quantization.py says where each runs
QUANTIZATIONS = ("fp8", "awq", "awq_marlin", "gptq", "gptq_marlin", "compressed-tensors")
_MISSING = "???"  # Hydra's mandatory-value marker


class ModelConfigError(PersonalensError, ValueError):
    """A model config has a missing, unknown or ill-typed field."""


@dataclass(frozen=True)
class ServerConfig:
    """An OpenAI-compatible endpoint, e.g. `vllm serve` on another node."""

    base_url: str  # up to and including /v1, as OpenAI clients take it: http://host:8000/v1
    model: str | None = None  # the served model name; None asks /v1/models (one model served)
    # the most requests in flight from the engine, its concurrent generate() calls together (engines/flow.py:
    # fewer when the server's KV cache holds fewer)
    max_concurrency: int = 64
    retries: int = 3  # further attempts after a connection error, a cut reply, a stall, 429 or 5xx
    backoff_s: float = 1.0  # wait before the first retry, doubled for each next one
    # between two chunks of a streamed reply once it has started (serving/http.py); before its first
    # chunk a request waits (queued in the server) as long as the server answers /health
    timeout_s: float = 600.0
    # to open a connection: a server that accepts none for this long is down (retried as such)
    connect_timeout_s: float = 30.0
    api_key_env: str | None = None  # name of an environment variable holding a bearer token
    # the key of a server personalens started (managed.py): never read from a config, never printed
    api_key: str | None = field(default=None, repr=False)

    @property
    def managed(self) -> bool:
        """A server personalens started (only those get a key from it)."""
        return self.api_key is not None


@dataclass(frozen=True)
class ModelConfig:
    name: str  # recorded in outputs
    engine: str = "vllm"
    # a local directory or a Hugging Face hub id (hub.py); None: the embedded SmolLM2-135M-Instruct.
    # from_mapping replaces a hub id (here and in `tokenizer`) by its snapshot folder in the local cache
    path: str | None = None
    tokenizer: str | None = None
    revision: str | None = None  # a hub id's branch, tag or commit; None: main
    download: bool = False  # fetch a hub id that is not in the local cache (else it is refused)
    dtype: str = "auto"
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_bytes: int | None = None  # when set, vLLM ignores gpu_memory_utilization
    kv_cache_dtype: str = "auto"  # KV_CACHE_DTYPES: fp8 halves a 16-bit model's KV bytes per token
    # QUANTIZATIONS: fp8 stores a 16-bit checkpoint's linear layers in one byte (half the bytes a decode step
    # reads); None: the checkpoint's own (a quantized checkpoint's quantization_config, else none)
    quantization: str | None = None
    # GiB of host memory (all tensor-parallel ranks together) vLLM keeps evicted KV blocks in, its native
    # offloading (kv_offloading_size): a returning history is reloaded from there instead of prefilled
    # again; None: off. GPUs only (engines/vllm/kv.py)
    kv_offload_gib: float | None = None
    # tokens of the longest sequence; auto: on GPUs the largest the layout fits, at most the model's
    # context (engines/placement/layout.py); without GPUs vLLM's default, the model's context
    max_model_len: int | str | None = None
    enable_prefix_caching: bool = True
    enforce_eager: bool = False  # skips torch.compile: faster start, slower decoding
    enable_chunked_prefill: bool | None = None  # None: vLLM's default
    seed: int = 0
    max_num_seqs: int = 256
    # tokens of one engine step (prefill chunks and decodes); None: vLLM's default. It bounds the
    # activations a pinned KV cache must leave room for (engines/placement/sizing.py)
    max_num_batched_tokens: int | None = None
    # tokens per KV-cache block, the granularity of prefix-cache hits; None: vLLM's default
    # (16 on GPUs, 128 on CPUs)
    block_size: int | None = None
    # vLLM's CPU backend only: cores kept free for its scheduler (VLLM_CPU_NUM_OF_RESERVED_CPU);
    # None leaves vLLM's default of one, which on a small machine idles half the cores
    cpu_reserved_cores: int | None = None
    # how vLLM loads the weights: "auto" reads them from `path`; "dummy" makes random weights of the
    # architecture in `path`'s config.json, for benchmarks without the real weights (bench/gpu_row.py)
    load_format: str = "auto"
    system_role: bool | str = "auto"
    prompt_family: str = "default"  # the assistant prompts a fidelity option picks for it (docs/fidelity.md)
    # the model's family (llama, qwen, ...), which names self-preference when a judge shares it with the
    # assistant (docs/validation.md); None: inferred from config.json (engines/models/family.py). Not the
    # engine's: models that differ in it alone share an engine
    family: str | None = field(default=None, compare=False)
    # a reasoning model (docs/models.md): vLLM's reasoning parser that splits its thinking from its answer
    # on the output ids (vllm.reasoning's names: qwen3, deepseek_r1, mistral, openai_gptoss, ...); None:
    # no parser, and a `<think>` block in a reply's text is split off by engines/chat/reasoning.py
    reasoning_parser: str | None = None
    # extra variables of the chat template (enable_thinking, reasoning_effort), sorted (name, value)
    # pairs; given to the template and to the reasoning parser alike
    chat_template_kwargs: tuple[tuple[str, Any], ...] = ()
    # HISTORY_REASONING; a prompt setting, not the engine's: roles that differ in it alone share an engine
    history_reasoning: str = field(default="family", compare=False)
    # the model card's sampling, applied per request to whatever role the model plays (config/sampling.py):
    # roles that differ in it alone share an engine
    sampling: ModelSampling = field(default=ModelSampling(), compare=False)
    # a RoPE scaling of the model's config.json (YaRN: {rope_type: yarn, factor: 4.0,
    # original_max_position_embeddings: 32768}), sorted (name, value) pairs; given to vLLM as hf_overrides
    # (engines/vllm/args.py) in process and to managed servers; () keeps the model's own
    rope_scaling: tuple[tuple[str, Any], ...] = ()
    # vLLM's speculative_config (engines/models/speculative.py), sorted (name, value) pairs; () for none
    speculative: tuple[tuple[str, Any], ...] = ()
    placement: str = "auto"
    # GPUs of a managed server, as indices into this job's visible GPUs; None: the planner picks
    gpus: tuple[int, ...] | None = None
    replicas: int | str = REPLICAS_AUTO  # auto, or a whole number of engines >= 1
    # how long a managed server (managed.py) may take to load and answer; a 70B model loads in
    # minutes from a shared filesystem
    server_start_timeout_s: float = 1800.0
    server: ServerConfig | None = field(default=None)
    # where `path` and `tokenizer` were found when they named hub ids (set by from_mapping, not configurable)
    snapshots: tuple[tuple[str, HubSnapshot], ...] = ()

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], where: str = "model") -> ModelConfig:
        """Checks a config mapping (a plain dict or Hydra's DictConfig); `where` names it in errors."""
        values = _plain(raw)
        server = values.pop("server", None)
        gpus = _gpus(values.pop("gpus", None), where)
        kwargs = _template_kwargs(values.pop("chat_template_kwargs", None), where)
        rope = _template_kwargs(values.pop("rope_scaling", None), where, "rope_scaling")
        try:
            sampling = model_sampling(values.pop("sampling", None), where)
            speculative = speculative_settings(values.pop("speculative", None), where)
        except PersonalensError as err:
            raise ModelConfigError(str(err)) from None
        config = cls(
            **_checked(cls, values, where),
            gpus=gpus,
            server=_server(server, where),
            chat_template_kwargs=kwargs,
            sampling=sampling,
            rope_scaling=rope,
            speculative=speculative,
        )
        if config.engine == "server" and config.server is None:
            role = where.removeprefix("model@")
            how = f" (engine@{role}=server {role}.server.base_url=http://host:8000/v1)" if role != where else ""
            raise ModelConfigError(f"{where}.server.base_url: required when engine is server{how}")
        if config.placement not in PLACEMENTS:
            raise ModelConfigError(f"{where}.placement: expected one of {PLACEMENTS}, got {config.placement!r}")
        if config.engine == "server" and (config.placement != "auto" or config.gpus is not None):
            raise ModelConfigError(
                f"{where}: placement and gpus apply to engine vllm; an engine: server endpoint runs elsewhere"
            )
        if config.replicas != REPLICAS_AUTO and (isinstance(config.replicas, str) or config.replicas < 1):
            raise ModelConfigError(
                f"{where}.replicas: expected auto or a whole number of engines (1 or more), got {config.replicas!r}"
            )
        if config.engine == "server" and config.replicas not in (REPLICAS_AUTO, 1):
            raise ModelConfigError(
                f"{where}.replicas: {config.replicas} applies to engine vllm; an engine: server endpoint is one "
                "server that personalens does not start"
            )
        if config.gpus is not None and len(config.gpus) != config.tensor_parallel_size:
            raise ModelConfigError(
                f"{where}.gpus: {list(config.gpus)} must list tensor_parallel_size={config.tensor_parallel_size} GPU(s)"
            )
        if not 0 < config.gpu_memory_utilization <= 1:
            raise ModelConfigError(
                f"{where}.gpu_memory_utilization: must be in (0, 1], got {config.gpu_memory_utilization}"
            )
        if isinstance(config.max_model_len, str) and config.max_model_len != MAX_MODEL_LEN_AUTO:
            raise ModelConfigError(
                f"{where}.max_model_len: expected a number of tokens or {MAX_MODEL_LEN_AUTO}, got {config.max_model_len!r}"
            )
        for name in ("tensor_parallel_size", "max_num_seqs", "block_size", "max_model_len", "max_num_batched_tokens"):
            value = getattr(config, name)
            if isinstance(value, int) and value < 1:
                raise ModelConfigError(f"{where}.{name}: must be a positive number, got {value}")
        if config.kv_cache_memory_bytes is not None and config.kv_cache_memory_bytes < 1:
            raise ModelConfigError(
                f"{where}.kv_cache_memory_bytes: must be a positive number of bytes, got {config.kv_cache_memory_bytes}"
            )
        if config.server_start_timeout_s <= 0:
            raise ModelConfigError(
                f"{where}.server_start_timeout_s: must be positive, got {config.server_start_timeout_s}"
            )
        if config.cpu_reserved_cores is not None and config.cpu_reserved_cores < 0:
            raise ModelConfigError(f"{where}.cpu_reserved_cores: must be 0 or more, got {config.cpu_reserved_cores}")
        if config.history_reasoning not in HISTORY_REASONING:
            raise ModelConfigError(
                f"{where}.history_reasoning: expected one of {HISTORY_REASONING}, got {config.history_reasoning!r}"
            )
        if config.dtype not in DTYPES:
            raise ModelConfigError(f"{where}.dtype: expected one of {DTYPES}, got {config.dtype!r}")
        if config.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ModelConfigError(
                f"{where}.kv_cache_dtype: expected one of {KV_CACHE_DTYPES}, got {config.kv_cache_dtype!r}"
            )
        if config.quantization is not None and config.quantization not in QUANTIZATIONS:
            raise ModelConfigError(
                f"{where}.quantization: expected null or one of {QUANTIZATIONS}, got {config.quantization!r}"
            )
        if config.kv_offload_gib is not None and not config.kv_offload_gib > 0:
            raise ModelConfigError(
                f"{where}.kv_offload_gib: must be a positive number of GiB, got {config.kv_offload_gib}"
            )
        return _with_files_found(config, where)

    def source(self, key: str = "path") -> str:
        """Where `path` (or `tokenizer`, falling back to `path`) comes from, for messages."""
        found = dict(self.snapshots)
        if key == "tokenizer" and self.tokenizer is None:
            key = "path"
        if key in found:
            return found[key].label()
        return getattr(self, key) or "the embedded model"

    def with_memory_share(self, share: float) -> ModelConfig:
        """The same model given `share` of the memory it was configured with."""
        return dataclasses.replace(self, gpu_memory_utilization=self.gpu_memory_utilization * share)

    @property
    def template_kwargs(self) -> dict[str, Any]:
        """`chat_template_kwargs` as the keyword arguments a chat template takes."""
        return dict(self.chat_template_kwargs)

    @property
    def explicit_replicas(self) -> int | None:
        """The number of engines `replicas` asks for; None for auto."""
        return None if self.replicas == REPLICAS_AUTO else int(self.replicas)


def _with_files_found(config: ModelConfig, where: str) -> ModelConfig:
    """The config with each hub id among `path` (read by engine: vllm) and `tokenizer` replaced by its
    snapshot folder, found (or refused) now, before any model loads, so that every reader of the
    model (planner, token counting, vLLM in process or in a server) reads the same snapshot."""
    wanted = ({"path": WEIGHT_FILES} if config.engine == "vllm" else {}) | {"tokenizer": TOKENIZER_FILES}
    found, replaced = [], {}
    for key, patterns in wanted.items():
        value = getattr(config, key)
        if not value or Path(value).expanduser().is_dir():
            continue
        if value.startswith(("/", ".", "~")) or not is_valid_id(value):
            raise ModelConfigError(f"{where}.{key}: {value} is not a directory, nor a Hugging Face hub id")
        snapshot = find_snapshot(
            value, config.revision, download=config.download, patterns=patterns, where=f"{where}.{key}"
        )
        _check_snapshot(snapshot, key, config, where)
        found.append((key, snapshot))
        replaced[key] = str(snapshot.directory)
    return dataclasses.replace(config, **replaced, snapshots=tuple(found)) if found else config


def _check_snapshot(snapshot: HubSnapshot, key: str, config: ModelConfig, where: str) -> None:
    """A weights snapshot that lacks config.json or the weights themselves (a partial `hf download`)
    is refused now rather than when vLLM reads it."""
    if key != "path":
        return
    missing = [] if (snapshot.directory / "config.json").is_file() else ["config.json"]
    weights = [*snapshot.directory.glob("*.safetensors"), *snapshot.directory.glob("*.bin")]
    if config.load_format != "dummy" and not weights:
        missing.append("weights (*.safetensors)")
    if missing:
        raise ModelConfigError(
            f"{where}.path: the cached snapshot of {snapshot.label()} ({snapshot.directory}) has no "
            f"{' or '.join(missing)}; complete it: `{download_command(snapshot.repo_id, config.revision, cache_dir())}`"
        )


def _server(raw: Mapping[str, Any] | None, where: str) -> ServerConfig | None:
    """The endpoint of an engine: server (conf/engine/server.yaml's block, or a model config's own); none
    for a block whose base_url is null."""
    if raw is None or (isinstance(raw, Mapping) and raw.get("base_url") is None):
        return None
    if not isinstance(raw, Mapping):
        raise ModelConfigError(f"{where}.server: expected a mapping, got {raw!r}")
    server = ServerConfig(**_checked(ServerConfig, dict(raw), f"{where}.server"))
    for name, least, what in (
        ("max_concurrency", 1, "at least 1"),
        ("retries", 0, "0 or more"),
        ("backoff_s", 0, "0 or more"),
    ):
        if getattr(server, name) < least:
            raise ModelConfigError(f"{where}.server.{name}: must be {what}, got {getattr(server, name)}")
    for name in ("timeout_s", "connect_timeout_s"):
        if getattr(server, name) <= 0:
            raise ModelConfigError(f"{where}.server.{name}: must be positive, got {getattr(server, name)}")
    return server


def _template_kwargs(raw: Any, where: str, name: str = "chat_template_kwargs") -> tuple[tuple[str, Any], ...]:
    """Chat template variables (or `rope_scaling`'s) as sorted (name, value) pairs (configs are
    hashable); values are plain scalars (enable_thinking: false, reasoning_effort: low, factor: 4.0)."""
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise ModelConfigError(f"{where}.{name}: expected a mapping such as {{enable_thinking: false}}")
    for key, value in raw.items():
        if not isinstance(key, str) or not isinstance(value, (str, int, float, bool)):
            raise ModelConfigError(f"{where}.{name}.{key}: expected a name and a plain value, got {value!r}")
    return tuple(sorted(raw.items()))


def _gpus(raw: Any, where: str) -> tuple[int, ...] | None:
    """A list of distinct GPU indices as a tuple (configs are hashable: equal ones share an engine)."""
    if raw is None:
        return None
    if not isinstance(raw, (list, tuple)) or not raw:
        raise ModelConfigError(f"{where}.gpus: expected a list of GPU indices such as [0, 1] or null, got {raw!r}")
    if any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in raw) or len(set(raw)) != len(raw):
        raise ModelConfigError(f"{where}.gpus: expected distinct GPU indices (0, 1, ...), got {list(raw)}")
    return tuple(raw)


def _checked(cls: type, values: dict[str, Any], where: str) -> dict[str, Any]:
    known = {
        f.name: f
        for f in fields(cls)
        if f.name
        not in (
            "server",
            "gpus",
            "snapshots",
            "api_key",
            "chat_template_kwargs",
            "sampling",
            "rope_scaling",
            "speculative",
        )
    }
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ModelConfigError(f"{where}: unknown field(s) {unknown}; known: {sorted(known)}")
    for key, value in values.items():
        if value == _MISSING:
            raise ModelConfigError(f"{where}.{key}: mandatory value is missing (???); set it")
        if not _type_ok(known[key].type, value):
            raise ModelConfigError(f"{where}.{key}: expected {known[key].type}, got {value!r}")
    required = [f.name for f in known.values() if _is_required(f) and f.name not in values]
    if required:
        raise ModelConfigError(f"{where}: missing field(s) {required}")
    if "engine" in values and values["engine"] not in ENGINE_KINDS:
        raise ModelConfigError(f"{where}.engine: expected one of {ENGINE_KINDS}, got {values['engine']!r}")
    return values


def _is_required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


# field annotations are strings under `from __future__ import annotations`
_TYPES = {"str": str, "int": int, "float": (int, float), "bool": bool, "None": type(None)}


def _type_ok(annotation: str, value: Any) -> bool:
    allowed = tuple(_TYPES[part.strip()] for part in annotation.split("|") if part.strip() in _TYPES)
    if isinstance(value, bool) and bool not in allowed:
        return False  # bool is an int subclass, but `true` is no valid size
    return isinstance(value, allowed)


def _plain(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A plain dict from a Mapping or an OmegaConf DictConfig, leaving `???` as a string."""
    try:
        from omegaconf import DictConfig, OmegaConf
    except ImportError:  # omegaconf comes with hydra-core; plain dicts need neither
        DictConfig = ()
    if isinstance(raw, DictConfig):
        return OmegaConf.to_container(raw, resolve=True, throw_on_missing=False)
    if not isinstance(raw, Mapping):
        raise ModelConfigError(f"a model config must be a mapping, got {type(raw).__name__}")
    return {key: dict(value) if isinstance(value, Mapping) else value for key, value in raw.items()}
