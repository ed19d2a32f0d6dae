"""The in-process vLLM engine (`local.py`) and what it needs of vLLM: the engine arguments a model
config gives, shared with the managed servers' command lines (`args.py`), the vLLM interface
personalens calls as data and its check against the installed release (`api.py`, `check.py`), the
modes of `reproducible: true` (`invariance.py`) and the embedding model of
PersonalBench's baseline (`embedding.py`). The only place that imports `vllm`'s Python API; it may
import `chat`, `models`, placement's GPU reader and the interface, never `serving` or the factory."""
