"""How lockstep deals a shard's dialogues into cohorts, pure: the rules `generate` runs by
(simulate/lockstep.py) and `plan` models (plan/throughput.py), so that both count the same cohorts.

A cohort's dialogues advance one turn per batched call; cohorts take turns on the user agent's and
the assistant's engines, so while one cohort's assistant turns run, another's user turns run. With
engines that join calls (a call that arrives while another runs joins its batch at the engine's next
step, as vLLM admits requests), small cohorts keep both engines full while other cohorts' last
replies finish: `JOINED_COHORT` dialogues each, as close to continuous scheduling as a per-turn
barrier allows. Engines that answer one call at a time get two cohorts, one on each engine.
"""

from __future__ import annotations

from personalens.errors import PersonalensError

JOINED_COHORT = 16  # defined: dialogues per cohort where both dialogue engines join calls


def setting(value: object, *, one: bool = False) -> int:
    """lockstep.cohorts, checked: auto (0) or a whole number >= 1. `one`: `reproducible: true` runs the
    engines' cores in this process (vLLM's CPU build, engines/vllm/invariance.py), which take turns, so
    that the calls and their batches follow from the command alone: auto gives 1, more is refused."""
    if value == "auto":
        return 1 if one else 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PersonalensError(f"lockstep.cohorts: expected auto or a whole number >= 1, got {value!r}")
    if one and value > 1:
        raise PersonalensError(
            f"lockstep.cohorts={value}: reproducible: true on vLLM's CPU build runs one cohort (each engine's core "
            "in this process, whose steps take turns); set lockstep.cohorts=1 or auto, or leave reproducible out"
        )
    return value


def auto_cohorts(dialogues: int, distinct: bool, joining: bool) -> int:
    """`lockstep.cohorts: auto` for `dialogues` dialogues: 1 where one engine serves the user agent
    and the assistant (`distinct` False: it already takes both roles' requests in one call); one per
    `JOINED_COHORT` dialogues, at least 2, where both engines join calls; else 2."""
    if not distinct:
        return 1
    return max(2, -(-dialogues // JOINED_COHORT)) if joining else 2


def least_share(count: int, auto: bool, joining: bool) -> int:
    """The fewest dialogues of a window a cohort runs with: `JOINED_COHORT` for auto's small cohorts
    (a window too small for every cohort's part leaves the last ones idle until it grows), else 1."""
    return JOINED_COHORT if count > 1 and auto and joining else 1


def window_share(size: int, count: int, least: int, index: int) -> int:
    """Cohort `index`'s part of a window of `size` dialogues in flight: the window split evenly over
    the `count` cohorts, in parts of at least `least` (cohorts beyond the parts get none)."""
    if size >= least * count:
        return size // count + (index < size % count)
    return min(least, max(0, size - index * least))
