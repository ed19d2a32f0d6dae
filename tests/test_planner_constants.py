"""Every number the planner rests on says what it is: each constant of personalens/plan/ and
personalens/engines/placement/ (a module's or a dataclass's default) whose value holds a number other
than 0 or 1 carries, in a comment on its lines or in the comment block just above it, one of the tags

    measured:  a run's result (which run, its bench/results file)
    fitted:    chosen so that the model reproduces a run (which run; tested against another where one exists)
    assumed:   taken from elsewhere (a datasheet, a published config, vLLM's or transformers' source)
    defined:   a definition or the planner's own setting, no claim about a GPU or vLLM

Numbers inside functions are not scanned."""

import ast
import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).parents[1] / "personalens"
MODULES = sorted([*(ROOT / "plan").glob("*.py"), *(ROOT / "engines" / "placement").glob("*.py")])
TAGS = ("measured:", "fitted:", "assumed:", "defined:")


def _numeric(node: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Constant) and type(n.value) in (int, float) and n.value not in (0, 1) for n in ast.walk(node)
    )


def _comments(source: str) -> dict[int, str]:
    """Each line's comment text, by line number."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return {t.start[0]: t.string for t in tokens if t.type == tokenize.COMMENT}


def _label(statement: ast.stmt, comments: dict[int, str], lines: list[str]) -> str:
    """The comments that describe a statement: those on its lines and the block just above it."""
    found = [comments.get(n, "") for n in range(statement.lineno, statement.end_lineno + 1)]
    n = statement.lineno - 1
    while n >= 1 and lines[n - 1].strip().startswith("#"):
        found.append(comments.get(n, ""))
        n -= 1
    return " ".join(found)


def constants(path: Path) -> list[tuple[int, str, str]]:
    """(line, statement, its comments) of each numeric constant of a module."""
    source = path.read_text()
    tree, comments, lines = ast.parse(source), _comments(source), source.splitlines()
    bodies = [tree.body] + [node.body for node in tree.body if isinstance(node, ast.ClassDef)]
    return [
        (s.lineno, ast.unparse(s)[:80], _label(s, comments, lines))
        for body in bodies
        for s in body
        if isinstance(s, (ast.Assign, ast.AnnAssign)) and s.value is not None and _numeric(s.value)
    ]


def test_every_constant_of_the_planner_says_whether_it_is_measured_fitted_assumed_or_defined():
    unlabelled = [
        f"{path.relative_to(ROOT.parent)}:{line}: {text}"
        for path in MODULES
        for line, text, label in constants(path)
        if not any(tag in label for tag in TAGS)
    ]
    assert not unlabelled, "constants without measured:/fitted:/assumed:/defined:\n" + "\n".join(unlabelled)


def test_the_scan_finds_the_planners_constants_and_reads_their_tags(tmp_path):
    """The scan itself: a labelled and an unlabelled constant, a dataclass default, a 0/1 flag."""
    module = tmp_path / "m.py"
    module.write_text(
        "# assumed: a datasheet\nRATE = 3.35e12\nSTEP = 16\nFLAG = 1\n\n"
        "class C:\n    x: int = 8  # fitted: run A\n    y: float = 0.5\n"
    )
    found = {text.split(" ")[0].rstrip(":"): label for _, text, label in constants(module)}
    assert set(found) == {"RATE", "STEP", "x", "y"}
    assert [k for k, label in found.items() if any(t in label for t in TAGS)] == ["RATE", "x"]
    assert len(MODULES) > 20 and sum(len(constants(p)) for p in MODULES) > 20
