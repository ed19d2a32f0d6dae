"""From the Hydra config to what the pipelines use: typed options (fidelity.py), the selection,
templates and engines a command works with (run.py), fingerprints and the saved config (core.py)."""

from personalens.config.core import (
    check_or_save,
    fingerprint,
    model_identity,
    plain,
    register_resolvers,
    reproducible,
    run_options,
    sampling_identity,
)

__all__ = [
    "check_or_save",
    "fingerprint",
    "model_identity",
    "plain",
    "register_resolvers",
    "reproducible",
    "run_options",
    "sampling_identity",
]
