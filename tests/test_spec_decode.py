"""The spec-decode records `generate` and `judge` write (engines/spec_decode.py, store/summaries.py), pure:
a server's counters read from its /metrics before and after an invocation, the difference recorded per
model (its copies summed), an unreadable server a warning and no record, a record written however the
invocation ends, one record of a judge panel's shared engine; and read back as `plan.calibrate=` reads
them (plan/speculative.py). The in-process engine's own counters, and `plan` on them, run in
tests/test_spec_decode_vllm.py; two managed `vllm serve` copies drafting, in tests/test_managed_vllm.py."""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from engine_fixtures import start_impostor

from personalens.engines.models.config import ModelConfig, ServerConfig
from personalens.engines.replicated import ReplicatedEngine
from personalens.engines.serving.engine import ServerEngine
from personalens.engines.spec_decode import SpecCounts, from_metrics
from personalens.engines.stop import Stopped
from personalens.plan.speculative import read_spec_decode
from personalens.store import read_summaries, spec_decode_recorded

NGRAM = (("method", "ngram"), ("num_speculative_tokens", 2))

# vLLM 0.32's exposition of its spec-decode counters for a server of two engines (data-parallel), as
# prometheus_client writes vllm.v1.spec_decode.metrics.SpecDecodingProm's (`_created` samples and the
# per-position counter beside them), with the counts left to fill in
EXPOSITION = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} 3.0
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {d0}
vllm:spec_decode_num_drafts_total{{engine="1",model_name="m"}} {d1}
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{{engine="0",model_name="m"}} 1.7958843447024193e+09
vllm:spec_decode_num_drafts_created{{engine="1",model_name="m"}} 1.7958843447024305e+09
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {t0}
vllm:spec_decode_num_draft_tokens_total{{engine="1",model_name="m"}} {t1}
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {a0}
vllm:spec_decode_num_accepted_tokens_total{{engine="1",model_name="m"}} {a1}
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="0"}} 900.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="1",model_name="m",position="1"}} 900.0
"""


def exposition(drafts: tuple[int, int], tokens: tuple[int, int], accepted: tuple[int, int]) -> str:
    return EXPOSITION.format(
        **{f"{k}{i}": f"{float(v)}" for k, vs in zip("dta", (drafts, tokens, accepted)) for i, v in enumerate(vs)}
    )


def test_a_servers_metrics_give_its_counters_summed_over_its_engines():
    assert from_metrics(exposition((10, 5), (20, 10), (7, 3))) == SpecCounts(15, 30, 10)
    without = "\n".join(
        line for line in exposition((1, 1), (2, 2), (1, 1)).splitlines() if "accepted_tokens_t" not in line
    )
    assert from_metrics(without) is None  # a counter missing: not a measurement
    assert from_metrics(EXPOSITION.split("# HELP vllm:spec")[0].format()) is None  # no speculative decoding
    assert from_metrics("<html>not found</html>") is None


class _Metrics(BaseHTTPRequestHandler):
    def do_GET(self):
        body = self.server.text.encode() if self.path == "/metrics" else b""
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def servers():
    """Two vLLM-like servers whose /metrics text a test sets (`.text`), and one that refuses /metrics."""
    started = [ThreadingHTTPServer(("127.0.0.1", 0), _Metrics) for _ in range(2)]
    for server in started:
        server.text = exposition((0, 0), (0, 0), (0, 0))
        threading.Thread(target=server.serve_forever, daemon=True).start()
    impostor = start_impostor()
    yield [*started, impostor]
    for server in (*started, impostor):
        server.shutdown()
        server.server_close()


def _engine(name: str, server, speculative=NGRAM) -> ServerEngine:
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    served = ServerConfig(url, model=name)
    return ServerEngine(ModelConfig(name, engine="server", server=served, max_model_len=2048, speculative=speculative))


def test_each_invocation_records_what_its_speculative_models_drafted_on_their_servers(tmp_path, servers, caplog):
    first, second, impostor = servers
    # counts from before the invocation (an external server's earlier work) are left out of its record
    first.text = exposition((100, 0), (300, 0), (50, 0))
    second.text = exposition((40, 0), (80, 0), (20, 0))
    assistant = _engine("assistant-model", first)
    copies = ReplicatedEngine([_engine("judge-model", second), _engine("judge-model", second)])
    plain = _engine("plain-model", first, speculative=())
    unreadable = _engine("elsewhere", impostor)
    with caplog.at_level(logging.WARNING), spec_decode_recorded(tmp_path, "generate", 1, 2) as drafts:
        assert drafts.seen({"user": assistant, "assistant": assistant, "x": plain}) == {
            "user": assistant,
            "assistant": assistant,
            "x": plain,
        }
        drafts.seen({"judge": copies, "other": unreadable})
        drafts.seen({"again": assistant})  # seen before: its start stays the first read
        first.text = exposition((160, 0), (420, 0), (80, 0))
        second.text = exposition((40, 2), (80, 6), (20, 3))
    records = sorted(read_summaries(tmp_path, "spec_decode"), key=lambda r: r["model"])
    # the user agent and the assistant share one engine: one record; each copy of the judge counts
    assert records == [
        {"model": "assistant-model", "command": "generate", "drafts": 60, "draft_tokens": 120, "accepted_tokens": 30},
        {"model": "judge-model", "command": "generate", "drafts": 4, "draft_tokens": 12, "accepted_tokens": 6},
    ]
    assert (tmp_path / "logs" / "summaries" / "spec_decode.shard-001-of-002.jsonl").is_file()
    warned = [r.getMessage() for r in caplog.records if "spec_decode" in r.getMessage()]
    assert warned == [
        "elsewhere: no spec_decode record of this generate: its spec-decode counters could not be read "
        "(a server's /metrics unreachable, or without vllm:spec_decode_num_* counters)"
    ]

    # a stopped invocation records what it did before the stop; the resumed one, what it did after
    with pytest.raises(Stopped), spec_decode_recorded(tmp_path, "judge", 0, 1) as drafts:
        drafts.seen({"judge": assistant})
        first.text = exposition((170, 0), (440, 0), (85, 0))
        raise Stopped("stopped by SIGTERM", 143)
    with spec_decode_recorded(tmp_path, "judge", 0, 1) as drafts:
        drafts.seen({"judge": assistant})
        first.text = exposition((190, 0), (480, 0), (85, 0))
    judged = [r for r in read_summaries(tmp_path, "spec_decode") if r["command"] == "judge"]
    assert [(r["drafts"], r["draft_tokens"], r["accepted_tokens"]) for r in judged] == [(10, 20, 5), (20, 40, 0)]
    # a server that restarted during the invocation counts from 0 again: no record, one warning
    with caplog.at_level(logging.WARNING), spec_decode_recorded(tmp_path, "judge", 0, 1) as drafts:
        drafts.seen({"judge": assistant})
        first.text = exposition((3, 0), (9, 0), (1, 0))
    assert len(read_summaries(tmp_path, "spec_decode")) == 4
    assert caplog.messages[-1] == "assistant-model: no spec_decode record of this judge: its counters went back"

    # what plan.calibrate= reads: per model, every invocation summed
    measured = read_spec_decode(tmp_path)
    assert sorted(measured) == ["assistant-model", "judge-model"]
    spec = measured["assistant-model"]
    assert (spec.drafts, spec.draft_tokens, spec.accepted_tokens) == (90, 180, 35)
    assert spec.tokens_per_step == pytest.approx(1 + 35 / 90)


def test_judge_records_its_models_drafts_once_over_every_judge_of_the_panel_that_shares_it(tmp_path):
    """`judge` with a panel of two judges of one model config (one engine): one record of the
    invocation, the drafts of both judges' requests (a scripted engine that counts one draft a request)."""
    from test_fidelity import config
    from test_judge_panel import WARM, Judge, generated

    from personalens.config.judges import panel
    from personalens.judge import command as judge_command

    class Drafting(Judge):
        speculative = True

        def spec_decode(self):
            return SpecCounts(len(self.requests), 3 * len(self.requests), len(self.requests))

    out, _ = generated(tmp_path)
    cfg = config(f"run.out_dir={out}", "data.kinds=SD", WARM)
    assert len(panel(cfg)) == 2
    judge = Drafting()
    judge.requests += [None] * 5  # drafts before the invocation (a shared engine's earlier work)
    assert judge_command.judge(cfg, lambda: {"judge": judge}) == 0
    [record] = read_summaries(out, "spec_decode")
    asked = len(judge.requests) - 5
    assert asked > 0 and record == {
        "model": "scripted-judge",
        "command": "judge",
        "drafts": asked,
        "draft_tokens": 3 * asked,
        "accepted_tokens": asked,
    }


def test_a_request_vllm_ended_as_an_error_names_the_drafting_cause_only_where_the_engine_drafts():
    """vLLM 0.32 ends a grammar-constrained request whose drafted token the grammar rejects with finish
    reason "error" (seen on an n-gram judge, docs/cluster.md): the refusal says so where the engine
    drafts, and not for an engine without drafts nor for an aborted request."""
    from types import SimpleNamespace

    from personalens.engines.vllm.params import SPECULATIVE_ERROR, generation

    def out(finish: str) -> SimpleNamespace:
        reply = SimpleNamespace(finish_reason=finish, stop_reason=None, text="", token_ids=[])
        return SimpleNamespace(outputs=[reply], prompt_token_ids=[1, 2, 3], num_cached_tokens=0)

    drafted = generation(out("error"), speculative=True)
    assert drafted.error is not None and SPECULATIVE_ERROR in drafted.error and drafted.prompt_tokens == 3
    assert SPECULATIVE_ERROR not in generation(out("error")).error
    assert SPECULATIVE_ERROR not in generation(out("abort"), speculative=True).error
    assert generation(out("stop"), speculative=True).error is None
