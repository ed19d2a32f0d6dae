"""The one sampling rule (config/sampling.py, docs/models.md#sampling-one-rule) through the commands: a value a
protocol file or a panel entry writes reaches the requests over a model card's; a card judge of a panel entry
is another judge; under fidelity=official card-less models send the released code's sampling, and a card user
agent or judge is said once; `personalens roles` prints each value with its origin, loading nothing."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest
from cli_helpers import REPO
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from test_fidelity import config
from test_judge_panel import Judge, generated

from personalens.config import run as R
from personalens.config.judges import panel
from personalens.config.sampling import CONFIG, MODEL, PAPER
from personalens.errors import PersonalensError
from personalens.judge import command as judge_command
from personalens.paths import PROJECT_ROOT
from personalens.plan.roles import roles

OFFICIAL = PROJECT_ROOT.parent / "shared" / "official-code"
# Qwen3-8B's card values (conf/model/qwen3_8b.yaml) on the embedded model, with a reasoning parser
CARD = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "thinking_budget": 4096}
CARD_JUDGE = (
    *(f"judge.sampling.{k}={v}" for k, v in CARD.items()),
    "judge.sampling.source=card",
    "judge.reasoning_parser=qwen3",
)


def test_a_panel_entrys_and_a_protocol_files_values_reach_the_requests_over_the_card(tmp_path):
    """A protocol file (its judge's top_p 0.9), a card judge (the card's temperature and budget where the file is
    null), and panel entries that write temperature and budget: each judge's requests carry its own values, and
    docs/validation.md's `warm` entry on a card judge is another judge, not refused as the same one."""
    lab = tmp_path / "conf" / "protocol"
    lab.mkdir(parents=True)
    quick = OmegaConf.load(PROJECT_ROOT / "conf" / "protocol" / "quick.yaml")
    quick.judge.top_p = 0.9
    OmegaConf.save(quick, lab / "lab.yaml")
    out, _ = generated(tmp_path)
    cfg = config(
        f"run.out_dir={out}",
        "data.kinds=SD",
        f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
        "protocol=lab",
        *CARD_JUDGE,
        "judges=[{name: warm, sampling: {temperature: 0.7}}, {name: cold, sampling: {temperature: 0.0, thinking_budget: 512}}]",
    )
    keys = {j.name: judge_command.identity(j.cfg)[0] for j in panel(cfg)}
    assert len(set(keys.values())) == 3, keys
    judge = Judge()
    assert judge_command.judge(cfg, lambda: {"judge": judge}) == 0
    sent = {
        (r.sampling.temperature, r.sampling.top_p, r.sampling.top_k, r.sampling.thinking_budget) for r in judge.requests
    }
    assert sent == {(0.6, 0.9, 20, 4096), (0.7, 0.9, 20, 4096), (0.0, 0.9, 20, 512)}
    saved = OmegaConf.load(out / "judge-cold.yaml").resolved.sampling.judge
    assert (saved.origins.temperature, saved.origins.thinking_budget, saved.origins.top_p) == (CONFIG, CONFIG, CONFIG)
    assert OmegaConf.load(out / "judge.yaml").resolved.sampling.judge.origins.temperature == MODEL


def test_a_null_protocol_key_takes_the_card_else_the_paper_and_a_null_cap_is_refused():
    cfg = config("model@assistant=qwen3_8b", "protocol.assistant.top_p=0.5")
    _, assistant = R.sampling(cfg, "assistant")
    assert (assistant.section["temperature"], assistant.origins["temperature"]) == (0.6, MODEL)
    assert (assistant.section["top_p"], assistant.origins["top_p"]) == (0.5, CONFIG)
    _, user = R.sampling(cfg, "user_agent")
    assert (user.section["temperature"], user.origins["temperature"]) == (0.5, PAPER)
    with pytest.raises(PersonalensError, match=r"^protocol.judge.max_tokens: None: the answer's cap is the protocol's"):
        R.sampling(config("protocol.judge.max_tokens=null"), "judge")


def composed(*overrides: str):
    """The config as the command line composes it (test_fidelity's `config` adds protocol=quick)."""
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def _release_calls() -> dict[str, list[dict]]:
    """Per role, the sampling each of the release's model calls sends: the keywords of its `*LLM(...)` calls
    (user_llm, assistant_llm in the dialogue scripts, llm in the judge's) over its class's defaults."""
    calls: dict[str, list[dict]] = {"user_agent": [], "assistant": [], "judge": []}
    roles = {"user_llm": "user_agent", "assistant_llm": "assistant", "llm": "judge"}
    for name in ("generate_dialogue.py", "generate_dialogue_md.py", "evaluate_dialogue.py"):
        tree = ast.parse((OFFICIAL / "src" / name).read_text())
        defaults = {}
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            init = next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
            named = [a.arg for a in init.args.args][-len(init.args.defaults) :]
            defaults[cls.name] = {k: ast.literal_eval(v) for k, v in zip(named, init.args.defaults)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                func, target = node.value.func, node.targets[0]
                if isinstance(func, ast.Name) and func.id.endswith("LLM") and getattr(target, "id", None) in roles:
                    sent = {k: v for k, v in defaults[func.id].items() if k in ("temperature", "max_tokens", "top_p")}
                    sent |= {k.arg: ast.literal_eval(k.value) for k in node.value.keywords if k.arg in sent}
                    calls[roles[target.id]].append(sent)
    return calls


@pytest.mark.skipif(not OFFICIAL.is_dir(), reason=f"the released code is not at {OFFICIAL}")
def test_under_official_card_less_models_send_exactly_the_released_codes_sampling():
    """The release's user agent and judge are Claude (top_p not sent: no nucleus cut, 1.0), its assistants Llama
    (top_p 0.9) or Mistral (1.0) at temperature 0, where vLLM decodes greedily whatever top_p says."""
    from engine_fixtures import chat

    from personalens.engines.vllm.local import sampling_params

    release = _release_calls()
    assert [len(release[r]) for r in ("user_agent", "assistant", "judge")] == [2, 6, 1]
    cfg = config(
        "fidelity=official",
        "protocol=paper",
        "model@assistant=llama31_8b",
        "model@user_agent=llama31_70b",
        "model@judge=gemma3_27b",
    )
    for role, calls in release.items():
        request, chosen = R.sampling(cfg, role)
        assert chosen.origins == {"temperature": PAPER, "top_p": PAPER}, role
        for sent in calls:
            assert (request.temperature, request.max_tokens) == (sent["temperature"], sent["max_tokens"]), role
            ours = sampling_params(
                chat("Hi", max_tokens=request.max_tokens, temperature=request.temperature, top_p=request.top_p)
            )
            theirs = sampling_params(
                chat("Hi", max_tokens=sent["max_tokens"], temperature=sent["temperature"], top_p=sent.get("top_p", 1.0))
            )
            assert (ours.temperature, ours.top_p, ours.top_k, ours.max_tokens) == (
                theirs.temperature,
                theirs.top_p,
                theirs.top_k,
                theirs.max_tokens,
            ), (role, sent)


def test_roles_prints_each_value_with_its_origin_loading_nothing_and_warns_once_under_official(capsys):
    """A card model (Qwen3-8B, not in this machine's cache) as user agent and judge, with a panel entry: each value
    printed with its origin; the official warning once per role, however many judges share the model."""
    args = [
        "roles",
        "model@user_agent=qwen3_8b",
        "model@judge=qwen3_8b",
        "protocol.user_agent.top_p=1.0",
        "judges=[{name: warm, sampling: {temperature: 0.7}}]",
    ]
    code = (
        "import atexit, sys; atexit.register(lambda: print('LOADED', 'vllm' in sys.modules, 'torch' in sys.modules)); "
        f"from personalens import cli; sys.exit(cli.main({args!r}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "LOADED False False" in proc.stdout, proc.stdout + proc.stderr
    out = proc.stdout
    assert "user_agent: Qwen3-8B (reasoning parser qwen3)" in out
    assert "temperature 0.6 (model card), top_p 1.0 (config)" in out
    assert "  judge warm: Qwen3-8B" in out and "temperature 0.7 (config)" in out
    assert "a reply of at most 8,096 tokens (thinking budget 4,096, then the answer in a request of its own)" in out
    assert "assistant: SmolLM2-135M-Instruct\n    temperature 0.0 (paper), top_p 1.0 (paper)" in out
    warned = [line for line in proc.stderr.splitlines() if "not the released code's" in line]
    assert [line.split(":")[0] for line in warned] == ["user_agent", "judge"], proc.stderr
    assert roles(composed("fidelity=paper", "model@judge=qwen3_8b")) == 0
    assert "not the released code's" not in capsys.readouterr().err


def test_plan_opens_with_the_roles_and_keeps_them_in_plan_json(tmp_path, capsys):
    import json

    from personalens.plan.command import plan

    assert plan(composed("protocol=quick", f"plan.out={tmp_path / 'plan.json'}")) == 0
    assert capsys.readouterr().out.startswith("roles under fidelity=official:")
    roles = json.loads((tmp_path / "plan.json").read_text())["roles"]["roles"]
    assert roles["user_agent"]["sampling"]["temperature"] == {"value": 0.5, "from": PAPER}
    assert roles["judge"]["answer_max_tokens"] == 192


def test_the_printout_in_docs_models_md_is_what_roles_prints(capsys):
    assert roles(composed("model@assistant=qwen3_8b")) == 0
    printed = capsys.readouterr().out.strip()
    assert (
        printed.startswith("roles under fidelity=official")
        and printed in (PROJECT_ROOT / "docs" / "models.md").read_text()
    )
