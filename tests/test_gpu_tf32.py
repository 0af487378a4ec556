"""TF32 through one API, suited to this torch: mixing the legacy switches (allow_tf32, set_float32_matmul_precision)
with the per-backend fp32_precision settings raises in torch 2.9+, and Inductor reads the new ones."""
import json
import re
import subprocess
import sys

from conftest import REPO

LEGACY = re.compile(r"allow_tf32\s*=|set_float32_matmul_precision\(")


def code_sources():
    """(where, code) of every course_lib module, script and notebook code cell."""
    for path in sorted([*(REPO / "course_lib").rglob("*.py"), *(REPO / "scripts").glob("*.py")]):
        if path != REPO / "course_lib" / "base" / "hardware.py":  # set_tf32: the legacy pair for torch < 2.9 only
            yield str(path.relative_to(REPO)), path.read_text()
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            if cell["cell_type"] == "code":
                yield f"{path.name} cell {i}", "".join(cell["source"])


def test_no_code_sets_tf32_with_the_legacy_switches():
    """Lessons and scripts set TF32 only through hardware.set_tf32."""
    offenders = [where for where, code in code_sources() if LEGACY.search(code)]
    assert not offenders, f"legacy TF32 switches in {offenders}: use hardware.set_tf32"


def test_set_tf32_uses_the_new_api_and_never_mixes():
    """On, off and the defaults: the per-backend settings follow, and reading them never meets the mixed-API error."""
    probe = ("import torch; from course_lib.base import hardware\n"
             "m, c = torch.backends.cuda.matmul, torch.backends.cudnn.conv\n"
             "for on in (True, False, None):\n"
             "    hardware.set_tf32(on); print(on, m.fp32_precision, c.fp32_precision)\n")
    res = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split("\n")[:3] == ["True tf32 tf32", "False ieee ieee", "None ieee tf32"]
