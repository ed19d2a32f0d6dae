"""A model config's `speculative:` block, checked: vLLM's speculative_config, passed through as it is
(engines/vllm/args.py). Its methods in vLLM 0.32 (config/speculative.py) that personalens takes: `ngram`
and `suffix` propose tokens from the prompt and earlier output without a draft model (suffix needs the
arctic-inference package); `eagle3` and `draft_model` take a draft model (`model:`). It is part of the
model's identity (config/core.py): vLLM verifies drafted tokens against the model's own distribution,
but a verified batch is not the batch without it, so what is generated may differ, and
`reproducible: true` refuses it (`reproducible_refusal`) until a run shows it lossless there."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from personalens.errors import PersonalensError

SPECULATIVE_METHODS = ("ngram", "suffix", "eagle3", "draft_model")
_DRAFTED = ("eagle3", "draft_model")  # methods whose drafts come from a model of their own


def speculative_settings(raw: Any, where: str) -> tuple[tuple[str, Any], ...]:
    """The block as sorted (name, value) pairs (configs are hashable); () for none. A method is required,
    from SPECULATIVE_METHODS, with a positive num_speculative_tokens, and a draft `model` where it needs one."""
    if raw is None or (isinstance(raw, Mapping) and not raw):
        return ()
    if not isinstance(raw, Mapping):
        raise PersonalensError(
            f"{where}.speculative: expected a mapping such as {{method: ngram, num_speculative_tokens: 3}}"
        )
    method = raw.get("method")
    if method not in SPECULATIVE_METHODS:
        raise PersonalensError(f"{where}.speculative.method: expected one of {SPECULATIVE_METHODS}, got {method!r}")
    tokens = raw.get("num_speculative_tokens")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise PersonalensError(
            f"{where}.speculative.num_speculative_tokens: expected the tokens drafted per step (1 or more), got {tokens!r}"
        )
    if method in _DRAFTED and not raw.get("model"):
        raise PersonalensError(f"{where}.speculative.model: method {method} drafts with a model of its own; name it")
    for key, value in raw.items():
        if not isinstance(key, str) or not isinstance(value, (str, int, float, bool)):
            raise PersonalensError(f"{where}.speculative.{key}: expected a name and a plain value, got {value!r}")
    return tuple(sorted(raw.items()))


def reproducible_refusal(name: str, speculative: tuple[tuple[str, Any], ...]) -> str | None:
    """Why `reproducible: true` refuses a model's speculative decoding (None: it has none): no run has
    shown that its verified batches give what the same batches without it give."""
    if not speculative:
        return None
    method = dict(speculative)["method"]
    return (
        f"model {name}: speculative {method} refused: reproducible: true runs batch-invariant engines, and no run "
        "has shown speculative decoding lossless there (drafted tokens are verified in batches the run without "
        "them never makes); set speculative null, or leave reproducible out"
    )
