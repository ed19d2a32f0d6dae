"""Models named by Hugging Face hub id, found in a real cache layout built in a temporary folder (the
embedded model's files as blobs, snapshots of symbolic links, refs): resolved at main or a pinned
revision, refused with the `hf download` command when missing or partial, and the same snapshot read
by `plan` (placement and token counts) and by a real `generate` on vLLM with HF_HUB_OFFLINE=1, whose
saved config records the id and the commit."""

from __future__ import annotations

import hashlib
import json
import os
import re

import pytest
from cli_helpers import read_rows, run_cli
from engine_fixtures import TEST_KV_CACHE_BYTES, TEST_MAX_MODEL_LEN
from hub_cache import add_snapshot
from omegaconf import OmegaConf

from personalens.config.core import model_identity
from personalens.engines.models.config import ModelConfig, ModelConfigError
from personalens.engines.models.embedded import EmbeddedModelError, embedded_model_dir
from personalens.errors import PersonalensError

REPO_ID = "personalens-test/SmolLM2-135M-Instruct"
MAIN = hashlib.sha1(b"main").hexdigest()
OLDER = hashlib.sha1(b"v1").hexdigest()


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory):
    """$HF_HOME whose hub cache holds REPO_ID at two commits: MAIN (refs/main) and OLDER (refs/v1)."""
    try:
        source = embedded_model_dir()
    except EmbeddedModelError as err:
        pytest.skip(str(err))
    home = tmp_path_factory.mktemp("hf")
    add_snapshot(home / "hub", REPO_ID, source, OLDER, refs=("v1",))
    add_snapshot(home / "hub", REPO_ID, source, MAIN)
    return home


@pytest.fixture
def cache(hf_home, monkeypatch):
    """This process's huggingface_hub reading the test cache (its constants are read at import)."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    return hf_home / "hub"


def _snapshot(cache, commit, repo_id=REPO_ID):
    return cache / f"models--{repo_id.replace('/', '--')}" / "snapshots" / commit


def test_a_hub_id_is_read_from_its_cached_snapshot_at_main_or_a_pinned_revision(cache):
    config = ModelConfig.from_mapping({"name": "smol", "path": REPO_ID, "tokenizer": REPO_ID}, where="model@assistant")
    assert config.path == config.tokenizer == str(_snapshot(cache, MAIN))
    (key, found), _ = config.snapshots
    assert (key, found.repo_id, found.revision, found.commit) == ("path", REPO_ID, "main", MAIN)
    assert config.source("tokenizer") == f"{REPO_ID} at {MAIN[:12]}"
    # a tag and a commit pin the older snapshot; the revision is part of the model's identity, `download` not
    for revision in ("v1", OLDER):
        pinned = ModelConfig.from_mapping({"name": "smol", "path": REPO_ID, "revision": revision})
        assert pinned.path == str(_snapshot(cache, OLDER)) and pinned.snapshots[0][1].commit == OLDER
    identity = model_identity(OmegaConf.create({"name": "smol", "path": REPO_ID, "revision": None, "download": True}))
    assert identity == {"name": "smol", "path": REPO_ID}  # runs started before the two keys existed still resume
    # equal configs (the same id for two roles) stay equal, so the roles share one engine
    assert ModelConfig.from_mapping({"name": "smol", "path": REPO_ID}) == ModelConfig.from_mapping(
        {"name": "smol", "path": REPO_ID}
    )


def test_a_missing_model_or_revision_is_refused_naming_the_cache_and_the_command(cache):
    with pytest.raises(PersonalensError) as missing:
        ModelConfig.from_mapping({"name": "x", "path": "meta-llama/Llama-3.1-8B-Instruct"}, where="model@judge")
    text = str(missing.value)
    assert text.startswith("model@judge.path: meta-llama/Llama-3.1-8B-Instruct (revision main)")
    assert f"in the Hugging Face cache {cache} " in text
    assert f"`hf download meta-llama/Llama-3.1-8B-Instruct --cache-dir {cache}`" in text
    assert "judge.download=true" in text
    with pytest.raises(PersonalensError, match=rf"`hf download {REPO_ID} --revision v9 --cache-dir {cache}`"):
        ModelConfig.from_mapping({"name": "x", "path": REPO_ID, "revision": "v9"})
    with pytest.raises(ModelConfigError, match=r"tokenizer: a/b/c is not a directory, nor a Hugging Face hub id"):
        ModelConfig.from_mapping({"name": "x", "tokenizer": "a/b/c"}, where="model@judge")


def test_a_partial_snapshot_is_refused_with_the_command_that_completes_it(cache, tmp_path):
    tokenizer_only = tmp_path / "files"
    tokenizer_only.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tokenizer_only / name).write_bytes((embedded_model_dir() / name).read_bytes())
    add_snapshot(cache, "personalens-test/partial", tokenizer_only, MAIN)
    with pytest.raises(
        ModelConfigError, match=r"has no config\.json or weights .*`hf download personalens-test/partial"
    ):
        ModelConfig.from_mapping({"name": "x", "path": "personalens-test/partial"})
    # as a tokenizer it is complete: an endpoint's tokenizer is read from it
    served = ModelConfig.from_mapping(
        {
            "name": "x",
            "engine": "server",
            "tokenizer": "personalens-test/partial",
            "server": {"base_url": "http://h/v1"},
        }
    )
    assert served.tokenizer == str(_snapshot(cache, MAIN, "personalens-test/partial"))


def _hub_env(hf_home) -> dict:
    return {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}


def test_plan_places_and_counts_a_hub_model_from_its_snapshot(hf_home, tmp_path):
    out = tmp_path / "plan.json"
    models = [f"{role}.path={REPO_ID}" for role in ("user_agent", "assistant", "judge")]
    args = ["plan", *models, "protocol=quick", "plan.gpus=1", "plan.gpu_memory_gib=80", f"plan.out={out}"]
    proc = run_cli(*args, timeout=300, env=_hub_env(hf_home))
    plan = json.loads(out.read_text())
    [placed] = plan["placement"]["jobs"]["generate"]["models"]
    snapshot = _snapshot(hf_home / "hub", MAIN)
    assert placed["weights_per_gpu"] == (snapshot / "model.safetensors").stat().st_size  # sized from the snapshot
    assert f"from {REPO_ID} at {MAIN[:12]}: in process on GPU 0" in proc.stdout
    assert set(plan["tokens"]["counted_with"].values()) == {f"{REPO_ID} at {MAIN[:12]}"}
    assert plan["tokens"]["first_prompts"]["max"] > 0
    # a model not in the cache: refused before anything is written, the fix named
    missing = run_cli(
        *args[:1], "assistant.path=org/absent", *args[4:], timeout=300, env=_hub_env(hf_home), check=False
    )
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert re.search(
        r"assistant\.path: org/absent \(revision main\).*`hf download org/absent --cache-dir ", missing.stderr
    )


@pytest.mark.vllm
def test_generate_runs_a_hub_model_offline_and_records_its_commit(hf_home, tmp_path):
    out = tmp_path / "run"
    models = []
    for role in ("user_agent", "assistant"):
        models += [f"{role}.path={REPO_ID}", f"{role}.kv_cache_memory_bytes={TEST_KV_CACHE_BYTES}"]
        models += [f"{role}.max_model_len={TEST_MAX_MODEL_LEN}", f"{role}.max_num_seqs=8"]
    args = ["data.users=0", "data.kinds=SD", "protocol=quick", "protocol.max_rounds_sd=1"]
    args += ["protocol.user_agent.max_tokens=8", "protocol.assistant.max_tokens=8", "progress=false"]
    proc = run_cli("generate", *models, *args, f"run.out_dir={out}", timeout=1800, env=_hub_env(hf_home))
    snapshot = _snapshot(hf_home / "hub", MAIN)
    resolved = OmegaConf.load(out / "generate.yaml").resolved
    for role in ("user_agent", "assistant"):
        found = resolved[role].hub.path
        assert (found.id, found.revision, found.commit, found.directory) == (REPO_ID, "main", MAIN, str(snapshot))
    assert OmegaConf.load(out / "generate.yaml").config.assistant.path == REPO_ID  # the fingerprint keeps the id
    assert f"from {REPO_ID} at {MAIN[:12]}" in proc.stderr  # the layout line names what it loads
    # vLLM was given the snapshot folder, and read nothing from the hub (HF_HUB_OFFLINE=1 would have failed it)
    log = (out / "logs" / "generate.log").read_text()
    assert str(snapshot) in log
    dialogues = read_rows(out / "dialogues")
    assert dialogues and all(t["completion_tokens"] > 0 for d in dialogues for t in d["turns"])
