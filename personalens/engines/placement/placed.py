"""What a layout decided (layout.py plans it): `Placement`, one engine of one model with where it runs,
what it holds per GPU and the config it is started with, and `Layout`, the placements of one way of
placing a command's models with the ways tried beside it; both say themselves as lines and as
plan.json's dicts."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from personalens.engines.models.config import ModelConfig
from personalens.engines.placement.gpus import GIB, GpuSpec
from personalens.engines.placement.sizing import ModelNeed, Rules

MODES = ("in_process", "managed_server", "server")  # server: an endpoint personalens does not start
OWN, SHARED = "own GPUs", "in process"


@dataclass(frozen=True)
class Placement:
    """One engine of one model: where it runs, what it holds per GPU, and what it is started with."""

    config: ModelConfig  # as configured (roles with equal configs share it)
    roles: tuple[str, ...]
    mode: str  # one of MODES
    run_config: ModelConfig  # the layout's KV cache and memory share applied
    key: str = ""  # the planner's name for the model (its config's name, made distinct)
    gpus: tuple[int, ...] = ()  # indices of the job's visible GPUs; () where nothing was planned
    device_ids: tuple[str, ...] = ()  # a managed server's CUDA_VISIBLE_DEVICES
    weights_per_gpu: int = 0
    activation_per_gpu: int = 0
    kv_per_token_per_gpu: int = 0  # full-attention layers' bytes; windowed layers stop growing at their window
    kv_cache_memory_bytes: int = 0  # per GPU, what vLLM is given
    max_len_seqs: int | None = None  # sequences of max_model_len the KV cache holds at once (vLLM needs one)
    copy: int = 0  # 0: the model's own engine; k: its k-th copy (replicas), a managed server
    copies: tuple[Placement, ...] = ()  # the model's copies, each a managed server of its own

    @property
    def planned(self) -> bool:
        return bool(self.gpus)

    @property
    def kv_tokens(self) -> int:
        """Tokens of every layer its KV cache holds."""
        return self.kv_cache_memory_bytes // self.kv_per_token_per_gpu if self.kv_per_token_per_gpu else 0

    @property
    def host_kv_tokens(self) -> int:
        """Tokens of every layer its host memory for offloaded KV holds (kv_offload_gib covers the
        tensor-parallel group's GPUs together)."""
        offload = self.config.kv_offload_gib
        per_token = self.kv_per_token_per_gpu * max(1, len(self.gpus))
        return int(offload * GIB) // per_token if offload and per_token else 0

    def held_per_gpu(self, rules: Rules) -> int:
        return self.weights_per_gpu + rules.overhead_bytes + self.activation_per_gpu + self.kv_cache_memory_bytes

    @property
    def label(self) -> str:
        """The model, and which copy, in messages (a server's start and exit)."""
        return f"{self.config.name} (copy {self.copy})" if self.copy else self.config.name

    def as_dict(self) -> dict:
        out = {
            "model": self.config.name,
            "roles": list(self.roles),
            "mode": self.mode,
            "kv_cache_memory_bytes": self.run_config.kv_cache_memory_bytes,
            "gpu_memory_utilization": self.run_config.gpu_memory_utilization,
        }
        if self.device_ids:
            out["cuda_visible_devices"] = ",".join(self.device_ids)
        if self.planned:
            out |= {
                "gpus": list(self.gpus),
                "weights_per_gpu": self.weights_per_gpu,
                "activation_per_gpu": self.activation_per_gpu,
                "kv_per_token_per_gpu": self.kv_per_token_per_gpu,
                "max_len_seqs": self.max_len_seqs,
            }
        if self.copy:
            out["copy"] = self.copy
        if self.copies:
            out["copies"] = [c.as_dict() for c in self.copies]
        return out

    def line(self) -> str:
        found = f" from {self.config.source()}" if self.config.snapshots else ""
        head = f"  {self.config.name} ({', '.join(self.roles)}){found}: "
        if self.mode == "server":
            return head + f"server at {self.config.server.base_url}"
        return head + self._where() + self._copies()

    def _where(self) -> str:
        where = "in process" if self.mode == "in_process" else "managed vLLM server"
        kv = self.run_config.kv_cache_memory_bytes
        if not self.planned:
            return where + (f", KV cache {kv / GIB:.2f} GiB" if kv else "")
        held = (
            f"{self.max_len_seqs} sequence(s) of max_model_len {self.run_config.max_model_len or 'unset'}"
            if self.max_len_seqs is not None
            else f"{self.kv_tokens:,} tokens"
        )
        return (
            f"{where} on GPU {','.join(map(str, self.gpus))}: weights {self.weights_per_gpu / GIB:.1f} GiB + "
            f"activations {self.activation_per_gpu / GIB:.1f} GiB + KV {kv / GIB:.1f} GiB per GPU ({held}), memory "
            f"share {self.run_config.gpu_memory_utilization:.3f}"
        )

    def _copies(self) -> str:
        """` + 3 copies in managed vLLM servers on GPU 5,6,7` (each copy's GPUs, `and` between copies
        of several GPUs)."""
        n = len(self.copies)
        if not n:
            return ""
        what = (
            f" + {n} cop{'y' if n == 1 else 'ies'} in {'a managed vLLM server' if n == 1 else 'managed vLLM servers'}"
        )
        placed = [c for c in self.copies if c.planned]
        if not placed:
            return what
        groups = [",".join(map(str, p.gpus)) for p in placed]
        return what + " on GPU " + ("," if len(placed[0].gpus) == 1 else " and ").join(groups)


@dataclass(frozen=True)
class Layout:
    """One way of placing a command's models: the chosen one, with the others tried beside it."""

    name: str  # OWN | SHARED | "not planned"
    placements: tuple[Placement, ...] | None  # per distinct model, in the roles' order; None: does not fit
    why: str  # why it fits, or why not
    gpus: GpuSpec | None = None  # None: not planned (no GPU)
    rules: Rules | None = None
    needs: tuple[ModelNeed, ...] = ()  # what the planner sized, per in-process or managed model
    others: tuple[Layout, ...] = ()  # the layouts tried and not chosen
    copies_why: str = ""  # how the free GPUs were given to copies

    @property
    def fits(self) -> bool:
        return self.placements is not None

    def placement(self, config: ModelConfig) -> Placement:
        return next(p for p in self.placements or () if p.config == config)

    def without_copies(self) -> Layout:
        return dataclasses.replace(
            self, placements=tuple(dataclasses.replace(p, copies=()) for p in self.placements or ()), copies_why=""
        )

    def reason(self) -> str:
        """Which layout was chosen, and why."""
        if self.gpus is not None and not self.needs:
            return "no model runs on this job's GPUs"
        if not self.others:
            return ""
        other = self.others[0]
        if not other.fits:
            return f"{self.why} ({other.name}: {other.why})"
        if self.name == OWN:
            return f"{self.why}: chosen, as it fits (each model gets whole GPUs; {other.why} fits too)"
        return f"{self.why} (one model: the same GPUs either way)"

    def describe(self) -> str:
        if self.gpus is None:
            return (
                "placement not planned (no GPU: vLLM's CPU build, or no GPU visible): in-process engines share "
                "their configured memory, a server only where placement: managed_server"
            )
        return (
            f"placement on {self.gpus.describe()}: each model within its own memory share, "
            f"{self.rules.overhead_bytes / GIB:.1f} GiB overhead per engine and GPU besides activations"
        )

    def lines(self) -> list[str]:
        why = self.reason()
        copies = [f"  copies: {self.copies_why}"] if self.copies_why else []
        return [self.describe() + (f"; {why}" if why else ""), *(p.line() for p in self.placements or ()), *copies]

    def as_dict(self) -> dict:
        return {
            "planned": self.gpus is not None,
            "basis": self.describe(),
            "why": self.reason(),
            "models": [p.as_dict() for p in self.placements or ()],
            **({"copies_why": self.copies_why} if self.copies_why else {}),
        }
