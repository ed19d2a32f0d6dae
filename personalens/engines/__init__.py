"""Model backends behind one interface.

This package keeps what every caller sees: the interface (`base.py`: `Engine.generate` over
`Request`s, `Sampling`, `Generation`), the factory that builds a command's engines (`factory.py`),
one engine over a model's copies (`replicated.py`), the in-flight cap of its copies (`flow.py`),
the command's stop (`stop.py`), a batched call
that moves a progress bar (`progress.py`), grammar pieces (`grammar.py`) and the CPU dtype rule
(`dtype.py`). Its sub-packages, each a job:

- `vllm/`: the in-process vLLM engine and everything it needs of vLLM (engine arguments, the
  interface check, batch invariance, the embedding model);
- `serving/`: the OpenAI-compatible HTTP engine, its flow control, and the vLLM servers personalens
  starts, their processes and watchdog;
- `models/`: a model's checked config and where its files are (a local folder, the Hugging Face cache,
  a wheel);
- `placement/`: where each model runs, decided before anything loads, from its architecture and
  the GPUs (one `Layout` of `Placement`s that `plan` and the factory both read);
- `chat/`: chat templates applied on this side, and prompts kept as token ids between turns.

Imports go down the layers that pyproject's import-linter contract states: the factory over the
engine kinds (`serving`, `vllm`), over placement, over `chat` and `models`, over the interface.
A new engine kind is a sub-package beside `vllm/` and `serving/` whose engine implements
`base.Engine` and checks the command's `Stop` while it waits, built by `factory.build_engine`.
"""
