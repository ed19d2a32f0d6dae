"""The build stages' prompt templates (prompts/datagen/*.txt, Figures 6, 7, 9, 10, 11 and 21 of the
paper) and the chat messages they render to."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from personalens.errors import PersonalensError
from personalens.paths import PROJECT_ROOT
from personalens.prompts.templates import read_template_files, strict_environment

DEFAULT_DIR = PROJECT_ROOT / "prompts" / "datagen"
TEMPLATE_FILES = (
    "demographics.txt",
    "interests.txt",
    "preferences.txt",
    "interactions.txt",
    "tasks_sd.txt",
    "tasks_md.txt",
    "situations.txt",
    "consistency.txt",
)


@dataclass(frozen=True)
class BuildTemplates:
    folder: Path
    sources: Mapping[str, str] = field(repr=False)
    _env: jinja2.Environment = field(repr=False, compare=False)

    def messages(self, name: str, demographics: Mapping[str, str] | None = None, **values: object) -> list[dict]:
        """One user message: template `name` (without .txt) rendered with `values`; demographics, when
        given, as labelled lines (without user_id, as the original pipeline shows them)."""
        if demographics is not None:
            values["demographics"] = [(_label(k), v) for k, v in demographics.items() if k != "user_id"]
        try:
            text = self._env.get_template(f"{name}.txt").render(**values).strip()
        except jinja2.UndefinedError as err:
            raise PersonalensError(f"{self.folder / name}.txt: {err.message}") from err
        return [{"role": "user", "content": text}]


def _label(key: str) -> str:
    return key.replace("_", " ").title()  # "english_proficiency" -> "English Proficiency"


def load_build_templates(folder: str | Path | None = None) -> BuildTemplates:
    folder = DEFAULT_DIR if folder is None else Path(folder)
    sources = read_template_files(folder, TEMPLATE_FILES, "datagen.prompts")
    return BuildTemplates(folder, sources, strict_environment(sources, folder))
