"""The thinking budget at the paper's lengths: `generate` under `protocol=paper` (20 rounds SD, 30 MD,
800-token replies) with a thinking budget of 4,096, its assistant a scripted thinking model behind an
OpenAI-compatible server that personalens did not start (tests/thinking_script.py), without and with
a reasoning parser, its user agent a scripted one that never ends a dialogue, so that every dialogue
runs to its round cap. Three thinkers: thinking ended after one word, thinking ended after one word
with the end marker written again inside the answer (after two of its words, or as its last token), and
thinking the budget cuts.

    python bench/answer_budget.py --users 0

Prints, per thinker and server, the dialogues and how they ended, the assistant turns, the longest
stored answer and thinking in tokens, answers holding a thinking marker, answers that lost words (every
answer token but a marker is one word here), and the wall time."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from hydra import compose, initialize_config_dir

from personalens.config.core import register_resolvers
from personalens.engines.base import Generation
from personalens.engines.chat.reasoning import MARKERS
from personalens.engines.models.config import ModelConfig
from personalens.engines.serving.engine import ServerEngine
from personalens.simulate import command as simulate_command

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the scripted thinking model
from cli_helpers import read_rows  # noqa: E402
from thinking_script import END, ScriptedServer, Thinker  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BUDGET = 4096


@dataclass
class Restating(Thinker):
    """Thinks one word, then writes the end marker again inside its answer: after two words of it, or
    (`at` None) as its last token."""

    at: int | None = 2

    def reply(self, prompt, max_tokens, stops=(), keep_stop=False):
        ids, finish = super().reply(prompt, max_tokens, stops, keep_stop)
        if END in prompt and ids:  # an answer request
            ids[len(ids) - 1 if self.at is None else self.at] = END
        return ids, finish


THINKERS = {
    "ends after one word": lambda: Thinker(1),
    "end marker after two words of the answer": lambda: Restating(1),
    "end marker as the answer's last token": lambda: Restating(1, at=None),
    "cut by the budget": lambda: Thinker(None),
}


class EndlessUser:
    """A user agent that never says TERMINATE: every dialogue runs to its round cap."""

    name = "scripted-user"

    def generate(self, requests, on_finished=None):
        return [Generation("Tell me more about that, please.", prompt_tokens=10, completion_tokens=8) for _ in requests]


def config(out_dir: Path, users: str):
    register_resolvers()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(
            "config",
            overrides=[
                f"data.users=[{users}]",
                "protocol=paper",
                "progress=false",
                f"run.out_dir={out_dir}",
                "assistant.reasoning_parser=deepseek_r1",
                f"protocol.assistant.thinking_budget={BUDGET}",
                "lockstep.token_ids=false",
            ],
        )


def run(thinker: Thinker, parser: bool, users: str) -> str:
    server = ScriptedServer(thinker, parser)
    raw = {"name": "served", "engine": "server", "server": {"base_url": server.url, "model": "m", "retries": 0}}
    assistant = ServerEngine(ModelConfig.from_mapping({**raw, "reasoning_parser": "deepseek_r1"}))
    with tempfile.TemporaryDirectory() as tmp:
        cfg = config(Path(tmp) / "run", users)
        started = time.monotonic()
        try:
            status = simulate_command.generate(cfg, lambda: {"user_agent": EndlessUser(), "assistant": assistant})
        finally:
            server.close()
        wall = time.monotonic() - started
        rows = read_rows(Path(tmp) / "run" / "dialogues")
    cap = int(cfg.protocol.assistant.max_tokens)
    turns = [t for d in rows for t in d["turns"] if t["role"] == "assistant"]
    answers = [t["completion_tokens"] - (t["reasoning_tokens"] or 0) for t in turns]
    endings: dict[str, int] = {}
    for d in rows:
        endings[d["ended"]] = endings.get(d["ended"], 0) + 1
    marked = sum(any(m in t["text"] for m in MARKERS) for t in turns)
    lost = sum(len(t["text"].split()) < answer - 1 for t, answer in zip(turns, answers))
    return (
        f"exit {status}; {len(rows)} dialogues, ended {endings}; {len(turns)} assistant turns; "
        f"longest answer {max(answers, default=0)} tokens (cap {cap}), over the cap {sum(a > cap for a in answers)}; "
        f"longest thinking {max((t['reasoning_tokens'] or 0 for t in turns), default=0)} tokens (budget {BUDGET}); "
        f"answers with a marker {marked}, that lost words {lost}; wall {wall:.1f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", default="0", help="the bundled users, comma-separated")
    args = parser.parse_args()
    for name, make in THINKERS.items():
        for with_parser in (False, True):
            where = "server with a reasoning parser" if with_parser else "server without one"
            print(f"- {name}, {where}: {run(make(), with_parser, args.users)}", flush=True)


if __name__ == "__main__":
    main()
