"""Which users and which task kinds to run: the `data.users` and `data.kinds` settings."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from personalens.data.errors import DataError
from personalens.data.records import Kind

# User subsets the PersonaLens authors used; "sample50" is the one of the paper's experiments.
# fmt: off
SUBSETS: dict[str, tuple[int, ...]] = {
    "sample30": (
        7, 66, 132, 139, 207, 230, 251, 313, 340, 376, 386, 389, 415, 428, 597, 746, 774, 788, 822,
        854, 900, 1111, 1142, 1150, 1197, 1231, 1322, 1458, 1492, 1495,
    ),
    "sample50": (
        7, 53, 66, 107, 132, 139, 167, 195, 207, 230, 251, 313, 340, 376, 386, 389, 415, 418, 428,
        439, 517, 532, 597, 630, 641, 660, 674, 701, 746, 774, 788, 802, 822, 854, 900, 1111, 1142,
        1145, 1150, 1197, 1231, 1322, 1335, 1362, 1377, 1439, 1458, 1492, 1493, 1495,
    ),
    "sample100": (
        7, 21, 53, 66, 86, 107, 132, 139, 157, 166, 167, 168, 195, 207, 230, 248, 251, 312, 313, 340,
        352, 363, 365, 376, 386, 389, 394, 415, 418, 428, 431, 439, 470, 482, 517, 532, 597, 619, 630,
        641, 657, 659, 660, 664, 674, 686, 689, 701, 744, 745, 746, 774, 788, 802, 813, 822, 838, 840,
        842, 847, 854, 857, 870, 878, 880, 900, 913, 928, 942, 954, 997, 1069, 1111, 1114, 1118, 1120,
        1142, 1145, 1150, 1151, 1167, 1184, 1197, 1231, 1246, 1322, 1330, 1335, 1345, 1362, 1377, 1384,
        1434, 1439, 1458, 1461, 1492, 1493, 1495, 1496,
    ),
}
# fmt: on

ALL = "all"
_KINDS: dict[str, tuple[Kind, ...]] = {"both": ("SD", "MD"), "sd": ("SD",), "md": ("MD",)}
# One piece of a comma-separated spec: "7" or an inclusive range "0-9", as in `sbatch --array`.
_PIECE = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?")

USERS_HELP = (
    '"all", one of ' + ", ".join(SUBSETS) + ', an inclusive index range like "0-9" '
    '(comma-separated pieces allowed: "0-9,20"), or a list of user indices'
)


def user_indices(spec: object) -> tuple[int, ...] | None:
    """The sorted user indices a `data.users` spec names; None for "all" (every user in the root).

    Accepts "all", a subset name, "A-B" ranges and single indices joined by commas, one int,
    or any sequence of ints (Hydra hands lists over as ListConfig).
    """
    if isinstance(spec, str):
        name = spec.strip()
        if name == ALL:
            return None
        if name in SUBSETS:
            return SUBSETS[name]
        return _sorted_unique(_parse_ranges(name))
    if _is_index(spec):
        return (spec,)  # type: ignore[return-value]
    if isinstance(spec, Iterable) and not isinstance(spec, Mapping):
        items = list(spec)
        bad = [item for item in items if not _is_index(item)]
        if bad or not items:
            raise DataError(
                f"data.users: {list(items)!r} is not a list of user indices (non-negative ints); expected {USERS_HELP}"
            )
        return _sorted_unique(items)
    raise DataError(f"data.users: cannot read {spec!r}; expected {USERS_HELP}")


def task_kinds(spec: object) -> tuple[Kind, ...]:
    """The task kinds a `data.kinds` spec names: "both" (SD then MD), "SD" or "MD"."""
    kinds = _KINDS.get(spec.strip().lower()) if isinstance(spec, str) else None
    if kinds is None:
        raise DataError(f'data.kinds: unknown value {spec!r}; expected "both", "SD" or "MD"')
    return kinds


def _parse_ranges(text: str) -> list[int]:
    indices: list[int] = []
    for piece in text.split(","):
        match = _PIECE.fullmatch(piece)
        if match is None:
            raise DataError(f"data.users: {text!r} is neither a subset name nor an index range; expected {USERS_HELP}")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise DataError(f"data.users: range {piece.strip()!r} ends before it starts")
        indices.extend(range(first, last + 1))
    return indices


def _is_index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _sorted_unique(indices: Iterable[int]) -> tuple[int, ...]:
    return tuple(sorted(set(indices)))
