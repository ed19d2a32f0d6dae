"""The Table 3 recipes the docs write (README, docs/cluster.md, docs/models.md, docs/configuration.md) make rows
that `compare` sets side by side: each is `experiment=table3` with its assistant, and the saved configs of
every pair pass compare's comparability rules (personalens/compare/comparable.py), except where the docs say
why; no doc or config comment gives the old reply budget of 800 + thinking budget."""

from __future__ import annotations

import itertools
import re

import doc_commands as dc
from test_fidelity import config

from personalens import config as C
from personalens.compare.comparable import mismatches, recorded
from personalens.config import run as R
from personalens.judge import command as judge_command
from personalens.simulate import command as simulate_command

RECIPE = "experiment=table3"
DOCS = ("README.md", "docs/cluster.md", "docs/models.md", "docs/configuration.md")
# the recipes the docs show refused beside the others, and the checks that refuse them (docs/cluster.md:
# "A server your lab already runs": a served role's engine is part of its identity)
REFUSED = {"llama31-8b-served": {"user_agent", "judge"}}
# what a recipe's command sets that is no part of a run's saved config, or stands for a place on a cluster
_NOT_SAVED = re.compile(r"^(plan\.|run\.name=|[a-z_]+\.path=|data\.root=|hydra\.)")


def recipes() -> dict[str, tuple[str, ...]]:
    """The documented recipes, each once, by the run name one of its commands gives (else its assistant's
    config): the overrides of the `experiment=table3` commands that shape a run."""
    named: dict[tuple[str, ...], str] = {}
    for command in dc.collect(dc.sources()):
        words = dc.words(command.text)
        if RECIPE not in words or words[1] not in ("plan", "generate", "run"):
            continue
        overrides = tuple(sorted(w for w in words[2:] if "=" in w and not _NOT_SAVED.match(w)))
        name = next((w.split("=", 1)[1] for w in words if w.startswith("run.name=")), None)
        if name or overrides not in named:
            assistant = next(w.split("=", 1)[1] for w in words if w.startswith("model@assistant="))
            named[overrides] = name or named.get(overrides) or assistant.replace("_", "-")
    return {name: overrides for overrides, name in named.items()}


def test_every_documented_table3_recipe_is_the_one_experiment():
    commands = [c for c in dc.collect(dc.sources()) if c.where.split(":")[0] in DOCS]
    table3 = [c for c in commands if RECIPE in dc.words(c.text)]
    assert {c.where.split(":")[0] for c in table3} == set(DOCS), table3
    for c in table3:  # the user agent and the judge are the experiment's alone
        assert not re.search(r"model@(user_agent|judge)=|data=", c.text), c
    # a Table 3 run submitted on the official data names the recipe, not models of its own
    submitted = [c for c in commands if "data=official" in c.text and c.text.split()[1] == "generate"]
    assert not submitted, submitted
    assert len(recipes()) >= 5


def _saved(tmp_path, name: str, overrides: tuple[str, ...]):
    """The run directory a recipe's `generate` and `judge` would save their configs in, with the fingerprinted
    parts they compute (no model or data is loaded)."""
    cfg = config(RECIPE, "data.root=/data/PersonaLens/data", *overrides, "data.users=sample50")
    out = tmp_path / name
    fidelity = R.fidelity(cfg)
    _, templates = R.templates(cfg, fidelity)
    chosen = {role: R.sampling(cfg, role)[1] for role in simulate_command.ROLES}
    digest, parts = simulate_command.identity(cfg, chosen, templates)
    C.check_or_save(out, "generate", cfg, digest, {}, parts)
    key, judged = judge_command.identity(cfg)
    C.check_or_save(out, "judge", cfg, key, {}, judged)
    return out


def test_every_pair_of_documented_recipes_is_comparable(tmp_path):
    """Each pair accepted by compare's rules (a difference in the assistant's own settings is shown, not
    refused), or refused only on the check the docs give for it."""
    found = recipes()
    runs = {name: recorded(_saved(tmp_path, name, overrides)) for name, overrides in found.items()}
    assert {"llama31-8b", "qwen3-8b", "gpt-oss-20b", "r1-qwen-7b"} <= set(runs), sorted(runs)
    for a, b in itertools.combinations(sorted(runs), 2):
        refused = {m.check for m in mismatches(runs[a], runs[b]) if m.check != "assistant"}
        assert refused == REFUSED.get(a, set()) | REFUSED.get(b, set()), (a, b, mismatches(runs[a], runs[b]))


def test_no_doc_or_config_comment_gives_the_old_reply_budget():
    """The answer's max_tokens is the protocol's 800 whatever the thinking budget: no text sets max_tokens to
    800 + the budget (+ 1)."""
    old = re.compile(r"800 \+ (the )?(thinking )?budget|budget \+ 800|budget \+ 1\b|max_tokens=1825")
    hits = [
        f"{path.relative_to(dc.REPO)}:{n}: {line.strip()}"
        for path in dc.sources()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if old.search(line)
    ]
    assert not hits, hits
    assert old.search("800 + budget + 1 keeps the paper's 800-token answers")  # the rule as the docs wrote it
