"""The prompt template files: read once from a folder, rendered with Jinja2.

Templates are plain text with Jinja2 placeholders (`{{ name }}`), so braces or dollar signs inside
profile text need no escaping: values are inserted verbatim and never parsed as template syntax.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from personalens.errors import PersonalensError
from personalens.paths import PROJECT_ROOT

# The project's own templates: the repository's top-level prompts/ folder.
DEFAULT_DIR = PROJECT_ROOT / "prompts"

# What every template set must provide: for each prompt, the file names that can hold it (a
# per-speaker judge may come as one file for both speakers or as one file per speaker). Other
# files are optional and picked by name when present (docs/fidelity.md): user_agent/system.txt
# (a system prompt for the user agent), assistant/<family>/<mode>.txt (a model family's own
# assistant prompt) and assistant/[<family>/]<mode>.user.txt (the assistant then sees the dialogue
# as text in one user message instead of as chat turns).
REQUIRED: tuple[tuple[tuple[str, ...], ...], ...] = (
    (("user_agent/initial.txt",),),
    (("user_agent/next.txt",),),
    (("assistant/base.txt",),),
    (("assistant/vanilla.txt",),),
    (("judge/task_completion.txt",),),
    (("judge/personalization.txt",),),
    (("judge/naturalness.txt",), ("judge/naturalness.user.txt", "judge/naturalness.assistant.txt")),
    (("judge/coherence.txt",), ("judge/coherence.user.txt", "judge/coherence.assistant.txt")),
)


ROLE_FOLDERS = ("user_agent", "assistant", "judge")


class PromptError(PersonalensError, ValueError):
    """A template folder or file that cannot be used; the message names the file."""


@dataclass(frozen=True)
class Templates:
    folder: Path
    sources: Mapping[str, str] = field(repr=False)  # file name relative to folder -> text
    _env: jinja2.Environment = field(repr=False, compare=False)
    style: str = "paper"  # how profile parts and turns are written into prompts (sections.STYLES)
    verbatim: bool = False  # keep a rendered prompt's outer whitespace (else it is stripped)

    def render(self, name: str, **values: object) -> str:
        try:
            text = self._env.get_template(name).render(**values)
        except jinja2.UndefinedError as e:
            raise PromptError(f"{self.folder / name}: {e.message}") from e
        except jinja2.TemplateNotFound as e:
            raise PromptError(f"{self.folder / name}: included file {e.name} not found") from e
        return text if self.verbatim else text.strip()

    def first(self, *names: str) -> str | None:
        """The first of `names` that the set holds, or None."""
        return next((n for n in names if n in self.sources), None)

    def pick(self, *names: str) -> str:
        """The first of `names` that the set holds; an error naming them all when none is."""
        name = self.first(*names)
        if name is None:
            raise PromptError(f"{self.folder}: none of the template files {', '.join(names)} exists")
        return name


def load_templates(folder: str | Path | None = None, *, style: str = "paper", verbatim: bool = False) -> Templates:
    """Reads and compiles every template file (`*.txt`) of `folder` (None: the project's prompts/
    folder, the paper's figures); `style` and `verbatim` are the set's rendering rules."""
    folder = DEFAULT_DIR if folder is None else Path(folder)
    if not folder.is_dir():
        raise PromptError(f"prompt template folder not found: {folder}")
    # A set is its role folders only: other sets (prompts/official/) and other pipelines' prompts
    # (prompts/datagen/, prompts/personalbench/) beside them are not part of it, nor of its fingerprint.
    sources = {
        p.relative_to(folder).as_posix(): p.read_text(encoding="utf-8")
        for role in ROLE_FOLDERS
        for p in sorted((folder / role).rglob("*.txt"))
    }
    for alternatives in REQUIRED:
        if not any(all(name in sources for name in names) for names in alternatives):
            wanted = " (or ".join(" and ".join(names) for names in alternatives)
            raise PromptError(f"prompt template file missing: {folder / wanted}" + ")" * (len(alternatives) - 1))
    env = strict_environment(sources, folder)
    return Templates(folder=folder, sources=sources, _env=env, style=style, verbatim=verbatim)


def read_template_files(folder: str | Path, names: Sequence[str], what: str) -> dict[str, str]:
    """name -> text of the named template files of `folder` (a pipeline's fixed set of prompts);
    `what` names the set in the error when any is missing."""
    folder = Path(folder)
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        raise PromptError(f"{what}: template file(s) {missing} missing in {folder}")
    return {name: (folder / name).read_text(encoding="utf-8") for name in names}


def strict_environment(sources: Mapping[str, str], folder: Path) -> jinja2.Environment:
    """The project's rules for prompt templates, every source compiled now so that syntax errors
    surface at load time, named by file and line."""
    env = jinja2.Environment(
        loader=jinja2.DictLoader(dict(sources)),
        undefined=jinja2.StrictUndefined,  # a misspelt placeholder fails instead of rendering empty
        autoescape=False,
        trim_blocks=True,  # lines holding only {% ... %} or {# ... #} leave no blank line behind
        lstrip_blocks=True,
        keep_trailing_newline=True,  # an {% include %}d file ends with its newline, like a pasted one
    )
    for name in sources:
        try:
            env.get_template(name)
        except jinja2.TemplateSyntaxError as e:
            raise PromptError(f"{Path(folder) / name}: line {e.lineno}: {e.message}") from e
    return env
