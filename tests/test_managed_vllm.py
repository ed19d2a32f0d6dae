"""Managed vLLM servers on this CPU: two distinct models (the embedded model under two names and seeds)
forced to `placement: managed_server`, so two real servers start together, serve a real `personalens
run` (the judge shares the user agent's model, so its server) and end with it; and one server of a
hub-id model (read offline from a test cache) that answers only requests carrying its random key,
started again on another port when another server took its first one before vLLM bound it.
The two-server run is first attempted with one server killed mid-run, which stops the command at once
with one line; the run then finishes the work. Two copies of one model (`replicas: 2`) answer a
`personalens generate` together, each dialogue on the copy its key picks.
Kept small: 4 one-round dialogues of 16-token replies, short judge outputs, a fixed 512 MiB KV cache,
no torch.compile."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import signal
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from cli_helpers import parent_pid, read_rows, run_cli, start_cli
from engine_fixtures import EVERY_SETTING, TEST_KV_CACHE_BYTES, TEST_MAX_MODEL_LEN, chat, start_impostor
from hub_cache import add_snapshot
from omegaconf import OmegaConf

from personalens.engines.base import conversation
from personalens.engines.models.config import ModelConfig
from personalens.engines.models.embedded import embedded_model_dir
from personalens.engines.placement.placed import Placement
from personalens.engines.replicated import copy_of
from personalens.engines.serving import managed
from personalens.engines.serving.engine import ServerEngine
from personalens.engines.serving.managed import serve_args, start_servers
from personalens.engines.serving.processes import MARKER_ENV
from personalens.engines.stop import Stop
from personalens.engines.vllm.args import engine_args
from personalens.store import read_summaries
from personalens.store.schema import KEY_COLUMNS

pytestmark = pytest.mark.vllm

TINY = {
    "kv_cache_memory_bytes": TEST_KV_CACHE_BYTES,
    "max_model_len": 2 * TEST_MAX_MODEL_LEN,  # the judge's official prompts reach past 2,048 tokens
    "max_num_seqs": 32,
    "enforce_eager": "true",
    "cpu_reserved_cores": 0,
    "placement": "managed_server",
}
NGRAM = "{method:ngram,num_speculative_tokens:3,prompt_lookup_max:4}"  # a speculative: block, as an override
MODELS = {"assistant": ("SmolLM2-assistant", 0), "user_agent": ("SmolLM2-user", 1), "judge": ("SmolLM2-user", 1)}


def server_processes(out: Path) -> list[int]:
    """Live processes started as one of this run's servers (the marker is inherited by vLLM's children)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        marked = [v for v in environ if v.startswith(f"{MARKER_ENV}={out}".encode())]
        if marked and state != "Z":
            found.append(int(entry.name))
    return found


def test_two_managed_servers_serve_a_real_run_and_end_with_it(tmp_path):
    out = tmp_path / "run"
    overrides = [f"{role}.{key}={value}" for role in MODELS for key, value in TINY.items()]
    for role, (name, seed) in MODELS.items():
        overrides += [f"{role}.name={name}", f"{role}.seed={seed}"]
    args = ["run", "data.users=0", "data.kinds=SD", "protocol=quick", "protocol.max_rounds_sd=1"]
    args += ["protocol.user_agent.max_tokens=16", "protocol.assistant.max_tokens=16", "protocol.judge.max_tokens=128"]
    args += [*overrides, f"run.out_dir={out}", "progress=false"]

    # a first attempt whose user-agent server is killed once both are up, as the OOM killer would: the
    # command stops at once with one line (the model, the exit status, the log's path and last lines),
    # and takes the other server down with it
    log = tmp_path / "first.log"
    first = start_cli(*args, log=log)
    try:
        deadline = time.monotonic() + 900
        while len(re.findall(r"vLLM server for SmolLM2-\w+ ready", log.read_text(errors="replace"))) < 2:
            assert first.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.2)
        os.kill(_api_server(out, "SmolLM2-user"), signal.SIGKILL)
        killed = time.monotonic()
        first.wait(timeout=120)
        stopped_after = time.monotonic() - killed
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    text = log.read_text(errors="replace")
    assert first.returncode == 2 and stopped_after < 20, text[-4000:]
    assert len(re.findall("exited with", text)) == 1, text[-4000:]
    (line,) = [x for x in text.splitlines() if x.startswith("personalens run: error:")]
    [server_log] = (out / "logs").glob("vllm-server.SmolLM2-user.*.log")
    assert (
        f"the vLLM server of SmolLM2-user exited with status 137 (killed by SIGKILL) while the command was "
        f"using it; log {server_log}, its last lines: " in line
    ), line
    assert server_processes(out) == []

    # the run again: it finishes the work
    proc = run_cli(*args)

    # the layout, logged at start: no GPU here, so only the forced servers
    assert "placement not planned (no GPU" in proc.stderr
    assert (
        len(re.findall(r"SmolLM2-(user|assistant) \((user_agent, judge|assistant)\): managed vLLM server", proc.stderr))
        == 2
    ), proc.stderr
    ready = re.findall(r"vLLM server for (SmolLM2-\w+) ready after (\d+) s", proc.stderr)
    assert sorted(name for name, _ in ready) == ["SmolLM2-assistant", "SmolLM2-user"], proc.stderr
    saved = OmegaConf.load(out / "generate.yaml").resolved.placement
    assert [m.mode for m in saved.models] == ["managed_server", "managed_server"]

    dialogues = read_rows(out / "dialogues")
    assert (
        len({tuple(d[k] for k in KEY_COLUMNS) for d in dialogues}) == 4
    )  # each once, whatever the first attempt wrote
    assert len(dialogues) == 4 and {(d["assistant_model"], d["user_model"]) for d in dialogues} == {
        ("SmolLM2-assistant", "SmolLM2-user")
    }
    assert all(t["prompt_tokens"] > 0 and t["completion_tokens"] > 0 for d in dialogues for t in d["turns"])
    # the judge's requests went to the user agent's server; the report came out at the end
    judgments = read_rows(out / "judgments")
    assert len(judgments) == 4 * 6 and {j["judge_model"] for j in judgments} == {"SmolLM2-user"}
    assert proc.stdout.lstrip().startswith("### Table 3"), proc.stdout
    # served with prompt-token details: later prompts of a user's dialogues come from the prefix cache
    cached = re.search(r"prompts \d+ tokens, (\d+)% from the prefix cache", proc.stderr)
    assert cached and int(cached[1]) > 0, proc.stderr
    logs = sorted(p.name for p in (out / "logs").glob("vllm-server.*.log"))
    assert [name.split(".")[1] for name in logs] == ["SmolLM2-assistant"] * 2 + ["SmolLM2-user"] * 2  # both runs'

    # the command has ended: so have its servers, engine cores included
    assert server_processes(out) == []
    # nothing left to do: no server is started at all
    again = run_cli(*args)
    assert "0 dialogues simulated" in again.stderr and "starting a vLLM server" not in again.stderr


def test_two_copies_of_a_model_answer_a_real_generate_dialogue_by_dialogue(tmp_path):
    """The user agent's and the assistant's model (one config, so one engine) with `replicas: 2` and
    `placement: managed_server`: two servers start together and answer a `personalens generate` of 3
    dialogues. vLLM logs each reply a server sends (VLLM_DEBUG_LOG_API_SERVER_RESPONSE), so each
    server's replies are counted and matched with the dialogues the affinity rule gives it. Both draft
    n-grams (`speculative:`): generate records their spec-decode counters, read from their /metrics."""
    out = tmp_path / "run"
    model = {**TINY, "name": "SmolLM2-copies", "replicas": 2, "speculative": NGRAM}
    args = ["generate", "data.users=1", "data.kinds=SD", "protocol=quick", "protocol.max_rounds_sd=2"]
    args += ["protocol.user_agent.max_tokens=24", "protocol.assistant.max_tokens=24", "progress=false"]
    args += [f"{role}.{k}={v}" for role in ("user_agent", "assistant") for k, v in model.items()]
    proc = run_cli(*args, f"run.out_dir={out}", env={**os.environ, "VLLM_DEBUG_LOG_API_SERVER_RESPONSE": "true"})

    assert (
        "SmolLM2-copies (user_agent, assistant): managed vLLM server, KV cache 0.50 GiB + 1 copy in a managed "
        "vLLM server" in proc.stderr
    ), proc.stderr
    ready = re.findall(r"vLLM server for (SmolLM2-copies(?: \(copy 1\))?) ready after", proc.stderr)
    assert sorted(ready) == ["SmolLM2-copies", "SmolLM2-copies (copy 1)"], proc.stderr
    saved = OmegaConf.load(out / "generate.yaml").resolved.placement.models
    assert [(m.mode, [c["copy"] for c in m.copies]) for m in saved] == [("managed_server", [1])]
    logs = sorted((out / "logs").glob("vllm-server.SmolLM2-copies.*.log"), key=lambda p: ".copy1." in p.name)
    assert [".copy1." in p.name for p in logs] == [False, True]

    dialogues = read_rows(out / "dialogues")
    assert len(dialogues) == 3 and all(d["ended"] in ("max_rounds", "terminated") for d in dialogues)
    copy = [copy_of(conversation(*(d[k] for k in KEY_COLUMNS)), 2) for d in dialogues]
    assert sorted(set(copy)) == [0, 1]  # the rule spreads these three over both copies
    for k, log in enumerate(logs):
        sent = [
            ast.literal_eval(m)
            for m in re.findall(r"streaming_complete: content=(.*), chunks=\d+\}$", log.read_text(), re.MULTILINE)
        ]
        mine = [d for d, c in zip(dialogues, copy) if c == k]
        # one reply per request (each a turn), every one of its dialogues' replies, nothing of the others'
        assert len(sent) == sum(len(d["turns"]) for d in mine) > 0, (log.name, sent)
        replies = [t["text"] for d in mine for t in d["turns"] if t["role"] == "assistant"]
        assert not Counter(replies) - Counter(sent), (log.name, replies, sent)
    # one record of the model's drafts over the invocation, its two servers' counters summed
    [record] = read_summaries(out, "spec_decode")
    assert (record["model"], record["command"]) == ("SmolLM2-copies", "generate")
    assert 0 < record["drafts"] <= record["draft_tokens"] <= 3 * record["drafts"]
    assert record["accepted_tokens"] <= record["draft_tokens"]


def _status(url: str, key: str | None, body: dict | None = None) -> int:
    """The HTTP status of a POST of `body` (a one-token chat completion) to `url`, with `key` or none."""
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    body = body or {"model": "SmolLM2-keyed", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def test_a_managed_server_of_a_hub_model_serves_only_requests_with_its_key(tmp_path, monkeypatch):
    import huggingface_hub.constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = add_snapshot(tmp_path / "hub", "personalens-test/SmolLM2", embedded_model_dir(), commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the server reads nothing from the hub either
    raw = {
        "name": "SmolLM2-keyed",
        "path": "personalens-test/SmolLM2",
        "kv_cache_memory_bytes": TEST_KV_CACHE_BYTES,
        "max_model_len": TEST_MAX_MODEL_LEN,
        "max_num_seqs": 8,
        "enforce_eager": True,
        "cpu_reserved_cores": 0,
        "placement": "managed_server",
    }
    config = ModelConfig.from_mapping(raw, where="model@assistant")
    logs = tmp_path / "logs"
    # the first port chosen is taken by another server (healthy, but not this one) before vLLM binds it
    impostor = start_impostor()
    first = iter([[impostor.server_port]])
    free_ports = managed._free_ports
    monkeypatch.setattr(managed, "_free_ports", lambda n: next(first, None) or free_ports(n))
    stop = Stop()
    try:
        [served] = start_servers([Placement(config, ("assistant",), "managed_server", config)], logs, "", stop)
        key, url = served.server.api_key, served.server.base_url
        # it started again on another port: the first launch lost its port (vLLM says so), and the other
        # server was asked who it is and not taken for this one
        assert not url.startswith(f"http://127.0.0.1:{impostor.server_port}/")
        assert "Address already in use" in next(logs.glob("vllm-server.*.log")).read_text(errors="replace")
        assert "/v1/models" in impostor.asked
        assert key and len(key) >= 32 and key not in repr(served)
        chat_url, root = f"{url}/chat/completions", url.removesuffix("/v1")
        assert _status(chat_url, None) == 401 and _status(chat_url, "not-the-key") == 401
        assert _status(chat_url, key) == 200
        # the routes vLLM's own key check leaves open: the SageMaker route serves the same completions
        assert _status(f"{root}/invocations", None) == 401 and _status(f"{root}/invocations", key) == 200
        assert _status(f"{root}/tokenize", None, {"model": "SmolLM2-keyed", "prompt": "hi"}) == 401
        with urllib.request.urlopen(f"{root}/health", timeout=30) as health:  # what the start-up polls
            assert health.status == 200
        # personalens' own engine for it carries the key
        engine = ServerEngine(served)
        (reply,) = engine.generate([chat("Say hello.", max_tokens=4)])
        assert reply.completion_tokens > 0
        # it measures prompts as the server does (the room check of simulate/lockstep.py), with the
        # config's context or, without one, the one the server reports
        assert len(engine.chat_tokenizer.encode_chat(chat("Say hello.").messages)) == reply.prompt_tokens
        asked = ServerEngine(dataclasses.replace(served, max_model_len=None))
        assert engine.max_model_len == asked.max_model_len == TEST_MAX_MODEL_LEN
        # a prompt that fills the context exactly, or overfills it: refused as context, not as a failure
        # " otter" is two tokens here, and a final "!" one more: every length, one of these hits it
        fillers = [chat(" ".join(["otter"] * n) + tail, max_tokens=4) for n in range(900, 1100) for tail in ("", "!")]
        full = next(f for f in fillers if len(engine.chat_tokenizer.encode_chat(f.messages)) == TEST_MAX_MODEL_LEN)
        over = chat("otter " * (TEST_MAX_MODEL_LEN + 10), max_tokens=4)
        for refused in engine.generate([full, over]):
            assert refused.over_context and refused.text == "", refused.error
        # the key is in no process's command line (readable by every user: ps) and in no log; the server
        # was given the snapshot folder
        processes = server_processes(logs)
        assert processes
        for pid in processes:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            assert key.encode() not in cmdline
        assert any(str(snapshot).encode() in Path(f"/proc/{p}/cmdline").read_bytes() for p in processes)
        [log] = logs.glob("vllm-server.*.log")
        assert key not in log.read_text(errors="replace")
    finally:
        stop.close()
        impostor.shutdown()
        impostor.server_close()
    assert server_processes(logs) == []


def test_vllms_parser_reads_a_managed_servers_flags_as_the_in_process_engines_arguments():
    """serve_args parsed by the API server's own parser give the EngineArgs that `vllm.LLM(**engine_args)`
    gets: every setting an in-process engine is started with reaches a managed server, and nothing else
    but the server's own flags."""
    from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    config = EVERY_SETTING

    def parsed(args: list[str]) -> EngineArgs:
        return AsyncEngineArgs.from_cli_args(make_arg_parser(FlexibleArgumentParser()).parse_args(args))

    served, untouched = parsed(serve_args(config, "/w", 8123, "bfloat16")), parsed(["--model", "/w"])
    kwargs = engine_args(config, "/w", "bfloat16")
    direct, default = EngineArgs(**kwargs), EngineArgs(model="/w")
    for field in dataclasses.fields(EngineArgs):
        name = field.name
        got, want = getattr(served, name), getattr(direct, name)
        if isinstance(want, dict):  # LLM(...) takes a config section as a dict, the parser makes its dataclass
            want = type(got)(**want)
        if getattr(direct, name) != getattr(default, name) or got != getattr(untouched, name):
            assert name in kwargs or name == "served_model_name", name
        if name in kwargs:
            assert got == want, name
    assert served.load_format == "dummy" and served.max_num_batched_tokens == 8192


def _api_server(out: Path, name: str) -> int:
    """The pid of the run's vLLM API server of `name`: a launcher's child (its engine core is the server's)."""
    launchers = [p for p in server_processes(out) if b"personalens.engines.serving.launcher" in _cmdline(p)]
    served = [p for p in server_processes(out) if parent_pid(p) in launchers]
    (server,) = [p for p in served if f"--served-model-name\0{name}\0".encode() in _cmdline(p)]
    return server


def _cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()
