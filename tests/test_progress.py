"""The progress display of batch work (pure logic, scripted engines): the bar moves as an engine
reports finished requests, tops up whatever it did not report, and stays short in a file or pipe.
The real engines' reports are tested in test_engines.py and test_server.py."""

from __future__ import annotations

import time

import pytest

from personalens.engines.base import Generation, Request, Sampling
from personalens.engines.progress import generate_with_progress
from personalens.progress import Progress

REQUESTS = [Request([{"role": "user", "content": str(i)}], Sampling()) for i in range(4)]


class Reporting:
    """Reports `report[k]` finished requests (3 tokens each) at its k-th moment, noting the bar's
    count and tokens each time."""

    name = "scripted"

    def __init__(self, bar: Progress, report: list[int]):
        self.bar, self.report, self.seen, self.tokens = bar, report, [], []

    def generate(self, requests, on_finished=None):
        for n in self.report:
            on_finished(n, 3 * n)
            self.seen.append(self.bar.finished)
            self.tokens.append(self.bar.tokens)
        return [Generation("ok", prompt_tokens=5, completion_tokens=3) for _ in requests]


@pytest.mark.parametrize(
    "report, seen",
    [
        ([1, 1, 1, 1], [1, 2, 3, 4]),  # every request as it finishes
        ([2, 1], [2, 3]),  # some: the last one is counted when the call returns
        ([], []),  # none (an engine that cannot tell): all when the call returns
    ],
)
def test_the_bar_follows_what_the_engine_reports_and_counts_the_rest_at_the_end(report, seen):
    bar = Progress(total=10, label="judge", unit="judgment", enabled=False)
    bar.update(6, active=4, tokens=0)  # six items were done in earlier calls
    engine = Reporting(bar, report)
    generations = generate_with_progress(engine, REQUESTS, bar, remaining=4)
    assert len(generations) == 4 and engine.seen == [6 + n for n in seen]
    # the tokens of each finished request reach the bar as it finishes, the rest when the call returns
    assert engine.tokens == [3 * n for n in seen]
    assert bar.finished == 10 and bar.tokens == 12
    bar.close()


def test_in_a_file_or_pipe_the_bar_is_redrawn_at_most_every_few_seconds(capsys):
    bar = Progress(total=40, label="judge", unit="judgment")  # stderr is captured: not a terminal
    for _ in range(40):  # over about a second: a terminal's bar would be redrawn about ten times
        time.sleep(0.025)
        bar.update(1, active=0, tokens=1)
    bar.close()
    drawn = [part for part in capsys.readouterr().err.replace("\r", "\n").splitlines() if part.strip()]
    assert len(drawn) <= 3 and "40/40" in drawn[-1], drawn
