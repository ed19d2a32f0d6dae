"""The PersonalBench prompt files (prompts/personalbench/*.txt): Jinja2, read once, rendered strictly."""

from __future__ import annotations

from pathlib import Path

import jinja2

from personalens.config import fingerprint
from personalens.errors import PersonalensError
from personalens.paths import PROJECT_ROOT

DEFAULT_DIR = PROJECT_ROOT / "prompts" / "personalbench"
FILES = ("extract.txt", "relevance.txt", "generic.txt", "personalized.txt", "judge.txt")


class Prompts:
    def __init__(self, folder: str | Path | None = None):
        self.folder = Path(folder) if folder else DEFAULT_DIR
        missing = [f for f in FILES if not (self.folder / f).is_file()]
        if missing:
            raise PersonalensError(f"personalbench.prompts: missing template file(s) {missing} in {self.folder}")
        self.sources = {f: (self.folder / f).read_text(encoding="utf-8") for f in FILES}
        self._env = jinja2.Environment(loader=jinja2.DictLoader(self.sources), undefined=jinja2.StrictUndefined,
                                       autoescape=False, trim_blocks=True, lstrip_blocks=True)
        try:
            for f in FILES:
                self._env.get_template(f)
        except jinja2.TemplateSyntaxError as e:
            raise PersonalensError(f"{self.folder / str(e.name)}: line {e.lineno}: {e.message}") from None

    @property
    def digest(self) -> str:
        return fingerprint(self.sources)

    def render(self, name: str, **values: object) -> str:
        try:
            return self._env.get_template(name).render(**values).strip()
        except jinja2.UndefinedError as e:
            raise PersonalensError(f"{self.folder / name}: {e.message}") from None
