"""The roofline model of one engine's GPUs that plan/engine_model.py steps by: a step takes overhead +
max(memory time, compute time), memory = weights + the running requests' KV read once, compute = 2 x
parameters x tokens in the step + attention over the context."""

from __future__ import annotations

from dataclasses import dataclass

# assumed: the share of a GPU's peak HBM bandwidth decoding reaches, and of its dense bf16 FLOPS
# prefill-heavy steps reach
BANDWIDTH_EFFICIENCY = 0.75
FLOPS_EFFICIENCY = 0.5
# measured, not assumed: the KV bytes a second that vLLM's native offloading brings back from host
# memory, its stores to host and its scheduling included, as one H200 with vLLM 0.26.0 ran it (a 4 GiB
# KV cache with 48 GiB of host memory ran at 0.97x the same cache without: docs/performance.md,
# tests/test_planner_levers.py, which this figure was fitted to); about a tenth of the 64 GB/s a
# direction of the H200's PCIe 5.0 x16 link
HOST_BANDWIDTH = 6.6e9


@dataclass(frozen=True)
class GpuModel:
    """One engine on its GPUs. The defaults: Llama-3.1-8B-Instruct (its published config: 8.03e9
    parameters, 32 layers, hidden 4096, 8 KV heads of 128) in bf16 on one H100 SXM (datasheet:
    3.35 TB/s HBM3, 989 TFLOPS dense bf16, 80 GB). Efficiencies, overhead and the engine's limits are
    assumptions."""

    params: float = 8.03e9
    layers: int = 32
    hidden: int = 4096
    kv_bytes_per_token: int = 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 heads of 128, 2 bytes
    bandwidth: float = 3.35e12 * BANDWIDTH_EFFICIENCY
    flops: float = 989e12 * FLOPS_EFFICIENCY
    overhead: float = 0.5e-3  # assumed: per engine step (scheduling, launches; CUDA graphs on)
    kv_tokens: int = 400_000  # assumed: 0.9 x 80 GB - 16 GB weights - activations, / 128 KiB per token
    max_num_seqs: int = 256  # conf/model/llama31_8b.yaml
    max_batched_tokens: int = 8192  # assumed: vLLM's chunked-prefill token budget per step
    bytes_per_param: float = 2  # the weights' bytes per parameter (their dtype's, or quantized), read once a step
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
