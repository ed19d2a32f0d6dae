"""What a server the lab runs itself needs for a role given as `engine@X=server X.server.base_url=...`:
its `vllm serve` command line, with the smallest context that holds the plan's longest prompt of that
role at the protocol's cap and its reply, and what the run expects of it besides. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from personalens.engines.vllm.api import TESTED
from personalens.engines.vllm.args import cli_flags

ROLE_PROMPTS = {"user_agent": "dialogue", "assistant": "dialogue", "judge": "judge"}


def external_servers(
    raw: Mapping[str, Mapping[str, Any]],
    models: Mapping,
    longest: Mapping[str, Mapping[str, float]] | None,
    requests: Mapping[str, int] | None,
) -> dict[str, dict]:
    """Per role with `engine: server`: the `vllm serve` line and its checklist. `raw` is each role's
    model config as written (its hub id, not the cache folder), `models` the checked ModelConfigs,
    `longest` the plan's longest prompts at the cap by kind (None when the tokens were not counted)
    and `requests` each role's reply budget (its max_tokens and thinking budget)."""
    out = {}
    for role, where in ROLE_PROMPTS.items():
        config = models[role]
        if config.engine != "server":
            continue
        need = None
        if longest and requests:
            need = int(max(prompts[where] for prompts in longest.values()) + requests[role])
        served = config.server.model or config.name
        engine = {
            "max_model_len": need,
            "dtype": None if config.dtype == "auto" else config.dtype,
            "kv_cache_dtype": None if config.kv_cache_dtype == "auto" else config.kv_cache_dtype,
            "reasoning_parser": config.reasoning_parser,
            # personalens' grammars are in xgrammar's EBNF dialect (vllm/args.py pins it in process too)
            "structured_outputs_config": {"backend": "xgrammar"},
        }
        key = config.server.api_key_env
        flags = [
            *cli_flags(engine),
            "--served-model-name",
            served,
            "--enable-prompt-tokens-details",  # the summary's prefix-cache share (serving/http.py)
            *(["--api-key", f"${key}"] if key else []),
        ]
        weights = raw[role].get("path") or "<the model's weights>"
        out[role] = {
            "model": config.name,
            "base_url": config.server.base_url,
            "max_model_len": need,
            "command": " ".join(["vllm serve", str(weights), *flags]),
            "vllm": TESTED,
            "api_key_env": key,
            "family": config.family,
        }
    return out


def lines(servers: Mapping[str, Mapping]) -> list[str]:
    out = []
    for role, s in servers.items():
        need = (
            f"--max-model-len at least {s['max_model_len']:,} (its longest prompt at the protocol's cap and its reply)"
            if s["max_model_len"]
            else "--max-model-len not computed: the tokens were not counted (give "
            f"{role}.tokenizer=<the served model's tokenizer>)"
        )
        out += [
            f"  {role}: {s['model']} at {s['base_url']}: start it as (with --tensor-parallel-size for its node)",
            f"      {s['command']}",
            f"    {need}; vLLM {s['vllm']} (the range personalens was tested with)",
            "    "
            + (
                f"its key from ${s['api_key_env']} ({role}.server.api_key_env)"
                if s["api_key_env"]
                else f"no key sent: a server started with --api-key needs {role}.server.api_key_env=<a variable holding it>"
            ),
            "    "
            + (
                f"family {s['family']} for the self-preference check"
                if s["family"]
                else f"family unknown: set {role}.family (e.g. llama) for the self-preference check"
            ),
            "    " + _comparable(role),
        ]
    return out


def _comparable(role: str) -> str:
    """Whether its rows compare with in-process ones: the model identity a run records (config/core.py
    model_identity) holds `engine`, and `personalens compare` refuses a difference of the user agent or
    the judge unless allowed (compare/comparable.py), while the assistant's are its own."""
    if role == "assistant":
        return "its rows compare with in-process runs' as another assistant's would: compare names engine: server"
    return (
        f"its rows compare with in-process runs' only under compare.allow=[{role}]: the {role}'s recorded "
        "identity holds engine: server"
    )
