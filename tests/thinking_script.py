"""A scripted thinking model for the thinking budget's tests (tests/test_answer_budget.py): a tiny
vocabulary, a model that writes `<think>`, a number of thinking words, `</think>` and then answer words
without end, and the two ways personalens reaches a model, each honouring what a request asks (its
max_tokens, its stop strings and whether they stay in the output, its prompt as token ids):
- `ScriptedLLM`, vLLM's `LLM` as the in-process engine (engines/vllm/local.py) drives it;
- `ScriptedServer`, an OpenAI-compatible server as a lab runs it, with or without a reasoning parser:
  streamed /v1/chat/completions (vLLM's `return_token_ids`), /v1/completions of token ids, /tokenize."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

THINK, END, HMM, YES = 0, 1, 2, 3
WORDS = {THINK: "<think>", END: "</think>", HMM: " hmm", YES: " yes"}
_CHAR = 100  # any other character c is the token 100 + ord(c)


class Tokens:
    """The vocabulary as a tokenizer: its words, then one token per character."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            word = next((t for t, w in WORDS.items() if text.startswith(w, i)), None)
            ids.append(_CHAR + ord(text[i]) if word is None else word)
            i += 1 if word is None else len(WORDS[word])
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(WORDS[t] if t in WORDS else chr(t - _CHAR) for t in ids)

    def render(self, messages) -> list[int]:
        """A chat prompt: each message behind its role's tag, then the assistant's."""
        return self.encode("".join(f"[{m['role']}]{m['content']}" for m in messages) + "[assistant]")


@dataclass
class Thinker:
    """Writes `<think>`, `think` words of thought (None: without end), `</think>`, then answer words
    without end; with `thinks=False`, answer words from the first token. A prompt that holds `</think>`
    (an answer request) is answered at once."""

    think: int | None
    thinks: bool = True
    prompts: list[list[int]] = field(default_factory=list)

    def reply(self, prompt: list[int], max_tokens: int, stops=(), keep_stop: bool = False) -> tuple[list[int], str]:
        self.prompts.append(list(prompt))
        tokens = Tokens()
        out: list[int] = []
        for position in range(max_tokens):
            out.append(self._token(END in prompt, position))
            text = tokens.decode(out)
            if any(text.endswith(stop) for stop in stops):
                assert keep_stop, "a thinking request keeps its end marker"
                return out, "stop"
        return out, "length"

    def _token(self, answering: bool, position: int) -> int:
        if answering or not self.thinks:
            return YES
        if position == 0:
            return THINK
        if self.think is None or position <= self.think:
            return HMM
        return END if position == self.think + 1 else YES


class ScriptedLLM:
    """vLLM's `LLM` and its engine as the in-process engine uses them, over a `Thinker`: every queued
    request finishes at the next step. Keeps the SamplingParams of each request."""

    def __init__(self, thinker: Thinker):
        self.thinker, self.llm_engine, self.params = thinker, self, []
        self._queue: list[tuple[str, list[int], object]] = []

    def enqueue(self, prompts, params, use_tqdm=False):
        return [self._add(list(prompts[0]["prompt_token_ids"]), params[0])]

    def enqueue_chat(self, conversations, params, use_tqdm=False, chat_template_kwargs=None):
        return [self._add(Tokens().render(conversations[0]), params[0])]

    def _add(self, ids, params) -> str:
        self.params.append(params)
        request_id = str(len(self.params))
        self._queue.append((request_id, ids, params))
        return f"{request_id}-abcdefgh"

    def step(self):
        done, self._queue = self._queue, []
        outs = []
        for request_id, prompt, p in done:
            ids, finish = self.thinker.reply(prompt, p.max_tokens, p.stop or (), p.include_stop_str_in_output)
            reply = SimpleNamespace(text=Tokens().decode(ids), token_ids=ids, finish_reason=finish, stop_reason=None)
            outs.append(
                SimpleNamespace(
                    request_id=request_id, finished=True, prompt_token_ids=prompt, num_cached_tokens=0, outputs=[reply]
                )
            )
        return outs

    def has_unfinished_requests(self) -> bool:
        return bool(self._queue)

    def abort_request(self, ids, internal=False) -> None:
        self._queue = [q for q in self._queue if q[0] not in ids]


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/v1/models":
            return self._json({"data": [{"id": "m", "max_model_len": None}]})
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server, tokens = self.server, Tokens()
        server.bodies.append((self.path, body))
        if self.path == "/tokenize":
            ids = tokens.render(body["messages"]) if "messages" in body else tokens.encode(body["prompt"])
            return self._json({"tokens": ids})
        prompt = body["prompt"] if self.path == "/v1/completions" else tokens.render(body["messages"])
        stops = body.get("stop") or ()
        ids, finish = server.thinker.reply(prompt, body["max_tokens"], stops, body.get("include_stop_str_in_output"))
        text = tokens.decode(ids)
        if self.path == "/v1/completions":
            choice = {"index": 0, "text": text, "token_ids": ids, "prompt_token_ids": prompt}
        elif server.parser and WORDS[THINK] in text:  # a reasoning parser: the thinking in its own field
            head, _, answer = text.partition(WORDS[END])
            delta = {"reasoning": head.replace(WORDS[THINK], ""), "content": answer}
            choice = {"index": 0, "delta": delta, "token_ids": ids}
        else:
            choice = {"index": 0, "delta": {"content": text}, "token_ids": ids}
        first = {"choices": [choice], **({"prompt_token_ids": prompt} if "messages" in body else {})}
        if not body.get("return_token_ids"):
            for holder in (choice, first):
                holder.pop("token_ids", None)
                holder.pop("prompt_token_ids", None)
        last = {"choices": [{"index": 0, "delta": {}, "text": "", "finish_reason": finish}]}
        usage = {"choices": [], "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids)}}
        events = "".join(f"data: {json.dumps(e)}\n\n" for e in (first, last, usage)) + "data: [DONE]\n\n"
        self._send(events.encode(), "text/event-stream")

    def _json(self, value) -> None:
        self._send(json.dumps(value).encode(), "application/json")

    def _send(self, payload: bytes, kind: str) -> None:
        self.send_response(200)
        for header, value in (("Content-Type", kind), ("Content-Length", str(len(payload)))):
            self.send_header(header, value)
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


class ScriptedServer:
    """An OpenAI-compatible server over a `Thinker` that personalens did not start, with or without a
    reasoning `parser`; keeps every (route, body) it was sent."""

    def __init__(self, thinker: Thinker, parser: bool):
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._http.thinker, self._http.parser, self._http.bodies = thinker, parser, []
        self.url = f"http://127.0.0.1:{self._http.server_port}/v1"
        threading.Thread(target=self._http.serve_forever, daemon=True).start()

    @property
    def bodies(self) -> list[tuple[str, dict]]:
        return self._http.bodies

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
