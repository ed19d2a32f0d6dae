"""Where a command's models run, decided before anything loads, and how much memory each gets.

- architecture.py: a model's shape from its config.json and the memory that shape implies;
- gpus.py: the GPUs this job may use, read without CUDA;
- sizing.py: what one model needs of a GPU (weights, activations, KV cache) and how a GPU's memory is
  split among the models on it;
- layout.py: the decision itself, one `Layout` of `Placement`s (placed.py) from the model configs to
  the engines and servers that start (engines/factory.py) and to what `personalens plan` models
  (plan/); fitting.py tries the two layouts and says why none fits, copies.py fills the GPUs left
  free with copies of models, alternatives.py lists the other layouts of a job's bottleneck model
  (each the options under which layout.py makes it) for `personalens plan` to model;
- inflight.py: how many dialogues an engine keeps in flight with their histories still cached.

Pure but for gpus.py's `nvidia-smi` and layout.py's reading of model directories. Imports only
engines.models (a model's config and files), engines.dtype and errors; a new model family's sizing goes in
architecture.py.
"""
