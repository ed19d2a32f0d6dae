"""An engine over an in-process `vllm.LLM`: one batched chat call per generate(), its requests
queued one by one and the engine stepped until all have finished; the command's stop is looked at
before every step, and what is still queued when a call ends early is aborted.

Calls may run in several threads at once (`joins_calls`, for lockstep cohorts): their requests share
vLLM's batch, a later call's joining at the next step. vLLM's LLM is not thread-safe, so adding,
stepping and aborting hold the engine's lock; whichever call steps hands the finished replies of
the others to them (`_done`), and each call takes its own, reports them from its own thread and
returns them in its request order. No call steps while another's finished replies wait for it (for
a moment: `TAKE_WAIT_S`), so each takes them at the step that finished them, however many calls
run. A call that ends early aborts only its own requests.

An engine that is one copy of a model among server copies (replicated.py; `capped`, set by the
factory) keeps in flight only as many requests as its KV cache holds, by the rule that caps its
server copies (engines/flow.py), over all its calls together, the next queued as one finishes; any
other queues them all.

vLLM starts worker processes; a script that builds this engine needs an `if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from collections import deque
from collections.abc import Sequence
from fractions import Fraction

from personalens.engines.base import Generation, OnFinished, Request, check_refusals, dropped, rejected
from personalens.engines.chat import budget, harmony
from personalens.engines.chat.dates import strftime_now
from personalens.engines.chat.harmony import split_harmony
from personalens.engines.chat.messages import format_messages, resolve_system_role
from personalens.engines.chat.reasoning import (
    PAIRS,
    load_parser,
    opens_thinking,
    split_ids,
    split_text,
    thinking_tokens,
    with_split,
)
from personalens.engines.chat.token_ids import ChatTokenizer
from personalens.engines.dtype import local_dtype
from personalens.engines.flow import InFlight, PromptSizes, ReplySizes, in_flight, needs, share
from personalens.engines.models.config import ModelConfig, ModelConfigError
from personalens.engines.models.embedded import model_path
from personalens.engines.spec_decode import SpecCounts
from personalens.engines.stop import Stop
from personalens.engines.vllm.args import engine_args
from personalens.engines.vllm.check import check_in_process
from personalens.engines.vllm.params import generation, sampling_params
from personalens.engines.vllm.turn_lock import TurnLock

log = logging.getLogger(__name__)

TAKE_WAIT_S = 0.1  # the longest a call waits for others to take their replies before it steps
YIELD_S = 0.001  # a call that let others take their replies waits this long before its next turn
_PROMPT_TAIL = 32  # tokens at a prompt's end read to see whether its template opened a thinking block


class VllmEngine:
    joins_calls = True  # base.Engine: concurrent calls share vLLM's batch
    speculative = False  # whether it drafts (its config's `speculative`), set when it loads
    _drafts = None  # its spec-decode counter (spec_stats.py) where it drafts

    def __init__(self, config: ModelConfig, stop: Stop | None = None):
        # gpt-oss: its harmony channels are read on the output ids (engines/chat/harmony.py)
        self._harmony = harmony.encoding() if config.reasoning_parser == harmony.PARSER else None
        check_in_process()  # the installed vLLM is one this code runs on, before a model loads
        model = model_path(config)
        if config.cpu_reserved_cores is not None:
            # read by vLLM's engine processes when they start; a value the user exported wins
            os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", str(config.cpu_reserved_cores))
        self._stop = stop or Stop()
        # with vLLM's engine core in this process its steps share process-wide state (the forward
        # context), so no other engine of this process may step at the same time
        self.overlaps = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0"
        started = time.monotonic()
        from vllm import LLM  # heavy; only engines that run in-process need it
        from vllm.platforms import current_platform

        from personalens.engines.vllm.spec_stats import count_spec_decode  # imports vLLM

        self.name = config.name
        self.dtype = local_dtype(config.dtype)
        self.speculative = bool(config.speculative)  # its stats then on, for the drafts it counts (spec_stats.py)
        self._llm = LLM(**engine_args(config, model, self.dtype.dtype), disable_log_stats=not self.speculative)
        self._drafts = count_spec_decode(self._llm, self.name) if self.speculative else None
        tokenizer = self._llm.get_tokenizer()
        self._system_role = resolve_system_role(config.system_role, tokenizer.chat_template)
        # the template and tokenizer LLM.chat applies, for callers that keep prompts as token ids
        self.chat_tokenizer = ChatTokenizer(tokenizer, self._system_role, config.template_kwargs)
        self._template_kwargs = config.template_kwargs or None
        self._parser = self._reasoning_parser(config, tokenizer)
        self.max_model_len = self._llm.llm_engine.model_config.max_model_len
        cache = self._llm.llm_engine.vllm_config.cache_config
        # tokens its KV cache holds (vLLM's engine core reports its blocks when it starts)
        self.kv_tokens = (cache.num_gpu_blocks or 0) * (cache.block_size or 0) or None
        self.max_num_seqs = config.max_num_seqs
        self.capped = False  # the factory's: one copy of a model whose other copies are servers
        self._sizes, self._replies = PromptSizes(), ReplySizes()
        self._lock = TurnLock()  # held to add requests, step and abort: vLLM's LLM is not thread-safe
        self._stepped_at = 0.0  # when the last step finished replies of some call
        self._running: dict[str, Fraction] = {}  # the calls' requests in vLLM, with their in-flight shares
        self._done: dict[str, Generation] = {}  # their replies that a step finished, by id, until taken
        self._in_flight = InFlight()  # where capped: one budget for all the engine's calls
        # failures of the engine itself, which stop the command; anything else raised while adding a
        # request is vLLM refusing that request
        from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

        self._fatal = (EngineDeadError, EngineGenerateError, MemoryError)
        self._refused: list[tuple[str, Generation]] = []
        self._next_refusal = 0
        # replies with a thinking budget, in two requests (engines/chat/budget.py)
        self._chains = budget.Chains()
        start, end = (getattr(self._parser, f"reasoning_{at}_str", None) for at in ("start", "end"))
        self._markers = budget.markers(config.reasoning_parser, start, end)
        self._forced = tokenizer.encode(self._markers.forced, add_special_tokens=False)
        log.info(
            f"loaded {self.name}: {self.dtype.describe()}, on {current_platform.device_type}, "
            f"in {time.monotonic() - started:.1f} s"
        )

    def generate(self, requests: Sequence[Request], on_finished: OnFinished | None = None) -> list[Generation]:
        """One batched call: every request queued, then the engine stepped until all have finished.
        A request vLLM refuses (its prompt too long, say) is answered as `rejected`; the rest run.
        A call whose requests are all refused for one reason raises `RefusedAll`. Safe to call from
        several threads at once (the module's docstring)."""
        if not requests:
            return []
        self._stop.check()
        replies: list[Generation | None] = [None] * len(requests)
        queued: dict[str, int] = {}  # this call's requests in vLLM, or finished and not yet taken
        waiting = deque(range(len(requests)))
        each = share(self.slots(requests)) if self.capped else Fraction(0)  # not capped: all at once
        turn = object()  # the call's place in the engine's in-flight queue (first come, first served)
        try:
            while queued or waiting:
                with self._lock:
                    refused = self._add(requests, waiting, queued, replies, each, turn)
                    mine = self._take(queued)
                    # no step while another call's finished replies wait for it (up to TAKE_WAIT_S, so
                    # a call busy elsewhere holds no other up): the lock goes round in turn, so each
                    # call takes its own at the step that finished them, however many calls run
                    yielded = bool(self._done) and time.monotonic() - self._stepped_at < TAKE_WAIT_S
                    if not mine and self._running and not yielded:  # a step, for every call
                        self._step()
                        mine = self._take(queued)
                if not mine and not refused and yielded:
                    time.sleep(YIELD_S)
                if on_finished is not None and refused:
                    on_finished(refused, 0)
                for request_id, gen in mine:
                    i = queued.pop(request_id)
                    replies[i] = gen
                    self._sizes.add(requests[i], gen.prompt_tokens)
                    self._replies.add(requests[i], gen.completion_tokens)
                    if on_finished is not None:
                        on_finished(1, gen.completion_tokens)
        finally:
            self._in_flight.leave(turn)
            if queued:  # interrupted: nothing of this call stays queued in the engine
                self._abort(queued)
        check_refusals(self.name, replies)
        return replies

    def _add(
        self,
        requests: Sequence[Request],
        waiting: deque[int],
        queued: dict[str, int],
        replies: list[Generation | None],
        each: Fraction,
        turn: object,
    ) -> int:
        """Queues the call's waiting requests while the engine's in-flight budget takes them, the call
        waiting its `turn` behind calls that came first (the caller holds the lock); how many vLLM
        refused (answered in `replies`)."""
        refused = 0
        while waiting and self._in_flight.try_take(each, turn):
            i = waiting.popleft()
            request_id, refusal = self._queue(requests[i])
            if refusal is None:
                queued[request_id], self._running[request_id] = i, each
            else:
                self._in_flight.give(each)
                replies[i], refused = refusal, refused + 1
        return refused

    def _take(self, queued: dict[str, int]) -> list[tuple[str, Generation]]:
        """The call's finished replies, taken from `_done` (the caller holds the lock)."""
        return [(request_id, self._done.pop(request_id)) for request_id in list(self._done) if request_id in queued]

    def _step(self) -> None:
        """One step of vLLM for every running call: the finished replies go to `_done`, their shares
        back to the budget (the caller holds the lock). Requests vLLM no longer runs, yet never
        reported finished, are answered as refused, so that no call waits on them forever."""
        finished = self._stepped()
        if self._idle():
            seen = {request_id for request_id, _ in finished}
            finished += [(request_id, dropped()) for request_id in self._running if request_id not in seen]
        for request_id, gen in finished:
            each = self._running.pop(request_id, None)
            if each is not None:
                self._in_flight.give(each)
                self._done[request_id] = gen
                self._stepped_at = time.monotonic()

    def _idle(self) -> bool:
        """Whether vLLM runs no request (the caller holds the lock)."""
        return not self._llm.llm_engine.has_unfinished_requests()

    def _abort(self, queued: dict[str, int]) -> None:
        """Ends an interrupted call: its requests still in vLLM aborted (a thinking request's answer
        request where one runs), its replies not taken dropped; the other calls' go on."""
        with self._lock:
            running = [request_id for request_id in queued if request_id in self._running]
            for request_id in queued:
                self._done.pop(request_id, None)
            if running:
                # the ids kept are those LLM.enqueue gave (external: vLLM's own, internal ids add a
                # random suffix, so internal=True would match none and abort nothing)
                self._llm.llm_engine.abort_request(self._chains.forget(running), internal=False)
            for request_id in running:
                self._in_flight.give(self._running.pop(request_id))

    def slots(self, requests: Sequence[Request]) -> int:
        """Requests of a call to a capped engine to keep in flight (each then takes one over that of
        the engine's budget, which its concurrent calls share): what engines/flow.py gives for its KV
        cache and max_num_seqs (logged when it holds some back)."""
        shared, each = needs(requests, self._sizes, self._replies)
        n = in_flight(self.kv_tokens, each, self.max_num_seqs, shared)
        if n < len(requests):
            log.info(
                f"{self.name}: its KV cache holds {self.kv_tokens or 0:,} tokens: {n} of {len(requests)} requests "
                f"in flight (about {sum(each) // len(each):,} tokens each with its expected reply, beside a shared "
                f"prefix of {shared:,})"
            )
        return n

    def submit(self, requests: Sequence[Request]) -> list[str]:
        """Queue requests without running them (scheduling=continuous); `finished` returns them,
        a refused one at its next call."""
        ids = []
        with self._lock:
            for request in requests:
                request_id, refusal = self._queue(request)
                if refusal is not None:
                    self._refused.append((request_id, refusal))
                ids.append(request_id)
        return ids

    def finished(self) -> list[tuple[str, Generation]]:
        """One step of the engine: the queued requests that finished in it."""
        self._stop.check()
        refused, self._refused = self._refused, []
        if refused:  # answered at once, so a caller never waits on an engine with nothing to do
            return refused
        with self._lock:
            return self._stepped()

    def idle(self) -> bool:
        """Whether none of the submitted requests is still to be answered: none refused and not yet
        returned by `finished`, none running in vLLM."""
        with self._lock:
            return not self._refused and self._idle()

    def _stepped(self) -> list[tuple[str, Generation]]:
        """One step of vLLM, after a look at the command's stop: the requests that finished in it
        (the caller holds the lock). A finished output that cannot be read (its thinking split, its
        text decoded) is answered as refused, alone: the step's other replies are handed on."""
        self._stop.check()
        done = []
        for out in self._llm.llm_engine.step():
            if out.finished:
                done += self._chained(out, self._read(out))
        return done

    def _chained(self, out, gen: Generation) -> list[tuple[str, Generation]]:
        """A finished request's reply as its caller takes it: an answer request's joined to its thinking
        (under the thinking request's id); a thinking request's, unless its answer request is queued
        now (engines/chat/budget.py), which then answers for it."""
        joined = self._chains.finished(out.request_id, gen)
        request = self._chains.thinking.pop(out.request_id, None)
        if joined is not None or request is None:
            return [joined or (out.request_id, gen)]
        action = budget.step(request, gen, out.outputs[0].finish_reason == "length")
        if action in (budget.END, budget.KEEP):
            return [(out.request_id, gen)]
        forced = self._forced if action == budget.FORCE else ()
        ids = (
            None if action == budget.AGAIN else budget.continued(out.prompt_token_ids, out.outputs[0].token_ids, forced)
        )
        return self._answer(out.request_id, budget.answer_request(request, ids), gen, ids is not None)

    def _answer(
        self, first_id: str, request: Request, first: Generation, continues: bool
    ) -> list[tuple[str, Generation]]:
        """Queues the answer request of thinking request `first_id` (a refusal answers for it at once);
        `continues`: it continues the thinking's ids (budget.py's `Chains.answering`)."""
        answer_id, refusal = self._queue(request)
        if refusal is not None:
            return [(first_id, budget.joined(first, refusal))]
        self._chains.answering(answer_id, first_id, first, continues)
        return []

    def _read(self, out) -> Generation:
        try:
            if out.request_id in self._chains.continuing:  # an answer request's text is all answer
                return budget.read_answer(generation(out, self.speculative))
            return self._split(out)
        except self._fatal:
            raise
        except Exception as err:
            log.warning(f"{self.name}: the reply to request {out.request_id} could not be read: {err!r}")
            return rejected(f"its reply could not be read: {type(err).__name__}: {err}", len(out.prompt_token_ids))

    def _reasoning_parser(self, config: ModelConfig, tokenizer):
        """vLLM's reasoning parser of the config (None: the text fallback of engines/chat/reasoning.py,
        or harmony's channels for gpt-oss)."""
        if not config.reasoning_parser or self._harmony is not None:
            return None
        try:
            return load_parser(config.reasoning_parser, tokenizer, config.template_kwargs)
        except (KeyError, RuntimeError, ValueError) as err:
            raise ModelConfigError(f"model {config.name!r}: reasoning_parser {config.reasoning_parser}: {err}") from err

    def _split(self, out) -> Generation:
        """The reply of a finished request, its thinking split from its answer (engines/chat/reasoning.py)."""
        gen = generation(out, self.speculative)
        if gen.error is not None:
            return gen
        reply = out.outputs[0]
        if self._harmony is not None:
            return with_split(gen, split_harmony(reply.token_ids, self._harmony))
        tokenizer = self.chat_tokenizer.tokenizer
        pairs = PAIRS
        if self._parser is not None and getattr(self._parser, "reasoning_end_str", None):
            pairs = ((self._parser.reasoning_start_str or "", self._parser.reasoning_end_str),)
        tail = tokenizer.decode(list(out.prompt_token_ids[-_PROMPT_TAIL:]), skip_special_tokens=False)
        opened = opens_thinking(tail, pairs)

        def decode(ids):
            return tokenizer.decode(list(ids), skip_special_tokens=True)

        if self._parser is None:
            return with_split(gen, thinking_tokens(split_text(reply.text, opened), reply.text, reply.token_ids, decode))
        return with_split(gen, split_ids(self._parser, reply.token_ids, decode, opened))

    def _queue(self, request: Request) -> tuple[str, Generation | None]:
        """Add one request to the engine: its id, and its refusal if vLLM refused it. Each request is
        added alone so that one refusal costs only itself."""
        from vllm.inputs import TokensPrompt

        if budget.budgeted(request) and not request.sampling.thinking_budget:
            return self._unthought(request)
        params = sampling_params(request, self._markers.stops if budget.budgeted(request) else None)
        try:
            if request.prompt_ids is not None:
                ids = self._llm.enqueue(
                    [TokensPrompt(prompt_token_ids=list(request.prompt_ids))], [params], use_tqdm=False
                )
            else:
                messages = format_messages(request.messages, self._system_role)
                # with the run's date for templates that write today's (engines/chat/dates.py)
                kwargs = {**(self._template_kwargs or {}), "strftime_now": strftime_now}
                ids = self._llm.enqueue_chat([messages], [params], use_tqdm=False, chat_template_kwargs=kwargs)
        except self._fatal:
            raise
        except Exception as err:  # raised while adding this one request: vLLM's validation of it
            self._next_refusal += 1
            prompt = len(request.prompt_ids) if request.prompt_ids is not None else 0
            return f"refused-{self._next_refusal}", rejected(f"{type(err).__name__}: {err}", prompt)
        # vLLM makes each id unique inside the engine ("<id>-<8 random characters>") and reports
        # outputs under the id it was given
        request_id = ids[0].rsplit("-", 1)[0]
        if budget.budgeted(request):
            self._chains.thinking[request_id] = request
        return request_id, None

    def _unthought(self, request: Request) -> tuple[str, Generation | None]:
        """A budget of 0: the answer request at once, after the family's empty thinking (its end
        marker where the prompt opened the thinking)."""
        ids = list(
            request.prompt_ids if request.prompt_ids is not None else self.chat_tokenizer.encode_chat(request.messages)
        )
        tokenizer = self.chat_tokenizer.tokenizer
        opened = opens_thinking(tokenizer.decode(ids[-_PROMPT_TAIL:], skip_special_tokens=False))
        ids += tokenizer.encode(self._markers.forced if opened else self._markers.skip, add_special_tokens=False)
        answer_id, refusal = self._queue(budget.answer_request(request, ids))
        if refusal is None:
            self._chains.answering(answer_id, answer_id, Generation("", len(ids), 0))
        return answer_id, refusal

    def spec_decode(self) -> SpecCounts | None:
        """Its spec-decode counters since it loaded (engines/spec_decode.py)."""
        return None if self._drafts is None else self._drafts.counts

    def reset_prefix_cache(self) -> None:
        """Forget cached prompt prefixes (benchmarks start each phase cold)."""
        with self._lock:
            self._llm.reset_prefix_cache()

    def close(self) -> None:
        """Stops vLLM's engine processes and frees their memory now, not at interpreter exit."""
        self._llm = None
        gc.collect()  # the LLM sits in reference cycles; its finalizers stop the processes
