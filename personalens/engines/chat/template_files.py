"""A model's tokenizer and chat template read from its files (tokenizer.json, tokenizer_config.json,
chat_template.jinja) with the `tokenizers` library and Jinja, for counting tokens without loading
transformers, which imports torch (seconds that `personalens plan` does not spend). It answers the two
calls `tokens.ChatTokenizer` makes of a transformers tokenizer, so prompts are rendered and tokenized
as vLLM's chat path does it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from personalens.engines.base import Message
from personalens.engines.chat.messages import render_chat
from personalens.errors import PersonalensError

# the special tokens transformers hands every chat template
_SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token")


def _tokenizer_config(directory: Path) -> dict:
    path = directory / "tokenizer_config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def chat_template(directory: Path) -> str | None:
    """The chat template: chat_template.jinja, else tokenizer_config.json's (its `default` when named),
    else chat_template.json's (a multimodal model's processor template: Gemma 3, Mistral Small 3.1)."""
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    template = _tokenizer_config(directory).get("chat_template")
    processor = directory / "chat_template.json"
    if template is None and processor.is_file():
        template = json.loads(processor.read_text()).get("chat_template")
    if isinstance(template, list):
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    return template


def special_tokens(directory: Path) -> dict[str, str]:
    config = _tokenizer_config(directory)
    tokens = {}
    for name in _SPECIAL:
        value = config.get(name)
        if isinstance(value, dict):  # {"content": "<s>", "lstrip": false, ...}
            value = value.get("content")
        if isinstance(value, str):
            tokens[name] = value
    return tokens


class TokenizerFiles:
    """`apply_chat_template(..., tokenize=False)` and `__call__(texts, add_special_tokens=False)`, with
    the tokens' character offsets when asked (`return_offsets_mapping`, for tokens.PromptIds)."""

    def __init__(self, directory: Path):
        from tokenizers import Tokenizer

        path = directory / "tokenizer.json"
        if not path.is_file():
            raise PersonalensError(f"no {path}: cannot count this model's tokens without loading transformers")
        self._tokenizer = Tokenizer.from_file(str(path))
        self.chat_template = chat_template(directory)
        self._special = special_tokens(directory)

    def apply_chat_template(
        self, messages: Sequence[Message], tokenize: bool, add_generation_prompt: bool, **template_kwargs: Any
    ) -> str:
        if tokenize or not add_generation_prompt:
            raise ValueError("renders a prompt as text, with the generation prompt, only")
        if not self.chat_template:
            raise PersonalensError("the tokenizer has no chat template")
        return render_chat(self.chat_template, list(messages), **self._special, **template_kwargs)

    def __call__(self, texts: Sequence[str], add_special_tokens: bool, return_offsets_mapping: bool = False) -> dict:
        encoded = self._tokenizer.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        out = {"input_ids": [e.ids for e in encoded]}
        if return_offsets_mapping:  # (start, end) characters of each token, as transformers gives them
            out["offset_mapping"] = [e.offsets for e in encoded]
        return out
