"""How the dialogues of a run ended, how many replies were cut at their max_tokens, and what reasoning
models thought: the tables beside Table 3 that say what its scores were computed on (docs/outputs.md)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from personalens.engines.chat.reasoning import THINKING
from personalens.engines.chat.spans import SPAN
from personalens.store import ENDING_NAMES, ENDINGS
from personalens.store.results import KINDS, Dialogue, Judgment
from personalens.tables.model import Cell, Column, Table

_ROLE_NAMES = {"user": "user agent", "assistant": "assistant", "judge": "judge"}


def run_label(run: str) -> str:
    """A run directory as the tables name it: its last part (the run's name by default)."""
    return Path(run).name or run


def endings(dialogues: Sequence[Dialogue]) -> Table:
    """Dialogues per ending, per run and task kind: TERMINATE, the round cap, the context full
    (judged on the turns they had), failed (an engine refused a request; not judged), and TERMINATE
    in the opening message (a flag, not an ending: those dialogues went on)."""
    columns = (
        *(Column(e, "Ended", ENDING_NAMES[e], holds="count") for e in ENDINGS),
        Column("not_recorded", "Ended", "not recorded", holds="count"),
        Column("opening_terminate", "", "TERMINATE in the opening", holds="count"),
        Column("dialogues", "", "Dialogues", holds="count"),
    )
    rows = []
    for run in sorted({d.run for d in dialogues}):
        for kind in KINDS:
            ds = [d for d in dialogues if d.run == run and d.kind == kind]
            if not ds:
                continue
            cells: tuple[Cell, ...] = (
                *(sum(d.ended == e for d in ds) for e in ENDINGS),
                sum(d.ended is None for d in ds),
                sum(d.opening_terminate for d in ds),
                len(ds),
            )
            rows.append(((run_label(run), kind), cells))
    return Table(
        "endings",
        "How dialogues ended",
        ("Run", "Kind"),
        columns,
        tuple(rows),
        notes=(
            "Context full: the next prompt left less room than the reply's budget inside the model's max_model_len "
            "(protocol.context_room); these dialogues are judged on the turns they had. Stopped in thinking: a "
            "reasoning model's reply was cut inside its thinking, before any answer; it is never taken as an answer, "
            "and the dialogue is judged on the turns before it, as on a full context. Failed: an engine refused a "
            "request of the dialogue (its message is in the dialogue's `error`); these are not judged. "
            "Not recorded: runs written before the ending was stored.",
        ),
    )


def cut_replies(dialogues: Sequence[Dialogue], judgments: Sequence[Judgment]) -> Table:
    """Per run and role, the share of replies (judge outputs for the judge) cut at max_tokens, among
    those whose finish reason was recorded."""
    columns = (
        Column("replies", "", "Replies", holds="count"),
        Column("cut", "", "Cut at max_tokens", holds="count"),
        Column("cut_share", "", "Cut (%)", digits=1, holds="value"),
        Column("not_recorded", "", "Reason not recorded", holds="count"),
    )
    rows = []
    for run in sorted({d.run for d in dialogues} | {j.run for j in judgments}):
        reasons: dict[str, list[str | None]] = {"user": [], "assistant": []}
        for d in dialogues:
            if d.run == run:
                for role, reason in d.finishes:
                    reasons.setdefault(role, []).append(reason)
        # a refused judgment has a failure and no finish reason: it produced no output to cut
        reasons["judge"] = [
            j.finish_reason for j in judgments if j.run == run and not (j.failure and j.finish_reason is None)
        ]
        for role in ("user", "assistant", "judge"):
            known = [r for r in reasons.get(role, []) if r is not None]
            cut = sum(r == "length" for r in known)
            share = 100.0 * cut / len(known) if known else None
            rows.append(
                ((run_label(run), _ROLE_NAMES[role]), (len(known), cut, share, len(reasons[role]) - len(known)))
            )
    return Table(
        "cut_replies",
        "Replies cut at max_tokens",
        ("Run", "Role"),
        columns,
        tuple(rows),
        notes=(
            'A reply cut at its max_tokens (finish_reason "length") ends mid-text; a judge output cut before its score '
            'counts as unparsed, with the reason "cut at N tokens" in the parse-failures table.',
        ),
    )


def thinking(dialogues: Sequence[Dialogue], judgments: Sequence[Judgment]) -> Table:
    """Per run and role, a reasoning model's thinking: its tokens (of the replies that counted them),
    the replies that stopped inside it, and the leak checks, which must both be 0: thinking markers
    (`<think>`, `[THINK]`, `<|channel|>`, ...) in the texts each role sent to another party, and the
    replies whose thinking was found by content in their own answer or what was sent on after it, past
    what their prompt showed them (engines/chat/spans.py)."""
    columns = (
        Column("replies", "", "Replies", holds="count"),
        Column("thinking_tokens", "", "Thinking tokens", holds="count"),
        Column("not_counted", "", "Thinking not counted", holds="count"),
        Column("stopped", "", "Stopped in thinking", holds="count"),
        Column("stopped_share", "", "Stopped (%)", digits=1, holds="value"),
        Column("leaks", "", "Thinking markers sent on", holds="count"),
        Column("found", "", "Thinking found sent on", holds="count"),
    )
    rows = []
    for run in sorted({d.run for d in dialogues} | {j.run for j in judgments}):
        ds = [d for d in dialogues if d.run == run]
        for role in ("user", "assistant"):
            turns = [(t, n) for d in ds for (r, _), t, n in zip(d.finishes, d.reasoning_tokens, d.leaks) if r == role]
            found = sum(f for d in ds for (r, _), f in zip(d.finishes, d.thinking_found) if r == role)
            stopped = sum(d.stopped_role == role for d in ds)
            replies = len(turns) + stopped
            cells: tuple[Cell, ...] = (
                replies,
                sum(t or 0 for t, _ in turns),
                sum(t is None for t, _ in turns),
                stopped,
                100.0 * stopped / replies if replies else None,
                sum(n for _, n in turns),
                found,
            )
            rows.append(((run_label(run), _ROLE_NAMES[role]), cells))
        js = [j for j in judgments if j.run == run and not (j.failure and j.finish_reason is None)]
        stopped = sum(j.finish_reason == THINKING for j in js)
        judge: tuple[Cell, ...] = (
            len(js),
            sum(j.reasoning_tokens or 0 for j in js),
            sum(j.reasoning_tokens is None for j in js),
            stopped,
            100.0 * stopped / len(js) if js else None,
            None,  # a judge's output goes to no other party
            None,
        )
        rows.append(((run_label(run), _ROLE_NAMES["judge"]), judge))
    return Table(
        "thinking",
        "Thinking of reasoning models, and the leak check",
        ("Run", "Role"),
        columns,
        tuple(rows),
        notes=(
            "Thinking is split from every reply by its engine (engines/chat/reasoning.py) and stored beside the answer; "
            "only answers reach the other party and the judge. Thinking tokens count the replies' tokens before their "
            "answer; not counted: replies whose thinking was seen in their text only (no reasoning parser), or runs "
            "written before thinking was recorded. Thinking markers sent on: markers found in the answers each role "
            "sent to the other party and to the judge (0 unless thinking leaked). Thinking found sent on: replies "
            f"whose thinking has a run of {SPAN} characters (whitespace collapsed) that their prompt did not show "
            "them (in no earlier turn, template or user data), which their own answer or a later turn's text holds, "
            "and with it a later prompt or the judge's transcript (0 unless thinking leaked).",
        ),
    )


def stopped_replies(dialogues: Sequence[Dialogue]) -> Table:
    """Per run, role and model, the replies that stopped inside their thinking, kept on record with no
    answer (never sent on nor judged): how many, of how many dialogues, how long their prompts and their
    thinking were, and how much their thinking repeated itself (a loop), so that a lab can read why a model
    never answered (a loop, a long plan, a budget too small)."""
    columns = (
        Column("dialogues", "", "Dialogues", holds="count"),
        Column("stopped", "", "Stopped in thinking", holds="count"),
        Column("prompt_tokens", "", "Prompt tokens (mean)", digits=0, holds="value"),
        Column("thinking_tokens", "", "Thinking tokens (mean)", digits=0, holds="value"),
        Column("thinking_most", "", "Thinking tokens (most)", holds="count"),
        Column("repeated", "", "Thinking repeated (%)", digits=1, holds="value"),
    )
    rows = []
    for run in sorted({d.run for d in dialogues}):
        ds = [d for d in dialogues if d.run == run]
        stops = [d.stopped for d in ds if d.stopped is not None]
        for role, model in sorted({(s.role, s.model) for s in stops}):
            mine = [s for s in stops if (s.role, s.model) == (role, model)]
            of = sum(d.assistant_model == model for d in ds) if role == "assistant" else len(ds)
            thought = [s.thinking_tokens for s in mine if s.thinking_tokens is not None]
            cells: tuple[Cell, ...] = (
                of,
                len(mine),
                _mean([s.prompt_tokens for s in mine if s.prompt_tokens is not None]),
                _mean(thought),
                max(thought) if thought else None,
                _mean([100.0 * s.repeated for s in mine if s.repeated is not None]),
            )
            rows.append(((run_label(run), _ROLE_NAMES[role], model), cells))
    return Table(
        "stopped_thinking",
        "Replies stopped inside their thinking, per model",
        ("Run", "Role", "Model"),
        columns,
        tuple(rows),
        notes=(
            "Each reply that stopped inside its thinking is kept in its dialogue's `stopped_turn` with its thinking "
            "and no text; it ended its dialogue and was never sent on nor judged. Thinking repeated: the share of its "
            "40-character runs that it wrote more than once (near 100% for thinking caught in a loop). Runs written "
            "before the reply was kept have no rows here (their count is in the thinking table).",
        ),
    )


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def leaked(dialogues: Sequence[Dialogue]) -> int:
    """Thinking markers in every text sent to another party (the leak check; must be 0)."""
    return sum(sum(d.leaks) for d in dialogues)


def found_in_prompts(dialogues: Sequence[Dialogue]) -> int:
    """Replies whose thinking was found by content in their answer or later texts (must be 0)."""
    return sum(sum(d.thinking_found) for d in dialogues)


def context_note(dialogues: Sequence[Dialogue]) -> str | None:
    """Table 3's line on what its scores were computed on, when a dialogue ended other than by the protocol."""
    context = sum(d.ended == "context" for d in dialogues)
    stopped = sum(d.ended == "thinking" for d in dialogues)
    failed = sum(d.ended == "failed" for d in dialogues)
    if not context and not stopped and not failed:
        return None
    return (
        f"Of {len(dialogues)} dialogues, {context} ended on a full context and {stopped} on a reply stopped inside "
        f"its thinking (both scored on the turns they had), and {failed} failed (refused by an engine; not scored): "
        "see the table of how dialogues ended."
    )
