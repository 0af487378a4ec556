"""The floor stack: Colab's torch and torchvision (requirements/floor.txt, CI's second stack, `make floor`), the
floors' pins, and what can be checked of Python 3.13 here. The API check runs on both stacks; on the floor stack it is
the one that catches a call of an API newer than the floor."""
from __future__ import annotations

import ast
import importlib
import json
import re
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
ROOTS = ("torch", "torchvision", "torchao", "lightning")  # the packages whose versions the two stacks differ in
#: modules that Python 3.12 and 3.13 removed (PEP 594, PEP 632, imp): an import of one fails on Colab's Python 3.13
REMOVED_BY_313 = {"aifc", "asynchat", "asyncore", "audioop", "cgi", "cgitb", "chunk", "crypt", "distutils", "imghdr",
                  "imp", "lib2to3", "mailcap", "msilib", "nis", "nntplib", "ossaudiodev", "pipes", "smtpd", "sndhdr",
                  "spwd", "sunau", "telnetlib", "uu", "xdrlib"}


def sources() -> list[tuple[str, str]]:
    """(name, code) of every course_lib module, script, test and notebook code cell (IPython magics dropped)."""
    found = [(str(p.relative_to(REPO)), p.read_text())
             for folder in ("course_lib", "scripts", "tests") for p in sorted((REPO / folder).rglob("*.py"))]
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        for n, cell in enumerate(json.loads(path.read_text())["cells"]):
            if cell["cell_type"] == "code":
                lines = "".join(cell["source"]).splitlines()
                code = "\n".join(ln for ln in lines if not ln.lstrip().startswith(("%", "!")))
                found.append((f"{path.name} code cell {n}", code))
    return found


def dotted(node: ast.AST) -> str | None:
    """'a.b.c' for a chain of attributes on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def is_gate(test: ast.AST) -> bool:
    """Whether an if's test asks what this torch has: hasattr/getattr, or a comparison involving a version."""
    return any((isinstance(n, ast.Call) and getattr(n.func, "id", "") in ("hasattr", "getattr"))
               or (isinstance(n, (ast.Name, ast.Attribute)) and "version" in (dotted(n) or "").lower())
               for n in ast.walk(test))


def references(code: str) -> set[str]:
    """The torch/torchvision/torchao/lightning objects the code names outside a version gate, as full dotted names
    (import aliases resolved: `import torch.nn.functional as F; F.relu` names torch.nn.functional.relu)."""
    tree, aliases, gated = ast.parse(code), {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update({a.asname or a.name.split(".")[0]: a.name if a.asname else a.name.split(".")[0]
                            for a in node.names})
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            aliases.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
        elif isinstance(node, (ast.If, ast.IfExp)) and is_gate(node.test):
            branches = node.body + node.orelse if isinstance(node, ast.If) else [node.body, node.orelse]
            gated.update(id(n) for branch in branches for n in ast.walk(branch))
    found = {full for full in aliases.values() if full.split(".")[0] in ROOTS}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in gated and (name := dotted(node)):
            head, _, rest = name.partition(".")
            full = aliases.get(head, head) + ("." + rest if rest else "")
            if full.split(".")[0] in ROOTS:
                found.add(full)
    return found


def resolves(name: str) -> bool:
    """Whether the installed packages have `name`: its longest importable module, then attributes down the rest."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def test_no_api_newer_than_the_installed_torch_is_used_ungated():
    """Every torch, torchvision, torchao and Lightning object that course_lib, the scripts and the lessons name
    outside a version gate (`if hasattr(...)`, `getattr(..., default)`, a version comparison) exists in the installed
    versions. On the floor stack (torch 2.11) this fails for an API newer than the floor; gate it and say so."""
    import torch

    names = sorted({name for where, code in sources() if not where.startswith("tests/") for name in references(code)})
    assert len(names) > 100  # the scan found the course's calls, so it is not vacuous
    missing = [name for name in names if not resolves(name)]
    assert missing == [], f"not in torch {torch.__version__} (gate each on the version, or use an older API): {missing}"


def test_references_see_aliases_and_skip_gates():
    """The scan resolves import aliases and skips exactly the code under a hasattr or version gate."""
    code = ("import torch.nn.functional as F\nfrom torch import nn\nimport torch\nF.relu\nnn.Conv2d\n"
            "if hasattr(torch.backends.cuda.matmul, 'fp32_precision'):\n    torch.backends.cudnn.conv.fp32_precision\n"
            "if torch.__version__ >= '2.99':\n    torch.brand_new\ntorch.not_there\n")
    found = references(code)
    assert {"torch.nn.functional.relu", "torch.nn.Conv2d", "torch.not_there"} <= found
    assert "torch.brand_new" not in found and "torch.backends.cudnn.conv.fp32_precision" not in found
    assert resolves("torch.nn.functional.relu") and not resolves("torch.not_there")


def pins(path: Path, python: str) -> dict[str, str]:
    """{normalised name: version} of a pip-compiled file, for the pins whose markers hold on Linux with `python`."""
    env = {"python_version": python, "python_full_version": f"{python}.0", "sys_platform": "linux", "os_name": "posix",
           "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython"}
    reqs = [Requirement(block.split("\\")[0].strip()) for block in re.split(r"\n(?=[A-Za-z0-9])", path.read_text())
            if block.strip() and not block.startswith("#")]
    return {canonicalize_name(r.name): str(next(iter(r.specifier)).version) for r in reqs
            if r.marker is None or r.marker.evaluate(env)}


def floors() -> dict[str, str]:
    """{normalised name: lower bound} of pyproject.toml's [project] dependencies."""
    reqs = map(Requirement, PYPROJECT["project"]["dependencies"])
    return {canonicalize_name(r.name): next(s.version for s in r.specifier if s.operator == ">=") for r in reqs}


def test_floor_stack_pins_every_runtime_dependency_at_its_floor():
    """requirements/floor.txt (CI's second stack, Python 3.11) and floor-py313.txt (Colab's Python 3.13, wheels only)
    pin each runtime dependency at exactly its lower bound: the floors in pyproject.toml are what CI installs and tests
    (floor.txt) and what has cp313 wheels (floor-py313.txt)."""
    for name, python in (("floor.txt", "3.11"), ("floor-py313.txt", "3.13")):
        pinned = pins(REPO / "requirements" / name, python)
        assert {dep: pinned.get(dep) for dep in floors()} == floors(), f"{name} for Python {python}"


def test_floors_keep_what_colab_ships():
    """Colab's own torch and torchvision are the floors (local build tags aside), and every other runtime dependency
    Colab ships meets its range, so the install cell keeps them; only torchao is too old there (0.10 lacks PT2E)."""
    colab = {canonicalize_name(Requirement(line).name): Version(str(next(iter(Requirement(line).specifier)).version))
             for line in (REPO / "requirements" / "colab.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")}
    assert {n: colab[n].public for n in ("torch", "torchvision")} == {n: floors()[n] for n in ("torch", "torchvision")}
    ranges = {canonicalize_name(r.name): r.specifier for r in map(Requirement, PYPROJECT["project"]["dependencies"])}
    too_old = sorted(n for n, spec in ranges.items() if n in colab and not spec.contains(colab[n], prereleases=True))
    assert too_old == ["torchao"]


def test_sources_parse_as_python_311_and_import_nothing_removed_by_313():
    """Python 3.11 (the floor) parses every module, script, test and lesson cell (ast feature_version), and none imports
    a standard module that Python 3.12 or 3.13 removed. Python 3.13 itself is not installed here: this, and the cp313
    wheels of floor-py313.txt, are as far as 3.13 is checked."""
    removed = []
    for where, code in sources():
        tree = ast.parse(code, filename=where, feature_version=(3, 11))
        for node in ast.walk(tree):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            removed += [f"{where}: {m}" for m in mods if m.split(".")[0] in REMOVED_BY_313]
    assert removed == []
    assert sys.version_info >= (3, 11)


def test_quantizing_a_graph_that_stayed_fp32_is_refused():
    """A converted graph without int8 weights (the quantizer matched nothing, as non-strict export on torch 2.11 gave)
    raises, naming the export and the torch/torchao pairing; never an fp32 model passed off as int8."""
    import torch
    from torch import nn

    from course_lib.compression import compress

    graph = torch.fx.symbolic_trace(nn.Sequential(nn.Linear(4, 2)))
    with pytest.raises(RuntimeError, match="stayed fp32.*compress.export"):
        compress.int8_or_raise(graph)
