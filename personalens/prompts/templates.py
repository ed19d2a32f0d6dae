"""The prompt template files: read once from a folder, rendered with Jinja2.

Templates are plain text with Jinja2 placeholders (`{{ name }}`), so braces or dollar signs inside
profile text need no escaping: values are inserted verbatim and never parsed as template syntax.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import jinja2

from personalens.errors import PersonalensError
from personalens.paths import PROJECT_ROOT

# The project's own templates: the repository's top-level prompts/ folder.
DEFAULT_DIR = PROJECT_ROOT / "prompts"

# Every file a folder must provide (the renderer uses all of them, some by {% include %}).
TEMPLATE_FILES: tuple[str, ...] = (
    "user_agent/guidelines.txt",
    "user_agent/initial.txt",
    "user_agent/next.txt",
    "assistant/base.txt",
    "assistant/vanilla.txt",
    "assistant/user_context.txt",
    "judge/task_completion.txt",
    "judge/personalization.txt",
    "judge/naturalness.txt",
    "judge/coherence.txt",
)


class PromptError(PersonalensError, ValueError):
    """A template folder or file that cannot be used; the message names the file."""


@dataclass(frozen=True)
class Templates:
    folder: Path
    sources: Mapping[str, str] = field(repr=False)  # file name (as in TEMPLATE_FILES) -> text
    _env: jinja2.Environment = field(repr=False, compare=False)

    def render(self, name: str, **values: object) -> str:
        try:
            text = self._env.get_template(name).render(**values)
        except jinja2.UndefinedError as e:
            raise PromptError(f"{self.folder / name}: {e.message}") from e
        return text.strip()


def load_templates(folder: str | Path | None = None) -> Templates:
    """Reads and compiles every template file of `folder` (None: the project's prompts/ folder)."""
    folder = DEFAULT_DIR if folder is None else Path(folder)
    if not folder.is_dir():
        raise PromptError(f"prompt template folder not found: {folder}")
    sources = {}
    for name in TEMPLATE_FILES:
        path = folder / name
        if not path.is_file():
            raise PromptError(f"prompt template file missing: {path}")
        sources[name] = path.read_text(encoding="utf-8")
    env = jinja2.Environment(
        loader=jinja2.DictLoader(sources),
        undefined=jinja2.StrictUndefined,  # a misspelt placeholder fails instead of rendering empty
        autoescape=False,
        trim_blocks=True,  # lines holding only {% ... %} or {# ... #} leave no blank line behind
        lstrip_blocks=True,
        keep_trailing_newline=True,  # an {% include %}d file ends with its newline, like a pasted one
    )
    for name in TEMPLATE_FILES:  # compile now so syntax errors surface at load time
        try:
            env.get_template(name)
        except jinja2.TemplateSyntaxError as e:
            raise PromptError(f"{folder / name}: line {e.lineno}: {e.message}") from e
    return Templates(folder=folder, sources=sources, _env=env)
