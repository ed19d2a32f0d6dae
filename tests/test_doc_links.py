"""Every link in README.md and docs/*.md resolves: its file exists (relative to the linking file), and a
`#anchor` names a heading of that file as GitHub renders its id (lower case, punctuation dropped,
spaces as hyphens, a repeated heading numbered). Links to web addresses are not followed."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import doc_commands as dc

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")


def _prose(path: Path) -> list[tuple[int, str]]:
    """(number, line) of the lines outside fenced code blocks."""
    out, fenced = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line))
    return out


def anchors(path: Path) -> set[str]:
    """The heading ids GitHub gives a markdown file."""
    seen: Counter[str] = Counter()
    out = set()
    for _, line in _prose(path):
        match = _HEADING.match(line)
        if not match:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", match.group(1)).lower()
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        out.add(f"{slug}-{seen[slug]}" if seen[slug] else slug)
        seen[slug] += 1
    return out


def links(line: str) -> list[str]:
    """The targets of a prose line's links; a link written in inline code is none."""
    return _LINK.findall(re.sub(r"`[^`]*`", "", line))


def broken(paths: list[Path], root: Path = dc.REPO) -> list[str]:
    """`file:line: target (why)` for each link of `paths` that does not resolve."""
    out = []
    for path in paths:
        for number, line in _prose(path):
            for target in links(line):
                if re.match(r"[a-z]+:", target):
                    continue
                name, _, anchor = target.partition("#")
                linked = (path.parent / name).resolve() if name else path
                where = f"{path.relative_to(root)}:{number}: {target}"
                if not linked.exists():
                    out.append(f"{where} (no such file)")
                elif anchor and (linked.suffix != ".md" or anchor not in anchors(linked)):
                    out.append(f"{where} (no heading #{anchor} in {linked.name})")
    return out


def _docs() -> list[Path]:
    return [dc.REPO / "README.md", *sorted((dc.REPO / "docs").glob("*.md"))]


def test_every_link_in_the_readme_and_docs_resolves():
    found = sum(len(links(line)) for path in _docs() for _, line in _prose(path))
    assert found >= 50, found  # the check reads the docs' links: it cannot pass by finding none
    bad = broken(_docs())
    assert not bad, "links that do not resolve:\n" + "\n".join(bad)


def test_a_planted_broken_link_is_caught_where_it_is_written(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text(
        "# Other\n\n## 2. Models: `hf download`\n\n## Models\n\n## Models\n\n```bash\n# not a heading\n```\n"
    )
    doc = tmp_path / "docs" / "planted.md"
    doc.write_text(
        "# Planted\n\n## Here, and now\n\n"
        "[ok](other.md) [ok](other.md#2-models-hf-download) [ok](other.md#models-1) [ok](#here-and-now)\n"
        "[web](https://example.org/x#y) `[code](nowhere.md)`\n"
        "[gone](missing.md) [stale](other.md#models-2) [comment](other.md#not-a-heading) [self](#nowhere)\n"
        "```\n[in a block](missing.md)\n```\n"
    )
    assert broken([doc], root=tmp_path) == [
        "docs/planted.md:7: missing.md (no such file)",
        "docs/planted.md:7: other.md#models-2 (no heading #models-2 in other.md)",
        "docs/planted.md:7: other.md#not-a-heading (no heading #not-a-heading in other.md)",
        "docs/planted.md:7: #nowhere (no heading #nowhere in planted.md)",
    ]
