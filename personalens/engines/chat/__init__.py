"""Chat templates applied on this side of an engine: messages formatted for a model's roles and its
system prompt folded where the template has no system role (`messages.py`), a tokenizer and template
read from a model's files without transformers (`template_files.py`), and prompts as token ids made
the way vLLM's chat path makes them, kept per dialogue so that each turn tokenizes only what changed
(`token_ids.py`, used by the simulate loop, the planner and the in-process engine), a model's
template rendered on a run's prompts before anything loads (`template_check.py`), and a reasoning
model's thinking split from its answer (`reasoning.py`; gpt-oss's harmony channels: `harmony.py`).
It imports `models` and the interface."""
