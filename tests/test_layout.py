"""The house's shape: course_lib is a few packages, one per layer (LAYERS, bottom up), and every module (base/errors.py,
named base.errors) is listed in the README's layout, once, and imports only modules listed above it there: its own
layer's or a lower layer's, so the import graph has one direction and no cycles, and the folders show it."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "course_lib"
SIZE_LIMIT = 300  # lines: "each under about 300 lines" (DEVELOPERS guide)
#: the layers, bottom up: a module imports only its own layer and the layers before it
LAYERS = ["base", "measure", "data", "training", "benchmark", "parallel", "compression", "exercises", "entry"]


def readme_order() -> list[str]:
    """course_lib module names (dotted below the package) in the order the README's layout lists them."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index("course_lib/  one package per layer"):text.index("\nscripts/ ")]
    return [name.replace("/", ".") for line in block.splitlines()[1:]
            for name in re.findall(r"\b([\w/]+)\.py\b", line.split("  ")[1] if line.startswith("  ") else "")]


def module_path(name: str) -> Path:
    """The file of a dotted module name below the package (exercises.core: course_lib/exercises/core.py)."""
    return PACKAGE.joinpath(*name.split(".")).with_suffix(".py")


def course_imports(path: Path) -> set[str]:
    """The course_lib modules a module imports (relative or absolute, dotted below the package), at any depth of its
    code; a name imported from a module counts as that module."""
    package, known, found = list(path.relative_to(PACKAGE).parent.parts), set(modules()), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:  # `from .x import` is this module's package, each further dot one package up
            base = package[:len(package) + 1 - node.level] + (node.module or "").split(".")
        elif (node.module or "").split(".")[0] == "course_lib":
            base = node.module.split(".")[1:]
        else:
            continue
        for name in [".".join(p for p in [*base, alias.name] if p) for alias in node.names]:
            parts = name.split(".")  # the longest prefix that is a module: `from .core import Grading` -> core
            found |= {next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in known),
                           name)}
    return found


def modules() -> list[str]:
    """Every module of the package and its subpackages (dotted below it) but the packages' own entry files."""
    return sorted(".".join(p.relative_to(PACKAGE).with_suffix("").parts) for p in PACKAGE.rglob("*.py")
                  if not p.stem.startswith("__"))


def test_every_module_is_listed_once():
    order = readme_order()
    assert sorted(order) == modules(), (set(modules()) ^ set(order), "README layout and course_lib/ differ")


def test_each_module_imports_only_modules_listed_above_it():
    order = readme_order()
    rank = {m: i for i, m in enumerate(order)}
    upward = {m: sorted(d for d in course_imports(module_path(m)) if rank.get(d, -1) >= rank[m]) for m in order}
    assert not {m: d for m, d in upward.items() if d}, "imports of modules listed below (or at) the importer"


def test_modules_stay_small():
    sizes = {m: len(module_path(m).read_text().splitlines()) for m in modules()}
    assert not {m: n for m, n in sizes.items() if n > SIZE_LIMIT}


def test_the_package_is_its_layers():
    """course_lib's own folder holds its two entry files and one package per layer, nothing else."""
    entries = {p.name for p in PACKAGE.iterdir() if p.name != "__pycache__"}
    assert entries == {"__init__.py", "__main__.py", *LAYERS}
    assert all((PACKAGE / layer / "__init__.py").is_file() for layer in LAYERS)


def test_imports_go_down_the_layers():
    """A module imports modules of its own layer or of a lower one, never of a higher one (read from the imports)."""
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    upward = {m: sorted(d for d in course_imports(module_path(m)) if rank[d.split(".")[0]] > rank[m.split(".")[0]])
              for m in modules()}
    assert not {m: d for m, d in upward.items() if d}, f"imports of a higher layer (layers bottom up: {LAYERS})"


def test_the_readme_lists_the_layers_in_order():
    """The README's map lists each layer's modules together, the layers in LAYERS' order."""
    layers = [m.split(".")[0] for m in readme_order()]
    assert [layer for i, layer in enumerate(layers) if i == 0 or layers[i - 1] != layer] == LAYERS
