"""What a command reads from the Hydra config before it works: the scenarios of its shard, the
prompt setting, the template set, the assistant's prompt family, the models and their engines.
Heavy imports (vLLM, torch) happen only when engines are built."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig

from personalens import console
from personalens.config.core import fingerprint, reproducible
from personalens.config.fidelity import Fidelity
from personalens.engines.stop import Stop
from personalens.errors import PersonalensError

if TYPE_CHECKING:
    from personalens.data import Scenario
    from personalens.engines.models.config import ModelConfig


def fidelity(cfg: DictConfig) -> Fidelity:
    return Fidelity.from_mapping(cfg.fidelity)


def selection(cfg: DictConfig) -> list:
    """Every scenario of the selected users and kinds."""
    from personalens.data import load_scenarios

    return load_scenarios(Path(cfg.data.root), cfg.data.users, cfg.data.kinds, strict=bool(cfg.data.strict))


def scenarios(cfg: DictConfig) -> list:
    """The scenarios of this shard."""
    from personalens.data import shard

    return shard(selection(cfg), int(cfg.shard.index), int(cfg.shard.count))


def setting(cfg: DictConfig):
    from personalens.prompts.setting import PromptSetting

    try:
        return PromptSetting(
            mode=cfg.prompt.mode,
            demographics=bool(cfg.prompt.demographics),
            interactions=bool(cfg.prompt.interactions),
            situation=bool(cfg.prompt.situation),
        )
    except ValueError as err:
        raise PersonalensError(f"prompt: {err}") from None


def templates(cfg: DictConfig, option: Fidelity):
    """The fidelity option's template set, or the folder prompt.dir names, with the option's rules;
    and the fingerprint of their text."""
    from personalens.prompts.sections import STYLES
    from personalens.prompts.templates import load_templates

    if option.style not in STYLES:
        raise PersonalensError(f"fidelity.prompts.style: {option.style!r} is not one of {', '.join(STYLES)}")
    loaded = load_templates(cfg.prompt.dir or option.prompts_dir, style=option.style, verbatim=option.verbatim)
    return loaded, fingerprint(dict(loaded.sources))


def prompt_family(cfg: DictConfig) -> str:
    from personalens.prompts.render import FAMILIES

    family = str(cfg.assistant.get("prompt_family", "default"))
    if family not in FAMILIES:
        raise PersonalensError(f"assistant.prompt_family: {family!r} is not one of {', '.join(FAMILIES)}")
    return family


def history_reasoning(cfg: DictConfig, role: str) -> str:
    """A role's `history_reasoning` (engines/models/config.py); last and all are the assistant's alone:
    the user agent's and the judge's prompts carry the conversation as text in one user message, where
    no earlier thinking of theirs can come back."""
    keep = str(cfg[role].get("history_reasoning", "family"))
    if role != "assistant" and keep in ("last", "all"):
        raise PersonalensError(
            f"{role}.history_reasoning={keep}: only the assistant sees its own earlier replies as chat turns; the "
            f"{role.replace('_', ' ')}'s prompt holds the conversation as text: use family or none"
        )
    return keep


def sampling(cfg: DictConfig, role: str):
    """A role's sampling (config/sampling.py: the protocol's, its model card's over it, an explicit override
    over both) and the request made from it; a thinking_budget is refused where the role's model has no
    reasoning_parser (which names the family's end-of-thinking marker, where a budget's thinking request
    stops: engines/chat/budget.py). What the choice calls for (greedy decoding against the card, no thinking budget) is said once on
    stderr."""
    from personalens.config.sampling import notes, role_sampling
    from personalens.engines.base import sampling_from

    chosen = role_sampling(cfg, role)
    parser = cfg[role].get("reasoning_parser")
    try:
        # max_tokens the answer's, thinking_budget the thinking's: engines/chat/budget.py holds each
        request = sampling_from(chosen.section)
    except PersonalensError as err:
        raise PersonalensError(f"protocol.{role}.{err}") from None
    budget = chosen.section.get("thinking_budget")
    if budget is not None and not parser:
        raise PersonalensError(
            f"protocol.{role}.thinking_budget={budget}: model {cfg[role].name} has no reasoning_parser, "
            "which a thinking budget needs to know where its thinking ends; set one or leave it null"
        )
    for line in notes(role, str(cfg[role].name), chosen, parser):
        print(line, file=console.err())
    return request, chosen


def chat_template(cfg: DictConfig, role: str) -> tuple[str | None, dict]:
    """A role's chat template read from its tokenizer's files, before any model loads, with what it is
    rendered with (the special tokens and the model's chat_template_kwargs); None where the files are
    not here (an engine: server endpoint whose config names no tokenizer)."""
    from personalens.engines.chat.template_check import template_variables, tokenizer_folder
    from personalens.engines.chat.template_files import chat_template as read_template
    from personalens.engines.models.config import ModelConfig

    config = ModelConfig.from_mapping(cfg[role], where=f"model@{role}")
    folder = tokenizer_folder(config)
    if folder is None:
        return None, {}
    return read_template(folder), template_variables(folder, config)


def resolved(cfg: DictConfig, roles: tuple[str, ...], engines) -> dict:
    """What each in-process model's `dtype` means on this machine, the hub snapshot (id, revision,
    commit, folder) each hub id was found at, where each model runs (the layout of `engines`, an
    `engines()` loader) and, under `reproducible: true`, what runs batch-invariant, kept in the saved
    config: the fingerprint keeps the configured values, so shards on different CPUs or nodes still
    form one run."""
    from personalens.engines.dtype import local_dtype

    out = {role: {"dtype": vars(local_dtype(str(cfg[role].dtype)))} for role in roles if cfg[role].engine == "vllm"}
    layout = getattr(engines, "layout", None)  # scripted engines (tests, benchmarks) have none
    if layout is None:
        return out
    for role, config in engines.configs.items():
        if config.snapshots:
            out.setdefault(role, {})["hub"] = {key: s.as_dict() for key, s in config.snapshots}
    invariant = getattr(engines, "batch_invariance", None)
    return {**out, "placement": layout.as_dict(), **({"batch_invariance": invariant} if invariant else {})}


def engines(cfg: DictConfig, roles: tuple[str, ...], stop: Stop | None = None, first: Scenario | None = None):
    """The engines of `roles`, loaded together in this process on the first call; their layout is
    decided, logged and, when it cannot fit, refused now, before anything is saved or loaded, and so
    is a chat template that cannot take the run's prompts (`check_templates` on `first`, the shard's
    first scenario, read from the data when not given). Under scheduling=continuous the user agent's
    and the assistant's models must run in this process (their requests go in while the engine
    steps), which is checked then too. `stop` is the command's."""
    from personalens.engines.factory import EngineLoader

    loader = EngineLoader(
        {role: cfg[role] for role in roles},
        Path(cfg.run.out_dir) / "logs",
        shard=f"shard-{int(cfg.shard.index):03d}-of-{int(cfg.shard.count):03d}",
        in_process=in_process_roles(cfg, roles),
        reproducible=reproducible(cfg),
        stop=stop,
        work=work(cfg, roles),
    )
    if first is None:
        first = next(iter(scenarios(cfg)), None)
    if first is not None:
        check_templates(cfg, loader.configs, first)
    return loader


def check_templates(cfg: DictConfig, configs: Mapping[str, ModelConfig], first: Scenario) -> None:
    """Each role's chat template rendered on its prompts of `first` (config/chat_templates.py): a
    template that refuses them raises, in one line; a role whose template cannot be read here is
    named on stderr."""
    from personalens.config.chat_templates import check_templates as check
    from personalens.config.chat_templates import probes

    dimensions = list(cfg.judging.dimensions) if "judge" in configs else []
    loaded, _ = templates(cfg, fidelity(cfg))
    probed = probes(tuple(configs), first, loaded, setting(cfg), prompt_family(cfg), dimensions)
    for role, why in check(configs, probed).items():
        print(f"{role}: chat template not checked before loading: {why}", file=console.err())


def work(cfg: DictConfig, roles: tuple[str, ...]) -> dict[str, float]:
    """Per role the tokens it generates per dialogue at the protocol's cap (the mean of the two kinds'
    round caps, one reply of its thinking budget and max_tokens a round; the judge one reply per
    dimension), by which the GPUs a layout leaves free are shared out among copies of its models."""
    from personalens.config.sampling import role_sampling

    p = cfg.protocol
    rounds = (int(p.max_rounds_sd) + int(p.max_rounds_md)) / 2
    reply = {role: role_sampling(cfg, role).request_max_tokens for role in roles if role in p}
    out = {role: rounds * reply[role] for role in ("user_agent", "assistant") if role in roles}
    if "judge" in roles:
        out["judge"] = len(cfg.judging.dimensions) * reply["judge"]
    return out


def in_process_roles(cfg: DictConfig, roles: tuple[str, ...]) -> frozenset[str]:
    """The roles whose models must run in this process: under scheduling=continuous, the user agent's
    and the assistant's (their requests go to the engine while it steps)."""
    continuous = str(cfg.get("scheduling", "lockstep")) == "continuous"
    return frozenset(r for r in ("user_agent", "assistant") if continuous and r in roles)


def engine(cfg: DictConfig, role: str, stop: Stop | None = None):
    """One model's engine, for commands with a single role (`model@builder`)."""
    from personalens.engines.factory import build_engine
    from personalens.engines.models.config import ModelConfig

    return build_engine(ModelConfig.from_mapping(cfg[role], where=f"model@{role}"), stop)


def shard_lease(cfg: DictConfig, command: str, stop: Stop | None = None):
    """The lease `command` holds on the run's shard while it writes it (store/lease.py; `lease:` in
    conf/config.yaml); losing it stops the command through `stop`."""
    from personalens.store.lease import ShardLease, lease_path

    index, count, out_dir = int(cfg.shard.index), int(cfg.shard.count), Path(cfg.run.out_dir)
    section = cfg.get("lease") or {}

    def lost(line: str) -> None:
        if stop is not None:
            stop.request(PersonalensError(line))

    return ShardLease(
        lease_path(out_dir, command, index, count),
        f"{command} of shard {index} of {count} in {out_dir}",
        wait_s=float(section.get("wait_s", 600)),
        stale_s=float(section.get("stale_s", 180)),
        on_lost=lost,
        check=stop.check if stop is not None else lambda: None,
    )
