"""Check a whole data root and list every problem in it (`personalens validate DATA_ROOT`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from personalens.data.errors import Problem, Problems, summarize_warnings
from personalens.data.loading import PROFILE_DIR, domains_of, read_task_definitions, read_user_files, read_user_listing


@dataclass(frozen=True)
class Report:
    root: str
    problems: tuple[Problem, ...]
    users: int
    sd_scenarios: int  # well-formed single-domain assignments
    md_scenarios: int  # well-formed multi-domain assignments
    strict: bool = False  # warnings count as problems

    @property
    def errors(self) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if self.strict or not p.is_warning)

    @property
    def warnings(self) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.is_warning and not self.strict)

    @property
    def ok(self) -> bool:
        return not self.errors

    def summary(self) -> str:
        return f"{self.users} users, {self.sd_scenarios} single-domain and {self.md_scenarios} multi-domain scenarios"

    def format(self) -> str:
        """One problem per line, the warnings grouped by kind, then the summary line."""
        count = len(self.errors)
        verdict = "OK" if self.ok else f"{count} problem{'s' if count > 1 else ''}"
        if self.warnings:
            verdict += f" with {len(self.warnings)} warning{'s' if len(self.warnings) > 1 else ''}"
        return "\n".join(
            [*map(str, self.errors), *summarize_warnings(self.warnings), f"{self.root}: {verdict}; {self.summary()}"]
        )


def validate(root: str | Path, strict: bool = False) -> Report:
    """Read every user and task definition under root with the loader's checks, keeping all
    problems; with `strict`, warnings are problems too."""
    problems = Problems()
    path = Path(root)
    if not path.is_dir():
        problems.add(str(root), "", "data root does not exist or is not a directory")
        return Report(
            root=str(root), problems=tuple(problems.items), users=0, sd_scenarios=0, md_scenarios=0, strict=strict
        )
    domains = domains_of(path, problems)
    definitions = read_task_definitions(path, domains, problems)
    if (path / PROFILE_DIR).is_dir():
        indices = read_user_listing(path, problems)
    else:
        problems.add(f"{PROFILE_DIR}/", "", "missing directory (the user profiles)")
        indices = []
    counts = {"SD": 0, "MD": 0}
    for index in indices:
        _, assigned = read_user_files(path, index, ("SD", "MD"), domains, definitions, problems)
        for kind, pairs in assigned.items():
            counts[kind] += len(pairs)
    return Report(
        root=str(root),
        problems=tuple(problems.items),
        users=len(indices),
        sd_scenarios=counts["SD"],
        md_scenarios=counts["MD"],
        strict=strict,
    )
