"""The "Follow one event" walk-through (docs/architecture.md): every file:function it names exists.

So the walk-through stays true as the code moves.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.helpers import REPO

REFERENCE = re.compile(r"`((?:[\w]+/)*[\w]+\.py)(?::([\w.]+))?`")


def walkthrough() -> str:
    text = (REPO / "docs" / "architecture.md").read_text()
    start = text.index("\n## Follow one event\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end > 0 else None]
    # Its fenced sample output names no file, and its ``` would pair the backticks after it wrongly.
    return re.sub(r"^```.*?^```$", "", section, flags=re.MULTILINE | re.DOTALL)


def defined(path: Path) -> set[str]:
    """Top-level names of a module, and Class.method for its classes' functions."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names |= {f"{node.name}.{f.name}" for f in node.body if isinstance(f, ast.FunctionDef)}
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def test_every_file_and_function_the_walkthrough_names_exists() -> None:
    """A bare `file.py` is looked for beside the last path given; a bare `Class.method`, in the last file."""
    folder, module = REPO, None
    checked = 0
    for match in re.finditer(r"`([^`]+)`", walkthrough()):
        token = match[1]
        ref = REFERENCE.fullmatch(f"`{token}`")
        if ref:
            path = REPO / ref[1] if "/" in ref[1] else folder / ref[1]
            assert path.is_file(), f"the walk-through names {ref[1]}, which is not {path.relative_to(REPO)}"
            folder, module = path.parent, path
            if ref[2]:
                assert ref[2] in defined(path), f"{path.relative_to(REPO)} has no {ref[2]}"
                checked += 1
        elif (
            re.fullmatch(r"[A-Z]\w*\.\w+|[a-z_]+", token) and module is not None and token in defined(module)
        ):
            checked += 1
    assert checked >= 15, f"only {checked} references checked: has the section's form changed?"
