"""What the in-process engine (local.py) hands vLLM for a request, and what it reads back from a
finished request's output."""

from __future__ import annotations

from collections.abc import Sequence

from personalens.engines.base import Generation, Request, rejected
from personalens.engines.chat import budget

# why vLLM 0.32 ends a request as an error under speculative decoding: a drafted token its grammar
# rejects ("grammar rejected tokens [...]. Terminating request" in the log; vllm-project/vllm issue
# 52620). Measured: 1 of 408 judgments of `personalens run protocol=quick` with an n-gram judge and a
# two-judge panel on the CPU (bench/results/speculative-judge-cpu.md)
SPECULATIVE_ERROR = "under speculative decoding, a grammar that rejects a drafted token ends its request so"


def generation(out, speculative: bool = False) -> Generation:
    """A finished request's Generation; one vLLM ended otherwise than by a stop or its length is a
    refusal, whose reason names the known cause where the engine drafts (`speculative`)."""
    reply = out.outputs[0]
    prompt = len(out.prompt_token_ids)
    if reply.finish_reason not in ("stop", "length"):  # aborted, or an error inside the engine
        known = f"; {SPECULATIVE_ERROR}" if speculative and reply.finish_reason == "error" else ""
        return rejected(f"vLLM ended the request: {reply.finish_reason} ({reply.stop_reason!r}){known}", prompt)
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
