"""What `plan` says of the judge's replies: counted at their cap (an upper bound) until a calibration run
says what the judge writes, and then the pilot that would say it, as the commands to run. Pure."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

PILOT_USERS = "0-4"  # defined: the pilot's users, a few of the selection's
PILOT_NAME = "pilot"


def pilot_commands(overrides: Sequence[str]) -> list[str]:
    """A pilot `run` of a few users with this plan's overrides, then this plan calibrated by it: the
    plan's own options, the users and the run's name and folder replaced."""

    def key(o: str) -> str:
        return o.lstrip("+~").partition("=")[0]

    # a bare `~section` is the CLI's own deletion of a section the command does not read (cli.py)
    given = [o for o in overrides if not (o.startswith("~") and "=" not in o)]
    kept = [o for o in given if not key(o).startswith("plan.") and key(o) not in _REPLACED]
    planned = [o for o in given if key(o).startswith("plan.") and key(o) != "plan.calibrate"]
    run = ["personalens", "run", *kept, f"data.users={PILOT_USERS}", f"run.name={PILOT_NAME}"]
    plan = ["personalens", "plan", *kept, *planned, f"plan.calibrate=runs/{PILOT_NAME}"]
    return [shlex.join(run), shlex.join(plan)]


_REPLACED = ("data.users", "run.name", "run.out_dir")


def command_overrides() -> list[str]:
    """The running Hydra app's command-line overrides (none outside one)."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def judge_replies(max_tokens: int, calibration: dict | None, overrides: Sequence[str]) -> dict:
    """The judge's reply tokens the plan counts and what they rest on: the cap (with the pilot that
    would measure them), or the calibration run's judge (its thinking among them, where counted)."""
    measured = calibration and calibration.get("judge") and calibration.get("judge_reply_tokens")
    if measured:
        return {
            "basis": "calibrated",
            "tokens": calibration["judge_reply_tokens"],
            "thinking": calibration.get("judge_thinking_tokens"),
            "max_tokens": max_tokens,
            "run_dir": calibration["run_dir"],
        }
    return {"basis": "cap", "tokens": max_tokens, "max_tokens": max_tokens, "pilot": pilot_commands(overrides)}
