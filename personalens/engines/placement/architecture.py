"""A model's shape read from its config.json, and the memory that shape implies: its parameters, its
KV cache per token and per sequence, and a bound on its activations.

Pure: a mapping in, numbers out. Read as vLLM reads it (`get_text_config()`): a multimodal config
nests the language model under `text_config` (Gemma 3, Mistral-Small-3.1, Llama 4); fields a
published config leaves out take the defaults of its `model_type` in transformers (Gemma 3's
27B config names neither its vocabulary nor its sliding-window pattern). Which layers keep only a
window of tokens comes from `layer_types` where the config lists them, else from the family's rule:
`sliding_window_pattern` (Gemma 2 and 3), Qwen 2's `max_window_layers`, Llama 4's chunked attention.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from personalens.errors import PersonalensError

# defined: bytes per value of the dtypes a model config may name (vLLM's `dtype`, config.json's `torch_dtype`)
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}

# assumed: transformers' defaults (read in its source) for fields the published configs of these
# families leave out (Gemma2Config, Gemma3TextConfig; the sliding-window pattern is what their
# layer_types default to)
_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma2": {"sliding_window_pattern": 2, "tie_word_embeddings": True},
    "gemma3_text": {
        "vocab_size": 262_208,
        "max_position_embeddings": 131_072,
        "sliding_window_pattern": 6,
        "tie_word_embeddings": True,
    },
    # Llama 4: every fourth layer is a global one without RoPE, the others attend within chunks
    "llama4_text": {"no_rope_layer_interval": 4},
}

# assumed: bytes per sequence and vocabulary entry of vLLM's sampler, read in its code (its profile run
# samples with top-k and top-p): the logits, in float32, sorted (float32 values and int64 indices), their
# probabilities and cumulative sums, a mask; the activation bound it is part of was checked on an H200
# (docs/cluster.md)
_SAMPLER_BYTES = 32


@dataclass(frozen=True)
class Architecture:
    """The numbers of a config.json that size weights, KV cache and activations."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    experts: int = 1
    experts_per_token: int = 1
    tied_embeddings: bool = False
    # per layer: None for full attention, else the tokens it keeps (a sliding window or an attention chunk)
    windows: tuple[int | None, ...] = ()
    context: int | None = None  # max_position_embeddings: vLLM's max_model_len when none is set
    checkpoint_dtype: str | None = None  # config.json's torch_dtype: what the weights on disk are stored in
    # a quantization_config's quant_method (mxfp4, fp8, ...): the weights on disk are not in checkpoint_dtype
    quantization: str | None = None
    # of an integer-weight method (awq, gptq, compressed-tensors): bits per weight of the quantized linear
    # layers, and the weights sharing one scale and zero point (None: one per output channel)
    quant_bits: int | None = None
    quant_group: int | None = None
    quant_float: bool = False  # a compressed-tensors scheme whose weights are floats (8 bits: fp8)

    @classmethod
    def from_config(cls, config: Mapping, where: str = "config.json") -> Architecture:
        text = config.get("text_config")
        text = text if isinstance(text, Mapping) else config
        defaults = _FAMILY_DEFAULTS.get(str(text.get("model_type") or config.get("model_type")), {})
        quantization = config.get("quantization_config") or text.get("quantization_config")
        bits, group = _weight_bits(quantization)
        floats = _scheme_weights(quantization).get("type") == "float"

        def get(key: str, default: Any = None) -> Any:
            value = text.get(key, defaults.get(key, default))
            return defaults.get(key, default) if value is None else value

        try:
            layers = int(get("num_hidden_layers"))
            hidden = int(get("hidden_size"))
            heads = int(get("num_attention_heads"))
            kv_heads = int(get("num_key_value_heads", heads))
            head_dim = int(get("head_dim", hidden // heads))
            experts = int(get("num_local_experts") or get("num_experts") or 1)  # Mixtral, gpt-oss | Qwen3 MoE
            # an expert's own size where the config gives one beside a dense size (Qwen3 MoE)
            intermediate = int(
                get("moe_intermediate_size")
                if experts > 1 and get("moe_intermediate_size")
                else get("intermediate_size")
            )
            vocab = int(get("vocab_size"))
        except (KeyError, TypeError, ValueError) as err:
            raise PersonalensError(f"{where}: cannot size the model, missing or bad field {err}") from None
        context = get("max_position_embeddings")
        dtype = get("torch_dtype") or get("dtype") or config.get("torch_dtype") or config.get("dtype")
        return cls(
            layers=layers,
            hidden=hidden,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate=intermediate,
            vocab=vocab,
            experts=experts,
            experts_per_token=int(get("num_experts_per_tok", 1)),
            tied_embeddings=bool(get("tie_word_embeddings", False)),
            windows=_windows(get, layers),
            context=int(context) if context else None,
            checkpoint_dtype=str(dtype) if dtype else None,
            quantization=_quant_method(quantization),
            quant_bits=bits,
            quant_group=group,
            quant_float=floats,
        )

    @property
    def quantized(self) -> bool:
        return self.quantization is not None

    @property
    def fp8_weights(self) -> bool:
        """Weights stored in fp8: an fp8 checkpoint, or a compressed-tensors one of 8-bit float weights."""
        return self.quantization == "fp8" or (self.quant_float and self.quant_bits == 8)

    def parameters(self) -> int:
        """Parameter count of the language model, Llama-style (gated MLP, optional MoE), for weights not
        on disk; a vision tower is not counted."""
        attention = self.hidden * self.heads * self.head_dim * 2 + self.hidden * self.kv_heads * self.head_dim * 2
        mlp = 3 * self.hidden * self.intermediate * self.experts
        router = self.hidden * self.experts if self.experts > 1 else 0
        per_layer = attention + mlp + router + 2 * self.hidden
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.layers * per_layer + embeddings + self.hidden

    def expert_parameters(self) -> int:
        """The parameters of the MLP experts of every layer (0 for a dense model)."""
        return self.layers * 3 * self.hidden * self.intermediate * self.experts if self.experts > 1 else 0

    def quantized_bytes(self, dtype_bytes: int) -> int | None:
        """The weights' bytes of a quantized checkpoint from its config alone, for the methods whose
        layout is fixed (None for others): mxfp4 (gpt-oss) stores the experts' MLPs in 4-bit values
        with one 8-bit scale per 32 (4.25 bits) and the rest in `dtype_bytes`; fp8 stores every linear
        layer in one byte and the embeddings (and an untied output layer) in `dtype_bytes`; AWQ, GPTQ
        and compressed-tensors store the linear layers in `quant_bits` with a scale and zero point per
        `quant_group` weights (per output channel: one per `hidden` weights, the common input size)."""
        if self.quantization == "mxfp4":
            experts = self.expert_parameters()
            return (self.parameters() - experts) * dtype_bytes + experts * 17 // 32
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        if self.quantization == "fp8":
            return (self.parameters() - embeddings) + embeddings * dtype_bytes
        if self.quant_bits is not None:
            # AWQ, GPTQ and compressed-tensors keep the embeddings and the output layer in dtype_bytes
            # and store each group's 16-bit scale and, packed like the weights, its zero point
            linear = self.parameters() - embeddings
            groups = linear // self.quant_group if self.quant_group else linear // self.hidden
            return int(linear * self.quant_bits / 8 + groups * (2 + self.quant_bits / 8)) + embeddings * dtype_bytes
        return None

    def online_fp8_share(self, dtype_bytes: int) -> float:
        """Of a 16-bit checkpoint's weights, the share vLLM keeps when it quantizes them to fp8 as it
        loads them (`quantization: fp8`): every linear layer in one byte, the embeddings and an untied
        output layer as they are."""
        fp8 = dataclasses.replace(self, quantization="fp8").quantized_bytes(dtype_bytes)
        return fp8 / (self.parameters() * dtype_bytes)

    def kv_heads_per_gpu(self, tp: int) -> int:
        # vLLM replicates KV heads when tensor parallelism exceeds their number
        return max(1, math.ceil(self.kv_heads / tp))

    def kv_bytes_per_layer_token(self, dtype_bytes: int, tp: int = 1) -> int:
        """K and V of one token in one layer, on one GPU of the tensor-parallel group."""
        return self.kv_heads_per_gpu(tp) * self.head_dim * 2 * dtype_bytes

    def kv_bytes_per_token(self, dtype_bytes: int, tp: int = 1) -> int:
        """K and V of one token in every layer, on one GPU of the tensor-parallel group."""
        return self.layers * self.kv_bytes_per_layer_token(dtype_bytes, tp)

    def kv_bytes_for(self, tokens: int, dtype_bytes: int, tp: int = 1) -> int:
        """KV of one sequence of `tokens` on one GPU: windowed layers keep only their window."""
        per_layer = self.kv_bytes_per_layer_token(dtype_bytes, tp)
        return sum(per_layer * (min(tokens, w) if w else tokens) for w in self.windows)

    def activation_bytes(self, batched_tokens: int, seqs: int, dtype_bytes: int, tp: int = 1) -> int:
        """A bound on the activations of one GPU at vLLM's profile run, which a pinned KV cache does not
        make room for: one forward pass over `batched_tokens` (max_num_batched_tokens) holding, per
        token, four hidden-size vectors (the residual stream, the normed input, the attention's and the
        MLP's outputs), the attention's q, k, v and output heads of this GPU, and the MLP's gate-up
        output, activation and product (4 x intermediate per GPU, per routed expert: vLLM fuses the
        last two, an unfused layer needs them all); then the sampler over `seqs` sequences of the
        whole vocabulary. Checked against one such layer and sampler on an H200 (docs/cluster.md)."""
        heads = math.ceil(self.heads / tp)
        per_token = (
            4 * self.hidden
            + (2 * heads + 2 * self.kv_heads_per_gpu(tp)) * self.head_dim
            + 4 * math.ceil(self.intermediate / tp) * self.experts_per_token
        )
        return batched_tokens * per_token * dtype_bytes + seqs * self.vocab * _SAMPLER_BYTES


def _windows(get, layers: int) -> tuple[int | None, ...]:
    """Per layer, the tokens it keeps: None for full attention."""
    window = None if get("use_sliding_window") is False else get("sliding_window")
    kinds = get("layer_types")
    if kinds:  # mixed full/sliding layers as the config lists them (Gemma 2/3 in recent transformers, Qwen 3)
        chunk = get("attention_chunk_size")
        keep = {"sliding_attention": window, "chunked_attention": chunk}
        return tuple(int(keep[k]) if keep.get(k) else None for k in kinds)
    if window and get("sliding_window_pattern"):  # every pattern-th layer is global (Gemma 2: 2, Gemma 3: 6)
        pattern = int(get("sliding_window_pattern"))
        return tuple(None if (i + 1) % pattern == 0 else int(window) for i in range(layers))
    if window and get("use_sliding_window") and get("max_window_layers") is not None:  # Qwen 2
        return tuple(int(window) if i >= int(get("max_window_layers")) else None for i in range(layers))
    chunk = get("attention_chunk_size")
    if chunk:  # Llama 4: the layers with RoPE attend within chunks, the NoPE layers globally
        nope = get("no_rope_layers") or [
            int((i + 1) % int(get("no_rope_layer_interval", 4)) != 0) for i in range(layers)
        ]
        return tuple(int(chunk) if nope[i] else None for i in range(layers))
    return (int(window) if window else None,) * layers


def dtype_bytes(dtype: str, where: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise PersonalensError(f"{where}: dtype {dtype!r} is not one of {sorted(DTYPE_BYTES)} or auto")
    return DTYPE_BYTES[dtype]


def _weight_bits(config: object) -> tuple[int | None, int | None]:
    """(bits, group size) of an integer-weight quantization_config: awq and gptq give `bits` and
    `group_size` (-1: one per output channel); compressed-tensors its first config group's `weights`
    (`num_bits`, and `group_size` where its strategy is group). (None, None) for other methods."""
    if not isinstance(config, Mapping):
        return None, None
    method = str(config.get("quant_method", "")).lower()
    if method in ("awq", "gptq") and config.get("bits"):
        group = int(config.get("group_size") or -1)
        return int(config["bits"]), group if group > 0 else None
    weights = _scheme_weights(config) if method == "compressed-tensors" else {}
    if weights.get("num_bits"):
        group = weights.get("group_size") if weights.get("strategy") == "group" else None
        return int(weights["num_bits"]), int(group) if group else None
    return None, None


def _scheme_weights(config: object) -> Mapping:
    """The `weights` of a compressed-tensors quantization_config's first config group ({} where none)."""
    groups = config.get("config_groups") if isinstance(config, Mapping) else None
    weights = next(iter(groups.values()), {}).get("weights") if isinstance(groups, Mapping) and groups else None
    return weights if isinstance(weights, Mapping) else {}


def _quant_method(config: object) -> str | None:
    """A quantization_config's method (any config counts as quantized; "unknown" where it names none)."""
    if not config:
        return None
    method = config.get("quant_method") if isinstance(config, Mapping) else None
    return str(method).lower() if method else "unknown"
