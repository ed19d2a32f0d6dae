"""What the in-process engine (local.py) hands vLLM for a request, and what it reads back from a
finished request's output."""

from __future__ import annotations

from collections.abc import Sequence

from personalens.engines.base import Generation, Request, rejected
from personalens.engines.chat import budget


def generation(out) -> Generation:
    reply = out.outputs[0]
    prompt = len(out.prompt_token_ids)
    if reply.finish_reason not in ("stop", "length"):  # aborted, or an error inside the engine
        return rejected(f"vLLM ended the request: {reply.finish_reason} ({reply.stop_reason!r})", prompt)
    return Generation(
        text=reply.text,
        prompt_tokens=prompt,
        completion_tokens=len(reply.token_ids),
        cached_tokens=out.num_cached_tokens or 0,
        finish_reason=reply.finish_reason,
    )


def sampling_params(request: Request, thinking_stops: Sequence[str] | None = None):
    """vLLM's SamplingParams for one request, grammar-constrained when it carries a grammar; with
    `thinking_stops`, those of its thinking request instead (engines/chat/budget.py): at most its
    thinking budget, stopped at (and keeping) an end-of-thinking marker, special tokens kept in the
    text (harmony's markers are special tokens), no grammar."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    s = request.sampling
    if thinking_stops is not None:
        s = budget.thinking_sampling(s)
        stops = {"stop": list(thinking_stops), "include_stop_str_in_output": True, "skip_special_tokens": False}
    return SamplingParams(
        temperature=s.temperature,
        top_p=s.top_p,
        max_tokens=s.max_tokens,
        min_tokens=s.min_tokens,
        seed=s.seed,
        structured_outputs=(
            StructuredOutputsParams(grammar=request.grammar) if request.grammar and thinking_stops is None else None
        ),
        **(stops if thinking_stops is not None else {}),
        **s.extras(),
    )
