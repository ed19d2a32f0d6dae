"""The roofline model of one engine's GPUs that plan/engine_model.py steps by: a step takes overhead +
max(memory time, compute time) + communication, memory = weights + the running requests' KV read
once, compute = 2 x parameters x tokens in the step + attention over the context, communication (an
engine over several GPUs, tensor parallel) = two all-reduces per layer of the step's hidden states,
each a latency plus its bytes at the GPUs' link bandwidth, not overlapped with the rest of the step.
With the GPUs' published figures (`GPUS`) and the engine of one model's placement on them
(`engine_of`)."""

from __future__ import annotations

from dataclasses import dataclass

from personalens.engines.placement.placed import Placement
from personalens.engines.placement.sizing import ModelNeed
from personalens.plan.speculative import SpecDecode

# assumed: the share of a GPU's peak HBM bandwidth decoding reaches, and of its dense FLOPS prefill-heavy
# steps reach (held, with the rest of the model, against the GPU rows of docs/performance.md by
# tests/test_planner_measured.py and tests/test_planner_levers.py)
BANDWIDTH_EFFICIENCY = 0.75
FLOPS_EFFICIENCY = 0.5  # assumed: see BANDWIDTH_EFFICIENCY
# fitted, not measured: the KV bytes a second that vLLM's native offloading brings back from host memory,
# its stores to host and its scheduling included. It is the rate at which the model's offloading gain
# equals the one run that measured it: one H200, vLLM 0.26.0, a 4 GiB KV cache with 48 GiB of host
# memory at 0.97x the same cache without (bench/results/h200-levers-2026-11-28.log, recorded in
# 2017cc0; fitted in 78a8d7d; docs/performance.md). No other offloading run exists to test it against:
# tests/test_planner_levers.py refits it from that run and says so. About a tenth of the 64 GB/s a
# direction of the H200's PCIe 5.0 x16 link
HOST_BANDWIDTH = 6.6e9
# assumed: the bytes of one value of the hidden states a tensor-parallel engine all-reduces: 16-bit
# activations (bf16 or fp16; fp8 weights keep them at 16 bits)
ALLREDUCE_VALUE_BYTES = 2
# assumed: the all-reduce bus bandwidth of NVLink 4 (H100 and H200 SXM: 900 GB/s a GPU in NVIDIA's
# datasheets, both directions together, 450 GB/s each way): 365-370 GB/s, as NCCL's ring all-reduce
# measured on 8 x H100 SXM for 2 to 8 GPUs (github.com/NVIDIA/nccl/issues/1455, large messages, nccl-tests'
# busbw: algbw x 2(n-1)/n). A ring moves 2(n-1)/n of the bytes through each GPU's link
H100_LINK = 370e9
# assumed: NVLink 3 (A100 SXM: 600 GB/s in NVIDIA's datasheet, 300 GB/s each way) at the share of its
# one-way rate the H100 measurement above reaches (370 of 450), no measurement of its own
A100_LINK = 300e9 * 370 / 450
# assumed: one all-reduce's latency however small, a separate term: about 6 us as nccl-tests measured on
# 2 of 8 x H100 SXM (NCCL 2.20.5, its NVLS tree algorithm, CUDA graphs; github.com/NVIDIA/nccl/issues/1259,
# which reports it growing with the GPUs: a floor for wider groups). vLLM's own all-reduce for small
# messages may be faster
H100_ALLREDUCE_S = 6e-6
# assumed: about 10 us as nccl-tests measured a ring all-reduce of 8-128 bytes on 2 GPUs of a DGX-A100
# (one channel; github.com/NVIDIA/nccl-tests/issues/123, which measured 34 us on 8)
A100_ALLREDUCE_S = 10e-6


@dataclass(frozen=True)
class GpuModel:
    """One engine on its GPUs. The defaults: Llama-3.1-8B-Instruct (its published config: 8.03e9
    parameters, 32 layers, hidden 4096, 8 KV heads of 128) in bf16 on one H100 SXM (datasheet:
    3.35 TB/s HBM3, 989 TFLOPS dense bf16, 80 GB). Efficiencies, overhead and the engine's limits are
    assumptions."""

    params: float = 8.03e9  # assumed: Llama-3.1-8B's published config
    layers: int = 32  # assumed: the same
    hidden: int = 4096  # assumed: the same
    kv_bytes_per_token: int = 2 * 32 * 8 * 128 * 2  # assumed: the same; K and V, 32 layers, 8 heads of 128, 2 bytes
    bandwidth: float = 3.35e12 * BANDWIDTH_EFFICIENCY  # assumed: the H100 SXM datasheet's HBM3
    flops: float = 989e12 * FLOPS_EFFICIENCY  # assumed: the H100 SXM datasheet's dense bf16
    overhead: float = 0.5e-3  # assumed: per engine step (scheduling, launches; CUDA graphs on)
    kv_tokens: int = 400_000  # assumed: 0.9 x 80 GB - 16 GB weights - activations, / 128 KiB per token
    max_num_seqs: int = 256  # assumed: conf/model/llama31_8b.yaml's
    max_batched_tokens: int = 8192  # assumed: vLLM's chunked-prefill token budget per step
    # assumed: bf16; the weights' bytes per parameter (their dtype's, or quantized), read once a step
    bytes_per_param: float = 2
    name: str = ""  # the model it stands for, in Result.busy
    host_tokens: int = 0  # KV tokens its host memory keeps for evicted sequences (kv_offload_gib)
    host_bandwidth: float = HOST_BANDWIDTH  # bytes/s of reloading them, all its GPUs' links together
    # speculative decoding, from a run's measured acceptance only (plan/speculative.py): the tokens a
    # sequence gains per verifying step (1: none), and the draft tokens such a step computes per sequence
    tokens_per_step: float = 1.0
    drafted: float = 0.0
    tp: int = 1  # GPUs of its tensor-parallel group: 1 communicates nothing
    link_bandwidth: float = H100_LINK  # bytes/s of an all-reduce's bus bandwidth (nccl-tests' busbw)
    allreduce_latency: float = H100_ALLREDUCE_S  # seconds of one all-reduce however small

    def allreduce_terms(self) -> tuple[float, float]:
        """A step's tensor-parallel communication as (seconds a step, seconds a token of the step):
        after attention and after the MLP of every layer an all-reduce of the step's hidden states,
        each its latency plus a ring's 2(n-1)/n of the bytes at the bus bandwidth; none on one GPU."""
        if self.tp <= 1:
            return 0.0, 0.0
        moved = self.hidden * ALLREDUCE_VALUE_BYTES * 2 * (self.tp - 1) / self.tp
        return 2 * self.layers * self.allreduce_latency, 2 * self.layers * moved / self.link_bandwidth

    def allreduce_seconds(self, tokens: float) -> float:
        """The communication of a step of `tokens` tokens (`allreduce_terms`)."""
        latency, per_token = self.allreduce_terms()
        return latency + per_token * tokens if tokens else 0.0

    def reload_seconds(self, tokens: int) -> float:
        """Copying `tokens` of offloaded KV back to the GPUs (not overlapped with the step)."""
        return tokens * self.kv_bytes_per_token / self.host_bandwidth if tokens else 0.0

    def step_seconds(self, decodes: int, prefill: int, context: int) -> float:
        """One engine step: `decodes` running requests one token each, `prefill` prompt tokens,
        `context` tokens of KV read by the step's attention. Speculating, each decode computes its
        drafts too, and a step that only decodes is the share of a verifying step that gains one token
        a sequence; a step that also prefills is taken without the gain."""
        memory = (self.bytes_per_param * self.params + context * self.kv_bytes_per_token) / self.bandwidth
        tokens = decodes * (1 + self.drafted) + prefill
        compute = (2 * self.params * tokens + 4 * self.layers * self.hidden * context * min(tokens, 1)) / self.flops
        step = self.overhead + max(memory, compute) + self.allreduce_seconds(tokens)
        return step / self.tokens_per_step if decodes and not prefill else step

    def decode_seconds(self, decodes: int, context: int, steps: int) -> float:
        """`steps` engine steps that only decode `decodes` requests, the KV read growing by `decodes`
        tokens a step from `context`: step_seconds summed in closed form (both of its terms grow
        linearly, so the larger one changes at most once), speculating as step_seconds does."""
        memory = (
            (self.bytes_per_param * self.params + context * self.kv_bytes_per_token) / self.bandwidth,
            decodes * self.kv_bytes_per_token / self.bandwidth,
        )
        compute = (
            (2 * self.params * decodes * (1 + self.drafted) + 4 * self.layers * self.hidden * context) / self.flops,
            4 * self.layers * self.hidden * decodes / self.flops,
        )

        def larger(i: int) -> tuple[float, float]:
            return memory if memory[0] + i * memory[1] >= compute[0] + i * compute[1] else compute

        first, last = larger(0), larger(steps - 1)
        split = steps
        if first is not last:  # the first step where the other term is larger
            lo, hi = 0, steps - 1
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if larger(mid) is first else (lo, mid)
            split = hi

        def total(line: tuple[float, float], lo: int, hi: int) -> float:
            return (hi - lo) * line[0] + line[1] * (lo + hi - 1) * (hi - lo) / 2

        fixed = self.overhead + self.allreduce_seconds(decodes * (1 + self.drafted))
        return (steps * fixed + total(first, 0, split) + total(last, split, steps)) / self.tokens_per_step


@dataclass(frozen=True)
class GpuFigures:
    """A GPU's peak figures, from its maker's datasheet, and the all-reduce figures of a node of them."""

    name: str
    bandwidth: float  # bytes/s of HBM
    flops: float  # dense bf16 FLOP/s
    capability: str  # CUDA compute capability (what an fp8 KV cache needs is checked against it)
    link_bandwidth: float  # an all-reduce's bus bandwidth between the node's GPUs, bytes/s
    allreduce_latency: float  # seconds of one all-reduce however small
    fp8_flops: float | None = None  # dense FP8 FLOP/s; None: no FP8 tensor cores (fp8 weights run weight-only)


# assumed: NVIDIA's datasheets (SXM boards, dense figures: half the "with sparsity" ones): H100 3.35 TB/s,
# 989 TFLOPS bf16, 1,979 TFLOPS FP8; H200 4.8 TB/s and the H100's rates; A100 80GB 2,039 GB/s and 312
# TFLOPS bf16, no FP8; compute capability 9.0 (Hopper) and 8.0 (Ampere); their links' figures as above
GPUS = {
    "h100": GpuFigures("H100 SXM", 3.35e12, 989e12, "9.0", H100_LINK, H100_ALLREDUCE_S, 1979e12),
    "h200": GpuFigures("H200 SXM", 4.8e12, 989e12, "9.0", H100_LINK, H100_ALLREDUCE_S, 1979e12),
    "a100": GpuFigures("A100 SXM 80GB", 2.039e12, 312e12, "8.0", A100_LINK, A100_ALLREDUCE_S),
}


def weight_bytes_per_param(need: ModelNeed) -> float:
    """Bytes a decode step reads per parameter: the dtype's, or a quantized model's stored weights over
    its parameters (fp8: about one)."""
    return need.weights / need.arch.parameters() if need.quantization else float(need.dtype_bytes)


def compute_rate(need: ModelNeed, gpu: GpuFigures) -> float:
    """Peak FLOP/s of one GPU for this model: FP8 where its weights are fp8 and the GPU has FP8 tensor
    cores (W8A8), else 16-bit (weight-only methods dequantize to 16 bits)."""
    fp8 = need.quantization == "fp8" or need.arch.fp8_weights
    return gpu.fp8_flops if fp8 and gpu.fp8_flops else gpu.flops


def engine_of(need: ModelNeed, placed: Placement, gpu: GpuFigures, spec: SpecDecode | None = None) -> GpuModel:
    """The engine model of one model on its placement: its tensor-parallel GPUs' bandwidth and FLOPS
    add up, and each step pays their all-reduces at the GPUs' link figures; its KV cache in tokens of
    every layer; speculating as `spec` (a run's measurement of it, plan/speculative.py `measured`)
    says, or not at all."""
    return GpuModel(
        params=need.arch.parameters(),
        layers=need.arch.layers,
        hidden=need.arch.hidden,
        kv_bytes_per_token=placed.kv_per_token_per_gpu * need.tp,
        bandwidth=gpu.bandwidth * BANDWIDTH_EFFICIENCY * need.tp,
        flops=compute_rate(need, gpu) * FLOPS_EFFICIENCY * need.tp,
        kv_tokens=placed.kv_tokens,
        max_num_seqs=need.max_num_seqs,
        max_batched_tokens=need.batched_tokens,
        bytes_per_param=weight_bytes_per_param(need),
        name=need.key,
        host_tokens=placed.host_kv_tokens,
        host_bandwidth=HOST_BANDWIDTH * need.tp,
        tokens_per_step=spec.tokens_per_step if spec else 1.0,
        drafted=spec.drafted if spec else 0.0,
        tp=need.tp,
        link_bandwidth=gpu.link_bandwidth,
        allreduce_latency=gpu.allreduce_latency,
    )


def decode_step(need: ModelNeed, gpu: GpuFigures, spec: SpecDecode | None = None) -> dict:
    """What one decode step of the model reads and computes with, per GPU of its engine: its weights
    (at their stored or quantized bytes), their quantization, the arithmetic's peak rate, over several
    GPUs their all-reduces (how many a step, their latency a step and their time a token), and its
    speculative method with the acceptance it is modelled at (`spec`, measured) or none."""
    method = dict(need.config.speculative).get("method") if need.config and need.config.speculative else None
    group = GpuModel(
        layers=need.arch.layers,
        hidden=need.arch.hidden,
        tp=need.tp,
        link_bandwidth=gpu.link_bandwidth,
        allreduce_latency=gpu.allreduce_latency,
    )
    latency, per_token = group.allreduce_terms()
    return {
        "weights_per_gpu": need.weights / need.tp,
        "quantization": need.quantization,
        "tflops": compute_rate(need, gpu) / 1e12,
        "fp8_compute": compute_rate(need, gpu) != gpu.flops,
        "speculative": method,
        **(
            {
                "allreduce": {
                    "gpus": need.tp,
                    "per_step": 2 * need.arch.layers,
                    "latency_s": latency,
                    "per_token_s": per_token,
                }
            }
            if need.tp > 1
            else {}
        ),
        **(
            {
                "tokens_per_step": spec.tokens_per_step,
                "acceptance": spec.acceptance,
                "drafted": spec.drafted,
                "measured_by": spec.source,
            }
            if spec is not None
            else {}
        ),
    }
