"""Fuzz of the config keys a run reads before its models load: each role's sampling (protocol.<role>
and a model's `sampling:` block, thinking_budget among them), `judges` entries, the KV cache options
and the lease. Every combination of overrides must end as `personalens run` would exit 0 or 2: the
run reaches its model load (the config accepted), or it is refused with one line naming the key,
leaving no saved config, date or lease behind. Anything else (a TypeError, a KeyError) would exit 1
with a traceback.

`run` goes through the real command in this process (cli.run on a Hydra-composed config) as far as
the first engine load, which ends it (`Reached`): the config is checked, the layout planned, the
data read and the run's config saved by then; loading a model for each example would take a minute."""

from __future__ import annotations

import shutil

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from test_fidelity import config

from personalens import cli
from personalens.engines.chat.dates import ENV
from personalens.engines.factory import EngineLoader
from personalens.errors import PersonalensError

ROLES = ("user_agent", "assistant", "judge")
PROTOCOL = ("temperature", "top_p", "max_tokens", "thinking_budget")  # in conf/protocol/*.yaml
OPTIONAL = ("top_k", "min_p", "presence_penalty", "repetition_penalty")  # added with `+`
CARD = (*PROTOCOL[:2], "thinking_budget", *OPTIONAL)  # a model config's sampling: block (nulls there)
KV = ("kv_cache_dtype", "kv_offload_gib", "kv_cache_memory_bytes")
LEASE = ("wait_s", "stale_s")
# override values: Hydra's syntax for null, NaN, infinities, numbers, text, lists, mappings
VALUES = [
    "null", "nan", "inf", "-inf", "-1", "0", "0.5", "1", "2.5", "40", "800", "1e12", "-0.0", "abc", "'1'", "true",
    "[]", "{}", "[1,2]", "fp8", "auto",
]  # fmt: skip


# values each key takes (for the embedded model on a CPU): drawn as often as the values above, so that
# many examples reach the model
GOOD = {
    "temperature": ["0", "0.7", "1"], "top_p": ["0.9", "1"], "max_tokens": ["32", "64"], "thinking_budget": ["null"],
    "top_k": ["20", "-1", "null"], "min_p": ["0.05", "null"], "presence_penalty": ["1.5", "null"],
    "repetition_penalty": ["1.05", "null"], "kv_cache_dtype": ["auto"], "kv_offload_gib": ["null"],
    "kv_cache_memory_bytes": ["1073741824"], "wait_s": ["0", "5"], "stale_s": ["60"],
}  # fmt: skip


def _value(draw, key: str) -> str:
    return draw(st.sampled_from(GOOD.get(key, VALUES)) if draw(st.booleans()) else st.sampled_from(VALUES))


class Reached(BaseException):
    """The run reached its first engine load: its config was accepted. A BaseException, so that no
    `except Exception` on the way takes it for a failure."""


def _reached(self):
    raise Reached


def _entry(draw) -> str:
    """A `judges` entry in Hydra's syntax: a name (mostly legal), maybe a model, sampling, set."""
    fields = ["name: " + draw(st.sampled_from(["warm", "cool", "x1", "judge", "''", "'a b'"]))]
    if draw(st.booleans()):
        fields.append("model: " + draw(st.sampled_from(["smollm2", "null", "nope"])))
    if draw(st.booleans()):
        keys = draw(st.lists(st.sampled_from([*PROTOCOL, "bogus"]), min_size=1, max_size=2, unique=True))
        fields.append("sampling: {" + ", ".join(f"{k}: {_value(draw, k)}" for k in keys) + "}")
    if draw(st.booleans()):
        key = draw(st.sampled_from([*KV, "max_model_len", "bogus"]))
        fields.append(f"set: {{{key}: {_value(draw, key)}}}")
    return "{" + ", ".join(fields) + "}"


# the kinds of override drawn, but `judges` and removals: the key's form and the names it takes
FORMS = {
    "protocol": ("protocol.{role}.{key}", PROTOCOL),
    "optional": ("+protocol.{role}.{key}", OPTIONAL),
    "card": ("{role}.sampling.{key}", CARD),
    "kv": ("{role}.{key}", KV),
    "lease": ("lease.{key}", LEASE),
}


@st.composite
def overrides(draw) -> list[str]:
    """One to three overrides of the keys under test."""
    out = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from([*FORMS, "protocol", "judges", "remove"]))
        role = draw(st.sampled_from(ROLES))
        if kind in FORMS:
            form, names = FORMS[kind]
            key = draw(st.sampled_from(names))
            out.append(f"{form.format(role=role, key=key)}={_value(draw, key)}")
            out += [f"{role}.sampling.source=card"] if kind == "card" else []  # a card's values name their source
        elif kind == "judges":
            out.append("judges=[" + ",".join(_entry(draw) for _ in range(draw(st.integers(1, 2)))) + "]")
        else:
            # Hydra deletes only keys whose value is not null (temperature's, top_p's and
            # thinking_budget's are: the CLI refuses their removal, tests/test_positional_args.py)
            out.append(f"~protocol.{role}.max_tokens")
    keys = [o.lstrip("+~").split("=")[0] for o in out]
    if len(set(keys)) < len(keys):  # Hydra refuses one key overridden twice: not what is fuzzed here
        return out[:1]
    return out


def outcome(tmp_path, given: list[str]) -> str:
    """The refusal's line, or "reached"; fails on any other end, on a line that names no key
    overridden, and on anything a refusal left behind."""
    out = tmp_path / "run"
    shutil.rmtree(out, ignore_errors=True)
    cfg = config(f"run.out_dir={out}", *given)
    try:
        cli.run(cfg)
    except Reached:
        return "reached"
    except PersonalensError as err:
        line = str(err)
        assert "\n" not in line, f"{given}: more than one line: {line}"
        named = {o.lstrip("+~").split("=")[0].split(".")[-1] for o in given}  # the keys' last names, or judges
        assert any(name in line for name in named), f"{given}: the line names none of {named}: {line}"
        left = [p.name for p in (out.iterdir() if out.exists() else []) if p.name != "logs"]
        assert not left, f"{given}: refused, yet it left {left}"
        return line
    raise AssertionError(f"{given}: ended without reaching the model and without a refusal")


@pytest.fixture
def reaching(monkeypatch):
    """Engine loads end the command; the run's date leaves no trace in this process's environment."""
    monkeypatch.setattr(EngineLoader, "__call__", _reached)
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr("personalens.config.saved._SET_HERE", {})


EXAMPLES = 25  # about 30 s on a loaded 2-core machine: a config that reaches the model costs ~1 s
SEEN: list[str] = []


# no shrinking: an example is one to three overrides already, and each costs about a second
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
@given(given=overrides())
def test_fuzzed_sampling_judges_kv_and_lease_values_reach_the_model_or_are_refused_in_one_line(
    given, tmp_path, reaching
):
    SEEN.append(outcome(tmp_path, given).split(":")[0])
    if len(SEEN) == EXAMPLES:
        print(f"\n{EXAMPLES} examples: " + ", ".join(f"{k} x{SEEN.count(k)}" for k in sorted(set(SEEN))))


@pytest.mark.parametrize(
    ("given", "line"),
    [
        (["protocol.judge.max_tokens=null"], "protocol.judge.max_tokens: None: the answer's cap"),
        (["~protocol.judge.max_tokens"], "protocol.judge.max_tokens: None: the answer's cap"),
        (["protocol.user_agent.temperature=nan"], "protocol.user_agent.temperature: expected a number >= 0"),
        (["+protocol.assistant.top_k=1.5"], "protocol.assistant.top_k: expected a whole number >= -1 or null"),
        (["lease.wait_s=nan"], "lease.wait_s: expected a number of seconds >= 0, got nan"),
        (["lease.wait_s=-1"], "lease.wait_s: expected a number of seconds >= 0, got -1"),
        (["lease.stale_s=0"], "lease.stale_s: expected a number of seconds > 0, got 0"),
        (["judges=[{name: warm, sampling: {temperature: 3}}]"], "judges entry 'warm': protocol.judge.temperature"),
        # null is the model's own, else the paper's: the judge's 0, so this entry is model@judge again
        (["judges=[{name: warm, sampling: {temperature: null}}]"], "judges: warm is the same judge as judge"),
    ],
)
def test_the_reported_bad_values_are_refused_in_one_line(given, line, tmp_path, reaching):
    assert outcome(tmp_path, given).startswith(line)


@pytest.mark.parametrize(
    "given",
    [
        [],
        # null where a source still fills it: the model config's sampling, else the paper's
        ["protocol.assistant.temperature=null", "assistant.sampling.temperature=0.7", "assistant.sampling.source=card"],
        ["protocol.assistant.top_p=null"],
        ["protocol.assistant.temperature=null"],
        ["+protocol.assistant.top_k=null"],  # optional keys: null leaves vLLM's default
        ["lease.wait_s=0"],
    ],
)
def test_values_that_are_filled_or_optional_reach_the_model(given, tmp_path, reaching):
    assert outcome(tmp_path, given) == "reached"
    assert (tmp_path / "run" / "generate.yaml").is_file() and (tmp_path / "run" / "start_date").is_file()
