"""An engine over an in-process `vllm.LLM`: one batched chat call per generate().

vLLM starts worker processes; a script that builds this engine needs an
`if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from collections.abc import Sequence
from functools import partial

from tqdm import tqdm

from personalens.engines.base import Generation, OnFinished, Request
from personalens.engines.chat import format_messages, resolve_system_role
from personalens.engines.config import ModelConfig
from personalens.engines.dtype import local_dtype
from personalens.engines.embedded import model_path
from personalens.engines.tokens import ChatTokenizer
from personalens.engines.vllm_args import engine_args

log = logging.getLogger(__name__)


class VllmEngine:
    def __init__(self, config: ModelConfig):
        model = model_path(config)
        if config.cpu_reserved_cores is not None:
            # read by vLLM's engine processes when they start; a value the user exported wins
            os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", str(config.cpu_reserved_cores))
        started = time.monotonic()
        from vllm import LLM  # heavy; only engines that run in-process need it
        from vllm.platforms import current_platform

        self.name = config.name
        self.dtype = local_dtype(config.dtype)
        self._llm = LLM(**engine_args(config, model, self.dtype.dtype))
        self._system_role = resolve_system_role(config.system_role, self._llm.get_tokenizer().chat_template)
        # the template and tokenizer LLM.chat applies, for callers that keep prompts as token ids
        self.chat_tokenizer = ChatTokenizer(self._llm.get_tokenizer(), self._system_role)
        log.info(
            f"loaded {self.name}: {self.dtype.describe()}, on {current_platform.device_type}, "
            f"in {time.monotonic() - started:.1f} s"
        )

    def generate(self, requests: Sequence[Request], on_finished: OnFinished | None = None) -> list[Generation]:
        if not requests:
            return []
        params = [sampling_params(r) for r in requests]
        # callers draw their own progress; vLLM's bar, drawn nowhere, tells them as requests finish
        bar = False if on_finished is None else partial(_FinishedRequests, on_finished=on_finished)
        if all(r.prompt_ids is not None for r in requests):
            from vllm.inputs import TokensPrompt

            prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in requests]
            outputs = self._llm.generate(prompts, params, use_tqdm=bar)
        else:
            outputs = self._llm.chat(
                [format_messages(r.messages, self._system_role) for r in requests], params, use_tqdm=bar
            )
        return [_generation(out) for out in outputs]

    def submit(self, requests: Sequence[Request]) -> list[str]:
        """Queue requests without running them (scheduling=continuous); `finished` returns them."""
        from vllm.inputs import TokensPrompt

        prompts = [
            TokensPrompt(
                prompt_token_ids=list(r.prompt_ids)
                if r.prompt_ids is not None
                else self.chat_tokenizer.encode_chat(r.messages)
            )
            for r in requests
        ]
        ids = self._llm.enqueue(prompts, [sampling_params(r) for r in requests], use_tqdm=False)
        # vLLM makes each id unique inside the engine ("<id>-<8 random characters>") and reports
        # outputs under the id it was given
        return [rid.rsplit("-", 1)[0] for rid in ids]

    def finished(self) -> list[tuple[str, Generation]]:
        """One step of the engine: the queued requests that finished in it."""
        return [(out.request_id, _generation(out)) for out in self._llm.llm_engine.step() if out.finished]

    def reset_prefix_cache(self) -> None:
        """Forget cached prompt prefixes (benchmarks start each phase cold)."""
        self._llm.reset_prefix_cache()

    def close(self) -> None:
        """Stops vLLM's engine processes and frees their memory now, not at interpreter exit."""
        self._llm = None
        gc.collect()  # the LLM sits in reference cycles; its finalizers stop the processes


class _Nowhere:
    def write(self, text: str) -> None:
        pass

    def flush(self) -> None:
        pass


class _FinishedRequests(tqdm):
    """The progress bar vLLM keeps while a call runs, drawn nowhere, its updates (requests finished)
    passed on to `on_finished`. vLLM also wraps iterables with it (prompt rendering): those count
    prompts rendered, not requests finished, and are not passed on."""

    def __init__(self, iterable=None, *args, on_finished: OnFinished, **kwargs):
        super().__init__(iterable, *args, file=_Nowhere(), **kwargs)
        self._on_finished = on_finished if iterable is None else None

    def update(self, n: float | None = 1) -> bool | None:
        shown = super().update(n)
        if self._on_finished is not None and n:
            self._on_finished(int(n))
        return shown


def _generation(out) -> Generation:
    return Generation(
        text=out.outputs[0].text,
        prompt_tokens=len(out.prompt_token_ids),
        completion_tokens=len(out.outputs[0].token_ids),
        cached_tokens=out.num_cached_tokens or 0,
    )


def sampling_params(request: Request):
    """vLLM's SamplingParams for one request, grammar-constrained when it carries a grammar."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    s = request.sampling
    return SamplingParams(
        temperature=s.temperature,
        top_p=s.top_p,
        max_tokens=s.max_tokens,
        min_tokens=s.min_tokens,
        seed=s.seed,
        structured_outputs=StructuredOutputsParams(grammar=request.grammar) if request.grammar else None,
    )
