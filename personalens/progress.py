"""What long batch work shows: a progress bar (finished items, items still to do, generated tokens per
second) and the prompt-token line of its summary. engines/progress.py moves a bar while an engine's
batched call runs."""

from __future__ import annotations

import time

from tqdm import tqdm

from personalens import console

# seconds between redraws: on a terminal each one overwrites the bar, in a file or a pipe (a SLURM
# log) each one stays
TERMINAL_INTERVAL, FILE_INTERVAL = 0.1, 10.0


class Progress:
    def __init__(self, total: int, label: str, unit: str, enabled: bool = True):
        file = console.err()
        interval = TERMINAL_INTERVAL if getattr(file, "isatty", lambda: False)() else FILE_INTERVAL
        self._bar = tqdm(
            total=total, desc=label, unit=unit, file=file, disable=not enabled, dynamic_ncols=True, mininterval=interval
        )
        self._started = time.monotonic()
        self.tokens = 0  # generated tokens so far
        self.finished = 0  # items finished so far

    def tokens_per_s(self) -> float:
        return self.tokens / max(time.monotonic() - self._started, 1e-9)

    def update(self, finished: int, *, active: int, tokens: int) -> None:
        self.finished += finished
        self.tokens += tokens
        self._bar.set_postfix(active=active, tok_s=f"{self.tokens_per_s():.1f}", refresh=False)
        self._bar.update(finished)

    def close(self) -> None:
        self._bar.close()


def prompt_usage(prompt_tokens: int, cached_tokens: int) -> str:
    """The summaries' account of prompt processing: how much of it the prefix cache saved."""
    share = cached_tokens / prompt_tokens if prompt_tokens else 0.0
    return f"prompts {prompt_tokens} tokens, {share:.0%} from the prefix cache"
