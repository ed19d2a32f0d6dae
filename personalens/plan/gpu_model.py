"""The roofline model of one engine's GPUs that plan/engine_model.py steps by: a step takes overhead +
max(memory time, compute time), memory = weights + the running requests' KV read once, compute = 2 x
parameters x tokens in the step + attention over the context."""

from __future__ import annotations

from dataclasses import dataclass

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

    def reload_seconds(self, tokens: int) -> float:
        """Copying `tokens` of offloaded KV back to the GPUs (not overlapped with the step)."""
        return tokens * self.kv_bytes_per_token / self.host_bandwidth if tokens else 0.0

    def step_seconds(self, decodes: int, prefill: int, context: int) -> float:
        """One engine step: `decodes` running requests one token each, `prefill` prompt tokens,
        `context` tokens of KV read by the step's attention."""
        memory = (self.bytes_per_param * self.params + context * self.kv_bytes_per_token) / self.bandwidth
        tokens = decodes + prefill
        compute = (2 * self.params * tokens + 4 * self.layers * self.hidden * context * min(tokens, 1)) / self.flops
        return self.overhead + max(memory, compute)

    def decode_seconds(self, decodes: int, context: int, steps: int) -> float:
        """`steps` engine steps that only decode `decodes` requests, the KV read growing by `decodes`
        tokens a step from `context`: step_seconds summed in closed form (both of its terms grow
        linearly, so the larger one changes at most once)."""
        memory = (
            (self.bytes_per_param * self.params + context * self.kv_bytes_per_token) / self.bandwidth,
            decodes * self.kv_bytes_per_token / self.bandwidth,
        )
        compute = (
            (2 * self.params * decodes + 4 * self.layers * self.hidden * context) / self.flops,
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

        return steps * self.overhead + total(first, 0, split) + total(last, split, steps)
