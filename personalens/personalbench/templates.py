"""The PersonalBench prompt files (prompts/personalbench/*.txt): Jinja2, read once, rendered strictly."""

from __future__ import annotations

from pathlib import Path

import jinja2

from personalens.config import fingerprint
from personalens.errors import PersonalensError
from personalens.paths import PROJECT_ROOT
from personalens.prompts.templates import read_template_files, strict_environment

DEFAULT_DIR = PROJECT_ROOT / "prompts" / "personalbench"
FILES = ("extract.txt", "relevance.txt", "generic.txt", "personalized.txt", "judge.txt")


class Prompts:
    def __init__(self, folder: str | Path | None = None):
        self.folder = Path(folder) if folder else DEFAULT_DIR
        self.sources = read_template_files(self.folder, FILES, "personalbench.prompts")
        self._env = strict_environment(self.sources, self.folder)

    @property
    def digest(self) -> str:
        return fingerprint(self.sources)

    def render(self, name: str, **values: object) -> str:
        try:
            return self._env.get_template(name).render(**values).strip()
        except jinja2.UndefinedError as e:
            raise PersonalensError(f"{self.folder / name}: {e.message}") from None
