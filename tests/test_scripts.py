"""The prepared GPU scripts: CI has no GPU to run them, so at least their imports and options must stay valid."""
import ast
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).parents[1] / "scripts").glob("gpu_*.py"))


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_gpu_script_imports_and_parses_help(path, monkeypatch, capsys):
    """Loading the script resolves every course_lib name it uses; --help exits 0 after printing its usage."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)  # module level only: main() is guarded by __name__
    monkeypatch.setattr(sys, "argv", [path.name, "--help"])
    with pytest.raises(SystemExit) as done:
        script.main()
    assert done.value.code == 0 and "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_gpu_script_uses_only_existing_course_lib_names(path):
    """Every `module.name` the script uses on a course_lib module exists (a rename would otherwise surface on a GPU)."""
    tree = ast.parse(path.read_text())
    modules = {a.asname or a.name: importlib.import_module(f"course_lib.{a.name}")
               for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module == "course_lib"
               for a in node.names}
    used = {(n.value.id, n.attr) for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in modules}
    assert used, f"{path.name} uses no course_lib module attributes: the check would test nothing"
    missing = sorted(f"{m}.{a}" for m, a in used if not hasattr(modules[m], a))
    assert not missing, f"{path.name} uses names course_lib does not have: {missing}"


def test_all_gpu_scripts_found():
    """The three scripts the issues name for GPU checks are all here (and so all tested above)."""
    assert {p.stem for p in SCRIPTS} >= {"gpu_check", "gpu_ddp_check", "gpu_capstone"}
