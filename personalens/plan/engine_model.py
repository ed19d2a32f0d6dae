"""A model of how fast vLLM serves a run's dialogues on GPUs: dialogues replayed through a simplified
continuous-batching engine (vLLM's scheduler, much simplified) whose step time comes from a roofline
model of its GPUs (gpu_model.py). `personalens plan` compares layouts with it, bench/stragglers.py schedulers.

The engine: FCFS admission while fewer than `max_num_seqs` requests run and their KV fits the cache;
every step decodes one token of every running request and prefills up to `max_num_batched_tokens` -
running prompt tokens of the admitted requests (chunked prefill). A step takes overhead + max(memory
time, compute time) + communication: memory = weights + the running requests' KV read once, compute =
2 x parameters x tokens in the step + attention over the context, communication = an engine over
several GPUs' two all-reduces a layer of the step's tokens (gpu_model.py). The prefix cache keeps
each (dialogue, role)'s last sequence (prompt and reply) until it is evicted, least recently used
first, when admissions need room; a hit saves the part of the new prompt that repeats it. A
prompt's beginning that other dialogues' prompts share (`Turn.shared`, `shared_prefix` for every
prompt: instructions, a user's profile) is a hit too: their requests keep reusing it, so it stays cached. With host memory for KV
(`GpuModel.host_tokens`, kv_offload_gib) an evicted sequence moves there, and a hit on it is copied
back at the host link's bandwidth instead of prefilled again.

Schedulers, on the same requests (same prompts, replies, order):
  lockstep    every active dialogue's next request submitted together; the next step's requests
              only when all of this step's have finished (`personalens generate` with one cohort);
              with a window W, at most W dialogues active, the others waiting their turn
  cohorts     lockstep within each of k cohorts, whose calls join the engines' running batches
              (`generate` on engines that join calls, engines/placement/cohorts.py): `_Cohorts`
  continuous  each dialogue's next request submitted as soon as its previous one finished
  window W    continuous, with at most W dialogues in flight (new ones start as others end)

bench/cohorts.py's timed engines step an `Engine` as calls submit to it. A GpuModel's numbers are
assumptions its maker states but for the host link's rate, fitted to one GPU run; the model is held
against the GPU runs recorded in docs/performance.md by tests/test_planner_measured.py and
tests/test_planner_levers.py.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from personalens.engines.placement.cohorts import window_share
from personalens.plan.gpu_model import GpuModel


@dataclass(frozen=True)
class Turn:
    role: str
    prompt: int  # prompt tokens
    reusable: int  # of them, the tokens that repeat this role's previous sequence of the dialogue
    reply: int  # generated tokens
    shared: int = 0  # of the prompt's first tokens, those other dialogues' prompts begin with too


Dialogue = Sequence[Turn]


@dataclass
class ModelRequest:
    """A request in the modelled engine: its turn and how far it has run."""

    dialogue: int
    turn: Turn
    prefill: int = 0  # prompt tokens still to compute
    remaining: int = 0  # tokens still to generate
    context: int = 0  # KV held: prompt (and reply) tokens so far
    finished: float = 0.0
    cached: int = 0  # prompt tokens served from the prefix cache


@dataclass
class Result:
    scheduling: str
    seconds: float = 0.0
    generated: int = 0
    prompt: int = 0
    computed: int = 0  # prompt tokens prefilled (not served from the cache)
    reloaded: int = 0  # prompt tokens copied back from host memory (kv_offload_gib)
    calls: list[tuple[float, float, list[float]]] = field(default_factory=list)  # lockstep: start, end, finishes
    busy: dict[str, float] = field(default_factory=dict)  # per GpuModel name: seconds its engines computed, summed

    def busy_share(self, engines: Mapping[str, int]) -> dict[str, float]:
        """Per model name, the share of the time its `engines[name]` engines computed."""
        return {n: self.busy.get(n, 0.0) / (k * self.seconds) if self.seconds else 0.0 for n, k in engines.items()}

    @property
    def tokens_per_s(self) -> float:
        return self.generated / self.seconds if self.seconds else 0.0

    def tail_share(self) -> float:
        """As the step trace counts it: the time fewer than a quarter of a call's requests ran."""
        tail = total = 0.0
        for start, end, done in self.calls:
            done = sorted(done)
            j = int(len(done) * 0.75) + 1
            tail += done[-1] - done[j - 1]
            total += end - start
        return tail / total if total else 0.0


class Engine:
    """The simplified vLLM: a waiting queue, the running requests, the prefix cache, a clock."""

    def __init__(self, gpu: GpuModel, shared_prefix: int):
        self.gpu, self.shared = gpu, shared_prefix
        self.now = 0.0
        self.waiting: deque[ModelRequest] = deque()
        self.running: list[ModelRequest] = []
        self.cache: OrderedDict[tuple[int, str], int] = OrderedDict()  # (dialogue, role) -> tokens
        self.cached_tokens = 0  # in the cache, not held by running requests
        self.held = 0  # KV of the running requests
        self.computed = 0
        # evicted sequences kept in host memory (kv_offload_gib), least recently evicted first
        self.host: OrderedDict[tuple[int, str], int] = OrderedDict()
        self.host_used = 0
        self.reloading = 0  # tokens to copy back from host memory before the next step
        self.reloaded = 0

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def submit(self, request: ModelRequest) -> None:
        self.waiting.append(request)

    def step(self, most: int | None = None) -> list[ModelRequest]:
        """Admit what fits, run engine steps up to the next that finishes a request or changes the
        batch, return the requests that finished. Steps that only decode, with nothing admissible
        waiting, are taken together (GpuModel.decode_seconds), at most `most` of them, so that a
        request submitted meanwhile waits no longer than those to be admitted."""
        self._admit()
        budget = self.gpu.max_batched_tokens - sum(1 for r in self.running if r.prefill == 0)
        prefill = 0
        for r in self.running:
            if r.prefill and budget > 0:
                chunk = min(r.prefill, budget)
                r.prefill -= chunk
                budget -= chunk
                prefill += chunk
        decoding = [r for r in self.running if r.prefill == 0]  # a finished prefill samples a token too
        steps = 1
        if not prefill and decoding and not self._admissible():
            steps = min(r.remaining for r in decoding)
            if most is not None:
                steps = max(1, min(steps, most))
        self.now += self.gpu.reload_seconds(self.reloading)
        self.reloaded, self.reloading = self.reloaded + self.reloading, 0
        if steps == 1:
            self.now += self.gpu.step_seconds(len(decoding), prefill, self.held)
        else:
            self.now += self.gpu.decode_seconds(len(decoding), self.held, steps)
        self.computed += prefill
        done = []
        for r in decoding:
            r.remaining -= steps
            r.context += steps
            if r.remaining <= 0:
                r.finished = self.now
                done.append(r)
        self.held += steps * len(decoding)
        if done:
            self.running = [r for r in self.running if r.remaining > 0]
            for r in done:  # its prompt and reply stay cached for the dialogue's next turn
                self.held -= r.context
                self.cache[(r.dialogue, r.turn.role)] = r.context
                self.cached_tokens += r.context
        return done

    def _admissible(self) -> bool:
        """Whether the next admission could take the first waiting request (decoding never frees KV)."""
        if not self.waiting or len(self.running) >= self.gpu.max_num_seqs:
            return False
        return not self.running or self.held + self.waiting[0].turn.prompt <= self.gpu.kv_tokens

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.gpu.max_num_seqs:
            r = self.waiting[0]
            if self.running and self.held + r.turn.prompt > self.gpu.kv_tokens:
                break
            key = (r.dialogue, r.turn.role)
            own = self.cache.pop(key, 0)  # its blocks become the request's own
            self.cached_tokens -= own
            offloaded = self.host.pop(key, 0) if not own else 0
            self.host_used -= offloaded
            while self.cache and self.held + r.turn.prompt + self.cached_tokens > self.gpu.kv_tokens:
                evicted, size = self.cache.popitem(last=False)  # the least recently used
                self.cached_tokens -= size
                self._offload(evicted, size)
            self.waiting.popleft()
            self.reloading += min(offloaded, r.turn.reusable)
            hit = max(min(own or offloaded, r.turn.reusable), min(max(self.shared, r.turn.shared), r.turn.prompt))
            r.prefill, r.remaining, r.context, r.cached = r.turn.prompt - hit, r.turn.reply, r.turn.prompt, hit
            self.running.append(r)
            self.held += r.context

    def _offload(self, key: tuple[int, str], size: int) -> None:
        """An evicted sequence copied to host memory while it has room, the oldest there dropped."""
        if size > self.gpu.host_tokens:
            return
        while self.host_used + size > self.gpu.host_tokens:
            self.host_used -= self.host.popitem(last=False)[1]
        self.host[key] = size
        self.host_used += size


Engines = GpuModel | Mapping[str, Sequence[GpuModel]]


def simulate(
    dialogues: Sequence[Dialogue],
    gpus: Engines,
    scheduling: str,
    window: int | None = None,
    shared_prefix: int = 0,
    cohorts: int = 1,
    least: int = 1,
) -> Result:
    """Replay every dialogue's turns through engine models under one scheduler. `gpus` is one engine
    serving every role, or per role its engines (replicas, on GPUs of their own, each taking every
    k-th dialogue); a GpuModel named for several roles is one engine. Lockstep steps run on the
    engines of their requests in parallel; with `cohorts` > 1, the dialogues are dealt into that many
    cohorts whose calls join the engines' running batches (`_Cohorts`; `least`: a cohort's fewest
    dialogues of the window, engines/placement/cohorts.py). Continuous scheduling is modelled on one
    engine."""
    made: dict[int, Engine] = {}
    by_role = {
        role: [made.setdefault(id(g), Engine(g, shared_prefix)) for g in models]
        for role, models in (gpus.items() if isinstance(gpus, Mapping) else [("*", [gpus])])
    }
    engines = list(made.values())

    def engine_of(d: int, role: str) -> Engine:
        replicas = by_role.get(role) or by_role["*"]
        return replicas[d % len(replicas)]

    result = Result(scheduling if window is None else f"{scheduling}, window {window}")
    position = [0] * len(dialogues)  # each dialogue's next turn

    def request(d: int) -> tuple[Engine, ModelRequest]:
        turn = dialogues[d][position[d]]
        result.generated += turn.reply
        result.prompt += turn.prompt
        return engine_of(d, turn.role), ModelRequest(d, turn)

    def submit(d: int) -> Engine:
        engine, made = request(d)
        engine.submit(made)
        return engine

    if scheduling == "lockstep" and cohorts > 1:
        result.seconds = _Cohorts(dialogues, position, request, result, engines, cohorts, least).run(window)
    elif scheduling == "lockstep":
        waiting = deque(d for d in range(len(dialogues)) if dialogues[d])
        active = [waiting.popleft() for _ in range(min(window or len(waiting), len(waiting)))]
        now = 0.0
        while active:
            working = {id(e): e for e in (submit(d) for d in active)}.values()
            finishes: list[float] = []
            for engine in working:  # each on its own GPUs: they run side by side
                engine.now = now
                while engine.busy:
                    finishes += [r.finished for r in engine.step()]
                result.busy[engine.gpu.name] = result.busy.get(engine.gpu.name, 0.0) + engine.now - now
            end = max(e.now for e in working)
            result.calls.append((now, end, finishes))
            now = end
            for d in active:
                position[d] += 1
            active = [d for d in active if position[d] < len(dialogues[d])]
            while waiting and len(active) < (window or len(dialogues)):  # ended dialogues make room
                active.append(waiting.popleft())
        result.seconds = now
    else:
        if len(engines) > 1:
            raise ValueError("continuous scheduling is modelled on one engine")
        [engine] = engines
        waiting = deque(d for d in range(len(dialogues)) if dialogues[d])
        for _ in range(min(window or len(waiting), len(waiting))):
            submit(waiting.popleft())
        while engine.busy:
            for r in engine.step():
                position[r.dialogue] += 1
                if position[r.dialogue] < len(dialogues[r.dialogue]):
                    submit(r.dialogue)
                elif waiting:  # a dialogue ended: the next one starts
                    submit(waiting.popleft())
        result.seconds = engine.now
    result.computed = sum(e.computed for e in engines)
    result.reloaded = sum(e.reloaded for e in engines)
    return result


JUMP = (
    16  # defined: the most decode steps a cohort engine model takes at once: a call arriving meanwhile waits that long
)


class _Cohorts:
    """Lockstep in cohorts whose calls join the engines' batches, as `generate` runs it with engines
    that join calls (simulate/lockstep.py): the dialogues dealt round-robin into cohorts (or, with a
    window, each cohort filled to its share of it as its dialogues end); a cohort's next turns are
    submitted when the last of its previous turns finished, and join the engine's running batch at
    its next step. Each engine keeps its own clock; the engine furthest behind steps next, so that a
    request is never admitted before it was submitted, and an engine takes at most `JUMP` decode steps
    at once, so that a request submitted meanwhile waits no longer than those."""

    def __init__(
        self,
        dialogues: Sequence[Dialogue],
        position: list[int],
        request: Callable[[int], tuple[Engine, ModelRequest]],
        result: Result,
        engines: list[Engine],
        count: int,
        least: int,
    ):
        self.dialogues, self.position, self.request, self.result = dialogues, position, request, result
        self.engines, self.count, self.least = engines, count, least
        # per engine, the requests submitted to it that it has not taken yet: (when, order, request)
        self.arriving: dict[int, list[tuple[float, int, ModelRequest]]] = {id(e): [] for e in engines}
        self.order = itertools.count()
        self.cohort_of: dict[int, int] = {}  # id of a request in flight -> its cohort
        self.pending = [0] * count  # each cohort's requests in flight
        self.started = [0.0] * count
        self.finishes: list[list[float]] = [[] for _ in range(count)]

    def run(self, window: int | None) -> float:
        """Every dialogue to its end; the modelled seconds until the last call ended."""
        live = [d for d in range(len(self.dialogues)) if self.dialogues[d]]
        if window is None:
            self.groups = [live[k :: self.count] for k in range(self.count)]
            self.waiting: deque[int] = deque()
        else:
            self.groups = [[] for _ in range(self.count)]
            self.waiting = deque(live)
        self.window, end = window, 0.0
        self._restart(range(self.count), 0.0)
        while ready := [e for e in self.engines if e.busy or self.arriving[id(e)]]:
            engine = min(ready, key=self._next)
            end = max(end, self._step(engine))
        return end

    def _next(self, engine: Engine) -> float:
        """When the engine's next step starts: now while it runs, else when the next request arrives."""
        return engine.now if engine.busy else max(engine.now, self.arriving[id(engine)][0][0])

    def _step(self, engine: Engine) -> float:
        engine.now = self._next(engine)
        arriving = self.arriving[id(engine)]
        while arriving and arriving[0][0] <= engine.now:
            engine.submit(heapq.heappop(arriving)[2])
        before = engine.now
        done = engine.step(JUMP)
        self.result.busy[engine.gpu.name] = self.result.busy.get(engine.gpu.name, 0.0) + engine.now - before
        ended = []
        for r in done:
            k = self.cohort_of.pop(id(r))
            self.pending[k] -= 1
            self.finishes[k].append(r.finished)
            if not self.pending[k]:
                ended.append(k)
        for k in ended:  # the cohort's call ended: its dialogues advance, those that end drop out
            self.result.calls.append((self.started[k], engine.now, self.finishes[k]))
            self.finishes[k] = []
            for d in self.groups[k]:
                self.position[d] += 1
            self.groups[k] = [d for d in self.groups[k] if self.position[d] < len(self.dialogues[d])]
        if ended:
            self._restart([k for k in range(self.count) if not self.pending[k]], engine.now)
        return engine.now if ended else 0.0

    def _restart(self, idle: Iterable[int], now: float) -> None:
        """The idle cohorts, filled to their share of the window, submit their next turns at `now`."""
        for k in idle:
            if self.window is not None:
                share = window_share(self.window, self.count, self.least, k)
                while self.waiting and len(self.groups[k]) < share:
                    self.groups[k].append(self.waiting.popleft())
            if self.groups[k]:
                self.started[k] = now
                for d in self.groups[k]:
                    engine, made = self.request(d)
                    self.cohort_of[id(made)] = k
                    self.pending[k] += 1
                    heapq.heappush(self.arriving[id(engine)], (now, next(self.order), made))
