"""`generate`: simulate every (scenario, trial) of a shard in lockstep and stream the finished
dialogues to Parquet, skipping the ones a previous run already wrote; each step's batched calls go
to the trace beside them (trace.py).

Each step's new turns are appended to the shard's `turns/` table as the step ends, before its
finished dialogues are written (store/turns.py). A run stopped at any point (a `Stop` it was asked
for between steps, SIGKILL anywhere) therefore loses at most the step in flight: running it again
rebuilds each unfinished dialogue from its stored turns and continues it with the seeds it would
have had, its prompts rendered from the same history and tokenized anew (engines/chat/token_ids.py
makes spliced prompt ids equal to a whole tokenization, so the engine gets the ids a never-stopped
run sends). `scheduling=continuous` appends the turns at most every `CONTINUOUS_TURNS_S` seconds
and whenever dialogues finish."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from personalens.data.records import Role, Scenario
from personalens.engines.base import Engine, Sampling, derive_seed
from personalens.engines.placement.inflight import Cache
from personalens.engines.stop import Stop
from personalens.errors import PersonalensError
from personalens.progress import Progress, prompt_usage
from personalens.prompts.render import assistant_messages, user_agent_messages
from personalens.prompts.setting import PromptSetting
from personalens.prompts.templates import Templates
from personalens.simulate.continuous import run_continuous
from personalens.simulate.dialogue import Dialogue, DialogueKey, EndRules, TurnRecord
from personalens.simulate.history import with_own_thinking
from personalens.simulate.lockstep import Render, StepStats, run_lockstep
from personalens.simulate.trace import CallTrace, TraceTotals
from personalens.simulate.window import AUTO, lockstep_window
from personalens.store import ENDING_NAMES, ENDINGS, PartWriter

log = logging.getLogger(__name__)

CONTINUOUS_TURNS_S = 30.0  # scheduling=continuous: the longest a simulated turn waits to be stored
_TURN_FIELDS = tuple(f.name for f in dataclasses.fields(TurnRecord))


@dataclass(frozen=True)
class Protocol:
    max_rounds_sd: int
    max_rounds_md: int
    sampling: Mapping[Role, Sampling]  # user agent and assistant
    rules: EndRules = EndRules()  # how TERMINATE and the round cap end a dialogue
    # tokens a role's prompt must leave for its reply inside its model's context, else the dialogue
    # ends on context (None: the role's reply_tokens, its thinking budget and max_tokens, so that no reply is
    # cut by the context)
    context_room: int | None = None

    def max_rounds(self, scenario: Scenario) -> int:
        return self.max_rounds_sd if scenario.task.kind == "SD" else self.max_rounds_md

    def room(self) -> dict[Role, int]:
        return {
            role: s.reply_tokens if self.context_room is None else self.context_room
            for role, s in self.sampling.items()
        }


@dataclass(frozen=True)
class Scheduling:
    """How `generate` feeds the engines; none of it changes the prompts or the seeds."""

    mode: str = "lockstep"  # lockstep (lockstep.py) | continuous (continuous.py)
    chunk: int = 4096  # lockstep: a step's requests for one engine go in calls of at most this many
    keep_ids: bool = True  # prompts as token ids kept per dialogue, for engines that tokenize here
    in_flight: int = 0  # continuous: dialogues running at once (0: all)
    cohorts: int = 0  # lockstep: cohorts taking turns on the engines (0: one per engine, lockstep.py)
    # lockstep: dialogues in flight (0: all; AUTO: as many as the dialogue models' `caches` keep
    # with their histories cached, window.py)
    window: int = 0
    caches: tuple[Cache, ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in ("lockstep", "continuous"):
            raise PersonalensError(f"scheduling: expected lockstep or continuous, got {self.mode!r}")
        if self.chunk < 1 or self.in_flight < 0 or self.cohorts < 0 or self.window < AUTO:
            raise PersonalensError(
                f"lockstep.max_requests_per_call must be >= 1, continuous.in_flight >= 0, lockstep.cohorts "
                f"auto or >= 1 and lockstep.in_flight auto, all or >= 1, got {self.chunk}, {self.in_flight}, "
                f"{self.cohorts or 'auto'}, {self.window}"
            )


@dataclass(frozen=True)
class GenerateSummary:
    dialogues: int
    skipped: int
    turns: int
    completion_tokens: int
    seconds: float
    prompt_tokens: int = 0
    cached_tokens: int = 0
    trace: TraceTotals = field(default_factory=TraceTotals)
    ended: dict[str, int] = field(default_factory=dict)  # dialogues per ending (dialogue.py ENDINGS)
    cut: dict[str, int] = field(default_factory=dict)  # replies cut at max_tokens, per role
    resumed: int = 0  # dialogues continued from the turns an earlier, stopped invocation stored
    resumed_turns: int = 0  # the stored turns they started from
    # a reasoning model's thinking tokens per role (those of replies that stopped inside it included)
    thinking: dict[str, int] = field(default_factory=dict)
    stopped: dict[str, int] = field(default_factory=dict)  # replies that stopped inside their thinking, per role

    def line(self) -> str:
        rate = self.completion_tokens / self.seconds if self.seconds > 0 else 0.0
        endings = ", ".join(f"{self.ended.get(e, 0)} {ENDING_NAMES[e]}" for e in ENDINGS)
        cut = ", ".join(f"{role} {n}" for role, n in sorted(self.cut.items())) or "none"
        thinking = ", ".join(
            f"{role} {n} ({self.stopped.get(role, 0)} stopped in it)" for role, n in sorted(self.thinking.items()) if n
        )
        return (
            f"generate: {self.dialogues} dialogues simulated ({self.skipped} already done, skipped; "
            f"{self.resumed} resumed from {self.resumed_turns} stored turns), {self.turns} turns, {self.completion_tokens} generated tokens in {self.seconds:.1f} s "
            f"({rate:.1f} tokens/s); ended: {endings}; replies cut at max_tokens: {cut}; "
            f"thinking tokens: {thinking or 'none'}; "
            f"{prompt_usage(self.prompt_tokens, self.cached_tokens)}; {self.trace.line()}"
        )


def plan_dialogues(
    scenarios: Sequence[Scenario],
    setting: PromptSetting,
    trials: int,
    seed: int,
    protocol: Protocol,
    done: set[DialogueKey],
) -> tuple[list[Dialogue], int]:
    """The dialogues still to simulate, and how many were skipped as already written."""
    todo, skipped = [], 0
    for trial in range(trials):
        for scenario in scenarios:
            key = (scenario.user.user_id, scenario.task.task_id, setting.label, trial)
            if key in done:
                skipped += 1
                continue
            todo.append(
                Dialogue(
                    scenario=scenario,
                    setting=setting.label,
                    trial=trial,
                    # not the setting: the ablation settings of a scenario and trial sample alike
                    seed=derive_seed(seed, *key[:2], trial),
                    max_rounds=protocol.max_rounds(scenario),
                    rules=protocol.rules,
                )
            )
    return todo, skipped


def renderer(templates: Templates, setting: PromptSetting, family: str = "default", keep: str = "family") -> Render:
    """The prompt of whichever role a dialogue waits on; `family` picks the assistant's prompts, `keep`
    (its history_reasoning) how much of its own earlier thinking they carry (history.py)."""

    def render(dialogue: Dialogue, role: Role):
        history = dialogue.history()
        if role == "user":
            return user_agent_messages(templates, dialogue.scenario, history)
        messages = assistant_messages(templates, dialogue.scenario, history, setting, family)
        return with_own_thinking(messages, dialogue.turns, keep)

    return render


def id_columns(dialogue: Dialogue, run_id: str, engines: Mapping[Role, Engine]) -> dict:
    scenario = dialogue.scenario
    return {
        "run_id": run_id,
        "user_id": scenario.user.user_id,
        "user_index": scenario.user.index,
        "task_id": scenario.task.task_id,
        "kind": scenario.task.kind,
        "domains": list(scenario.task.domains),
        "setting": dialogue.setting,
        "trial": dialogue.trial,
        "assistant_model": engines["assistant"].name,
        "user_model": engines["user"].name,
    }


def dialogue_row(
    dialogue: Dialogue, run_id: str, engines: Mapping[Role, Engine], config_hash: str, session_started: float
) -> dict:
    return {
        **id_columns(dialogue, run_id, engines),
        "seed": dialogue.seed,
        "turns": [vars(t) for t in dialogue.turns],
        "rounds": dialogue.rounds,
        "ended": dialogue.ended,
        "error": dialogue.error,
        "opening_terminate": dialogue.opening_terminate,
        "seconds": (dialogue.finished or 0.0) - (dialogue.started or 0.0),
        "config_hash": config_hash,
        "session_started": session_started,
        "stopped_turn": vars(dialogue.stopped) if dialogue.stopped is not None else None,
    }


def resume(todo: Sequence[Dialogue], stored: Mapping[DialogueKey, Sequence[dict]], now: float) -> int:
    """Continues each dialogue of `todo` from its stored turns (store/turns.py rows); how many turns
    that restored."""
    restored = 0
    for dialogue in todo:
        rows = stored.get(dialogue.key, ())
        try:
            dialogue.resume([(TurnRecord(**{f: r[f] for f in _TURN_FIELDS}), r["said_terminate"]) for r in rows], now)
        except ValueError as err:
            raise PersonalensError(
                f"the stored turns of this shard (its turns/ folder) cannot continue dialogue {dialogue.key}: {err}; "
                "they were changed by hand: delete that shard's turns/ folder to simulate its unfinished dialogues "
                "from their openings"
            ) from None
        restored += len(rows)
    return restored


def turn_rows(
    dialogue: Dialogue, start: int, run_id: str, session_started: float, follows: float | None = None
) -> list[dict]:
    """The store/turns.py rows of the dialogue's turns from `start` on; `follows`: the invocation that
    stored turn `start - 1` (None: `start` is the opening)."""
    user_id, task_id, setting, trial = dialogue.key
    return [
        {
            "run_id": run_id,
            "user_id": user_id,
            "task_id": task_id,
            "setting": setting,
            "trial": trial,
            "index": index,
            **vars(turn),
            "said_terminate": dialogue.said_terminate(index),
            "session_started": session_started,
            "follows_session": follows if index == start else session_started,
        }
        for index, turn in enumerate(dialogue.turns[start:], start)
    ]


def trace_row(trace: CallTrace, run_id: str, session_started: float) -> dict:
    return {"run_id": run_id, "session_started": session_started, **vars(trace), "roles": list(trace.roles)}


def generate(
    scenarios: Sequence[Scenario],
    *,
    setting: PromptSetting,
    templates: Templates,
    load_engines: Callable[[], Mapping[Role, Engine]],
    protocol: Protocol,
    trials: int,
    seed: int,
    writer: PartWriter,
    trace_writer: PartWriter | None = None,
    turn_writer: PartWriter | None = None,
    stored: Mapping[DialogueKey, Sequence[dict]] | None = None,
    stop: Stop | None = None,
    done: set[DialogueKey],
    run_id: str,
    config_hash: str,
    progress: bool = True,
    family: str = "default",
    history_reasoning: str = "family",
    scheduling: Scheduling = Scheduling(),
) -> GenerateSummary:
    """`load_engines` is called only when there is something to simulate; `trace_writer` receives
    one part file of trace rows per step (None: no trace), `turn_writer` one of the step's new turns
    (None: none kept). `stored`: the turns a stopped invocation stored, by dialogue (store/turns.py),
    which its unfinished dialogues continue from. `stop` is checked after each step, once its turns
    are written: a requested stop raises there (engines/stop.py)."""
    todo, skipped = plan_dialogues(scenarios, setting, trials, seed, protocol, done)
    session_started = time.time()  # tells a resumed run's dialogues and calls from the earlier runs' ones
    stored = stored or {}
    resumed_turns = resume(todo, stored, time.monotonic())
    resumed = sum(bool(d.turns) for d in todo)
    engines = load_engines() if todo else {}
    if stop is not None:
        stop.check()

    bar = Progress(total=len(todo), label="generate", unit="dialogue", enabled=progress)
    totals = {"turns": 0, "tokens": 0, "prompt": 0, "cached": 0}
    traced = TraceTotals()
    ended: dict[str, int] = {}
    cut: dict[str, int] = {}
    stored_up_to = {id(d): len(d.turns) for d in todo}  # turns of each dialogue in the turns table
    # the invocation that stored each dialogue's last stored turn: the one its next turn answers
    follows = {id(d): stored[d.key][-1]["session_started"] if d.turns else None for d in todo}
    continuous = scheduling.mode == "continuous"
    turns_stored_at = time.monotonic()

    def store_turns(advanced: Sequence[Dialogue] | None = None) -> None:
        """Appends the new turns of the `advanced` dialogues (None: of every dialogue)."""
        nonlocal turns_stored_at
        turns_stored_at = time.monotonic()
        rows = []
        for d in todo if advanced is None else advanced:
            if len(d.turns) > stored_up_to[id(d)]:
                rows += turn_rows(d, stored_up_to[id(d)], run_id, session_started, follows[id(d)])
                stored_up_to[id(d)], follows[id(d)] = len(d.turns), session_started
        if turn_writer is not None:
            turn_writer.write(rows)

    thinking: dict[str, int] = {}
    stopped: dict[str, int] = {}

    def on_finished(finished: list[Dialogue]) -> None:
        store_turns(finished)  # first: a dialogue is only ever written with its turns stored
        writer.write([dialogue_row(d, run_id, engines, config_hash, session_started) for d in finished])
        for dialogue in finished:
            ended[dialogue.ended] = ended.get(dialogue.ended, 0) + 1
            for turn in dialogue.turns:
                cut[turn.role] = cut.get(turn.role, 0) + (turn.finish_reason == "length")
                thinking[turn.role] = thinking.get(turn.role, 0) + (turn.reasoning_tokens or 0)
            if dialogue.stopped is not None:
                role, tokens = dialogue.stopped.role, dialogue.stopped.completion_tokens
                stopped[role] = stopped.get(role, 0) + 1
                thinking[role] = thinking.get(role, 0) + tokens
            dialogue.turns = []  # written: a shard's memory holds the text of running dialogues only

    def on_step(stats: StepStats) -> None:
        totals["turns"] += stats.requests
        totals["tokens"] += stats.completion_tokens
        totals["prompt"] += stats.prompt_tokens
        totals["cached"] += stats.cached_tokens
        for trace in stats.calls:
            traced.add(trace)
        if trace_writer is not None:
            trace_writer.write([trace_row(t, run_id, session_started) for t in stats.calls])
        bar.update(stats.finished, active=stats.active, tokens=stats.completion_tokens)
        stopping = stop is not None and stop.requested
        if not continuous or stopping or time.monotonic() - turns_stored_at >= CONTINUOUS_TURNS_S:
            store_turns(None if stopping or continuous else stats.advanced)
        if stop is not None:
            stop.check()

    started = time.monotonic()
    render = renderer(templates, setting, family, history_reasoning)
    ended_on_resume = [d for d in todo if d.ended is not None]  # stopped after their last turn was stored
    if ended_on_resume:
        on_finished(ended_on_resume)
    run, options = (
        (run_continuous, {"in_flight": scheduling.in_flight})
        if continuous
        else (
            run_lockstep,
            {
                "chunk": scheduling.chunk,
                "cohorts": scheduling.cohorts,
                "window": lockstep_window(
                    scheduling.window,
                    scheduling.caches,
                    {role: getattr(engines.get(role), "max_model_len", None) for role in ("user", "assistant")},
                ),
            },
        )
    )
    try:
        run(
            todo,
            engines,
            render,
            protocol.sampling,
            on_finished,
            on_step,
            keep_ids=scheduling.keep_ids,
            room=protocol.room(),
            **options,
        )
    finally:
        bar.close()
    summary = GenerateSummary(
        len(todo),
        skipped,
        totals["turns"],
        totals["tokens"],
        time.monotonic() - started,
        totals["prompt"],
        totals["cached"],
        traced,
        ended,
        cut,
        resumed,
        resumed_turns,
        thinking,
        stopped,
    )
    log.info(summary.line())
    return summary
