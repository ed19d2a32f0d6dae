"""The Hydra config of a PersonalBench test, composed in process from the repository's conf/."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir

from personalens.config import register_resolvers

REPO = Path(__file__).resolve().parents[1]


def config(*overrides: str):
    register_resolvers()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("config", overrides=["progress=false", *overrides])
