"""The house's shape: every course_lib module is listed in the README's layout, once, and imports only modules
listed above it there, so the import graph has one direction and no cycles."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "course_lib"
SIZE_LIMIT = 300  # lines: "each under about 300 lines" (DEVELOPERS guide)


def readme_order() -> list[str]:
    """course_lib module names in the order the README's layout lists them."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index("course_lib/  one module per concept"):text.index("\nscripts/ ")]
    return [name for line in block.splitlines()[1:] for name in re.findall(r"\b(\w+)\.py\b", line.split("  ")[1]
                                                                              if line.startswith("  ") else "")]


def course_imports(path: Path) -> set[str]:
    """The course_lib modules a module imports (relative or absolute), at any depth of its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.level == 1 or (node.module or "").startswith("course_lib")):
            base = (node.module or "").removeprefix("course_lib").lstrip(".")
            found |= {base.split(".")[0]} if base else {alias.name for alias in node.names}
    return found - {""}


def modules() -> list[str]:
    """Every module of the package but the package's own entry files."""
    return sorted(p.stem for p in PACKAGE.glob("*.py") if not p.stem.startswith("__"))


def test_every_module_is_listed_once():
    order = readme_order()
    assert sorted(order) == modules(), (set(modules()) ^ set(order), "README layout and course_lib/ differ")


def test_each_module_imports_only_modules_listed_above_it():
    order = readme_order()
    rank = {m: i for i, m in enumerate(order)}
    upward = {m: sorted(d for d in course_imports(PACKAGE / f"{m}.py") if rank.get(d, -1) >= rank[m]) for m in order}
    assert not {m: d for m, d in upward.items() if d}, "imports of modules listed below (or at) the importer"


def test_modules_stay_small():
    sizes = {m: len((PACKAGE / f"{m}.py").read_text().splitlines()) for m in modules()}
    assert not {m: n for m, n in sizes.items() if n > SIZE_LIMIT}
