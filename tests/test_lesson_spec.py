"""The lesson as the unit (base.lessons): a notebook and its spec agree. Every notebook has one spec and every
spec one notebook, in course order; the notebook names itself as its spec does; its CHECK cells call the checks its
spec lists; the README's lesson table and the committed run times are the specs' and the runner's; the sizes
config reads are the specs'."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from course_lib import exercises
from course_lib.base import config, hardware, lessons, results
from course_lib.benchmark import bench
from course_lib.entry import runner

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = runner.lesson_paths(REPO / "notebooks")


def code(path: Path) -> str:
    """A notebook's code cells, joined."""
    return "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")


def test_every_notebook_has_one_spec_in_course_order():
    assert [p.stem for p in NOTEBOOKS] == list(lessons.names()), "notebooks/ and course_lib/base/lessons.py differ"
    assert len(lessons.BY_NAME) == len(lessons.LESSONS) + len(lessons.SCRIPTS), "two specs share a name"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_notebook_names_itself_as_its_spec(path):
    """The banner and the run size name the notebook's own spec (a literal, or LESSON = "<name>"), no other."""
    text = code(path)
    named = set(re.findall(r"""(?:banner|run_size)\(\s*["'](\w+)["']""", text))
    named |= set(re.findall(r"""^LESSON = ["'](\w+)["']""", text, re.MULTILINE))
    assert named == {path.stem}, named
    assert lessons.get(path.stem).notebook


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_notebook_calls_the_checks_its_spec_lists(path):
    spec = lessons.get(path.stem)
    assert re.findall(r"exercises\.(check_\w+)\(", code(path)) == list(spec.checks)
    assert all(callable(getattr(exercises, name, None)) for name in spec.checks)


def test_readme_lesson_table_is_the_specs():
    """The README's lesson block is exactly lesson_table's lines: a topic or status changes in the spec only (then
    `python -m course_lib.entry.runner --readme` rewrites the block)."""
    assert results.read_block(REPO / "README.md", runner.README_BLOCK) == runner.lesson_table(runner.committed_runs())


def test_every_lesson_has_a_committed_run():
    runs = runner.committed_runs()
    assert set(runs) == set(lessons.names())
    assert all(r.seconds > 0 and r.size == "full" for r in runs.values())


def test_config_reads_the_specs():
    """Sizes, budgets and reference runs: every key names a spec, and each spec's scale is what run_size applies."""
    assert {name for name, _, _ in config.LESSON_SCALES} <= set(lessons.BY_NAME)
    assert set(config.LESSON_BUDGET_S) == {le.name for le in lessons.LESSONS if le.budget_s}
    for spec in lessons.LESSONS:
        for scale in spec.scales:
            if scale.kind in (lessons.CPU, lessons.GPU):
                size = config.run_size(spec.name, gpu=scale.kind == lessons.GPU, size=scale.size, fit=False)
                assert all(getattr(size, k) == v for k, v in scale.changes().items()) or \
                    (spec.name, scale.size, lessons.CPU_EMULATED_BF16) in config.LESSON_SCALES, (spec.name, scale)


def test_an_unknown_spec_names_the_specs():
    with pytest.raises(KeyError, match="00_setup"):
        lessons.get("99_nothing")


def test_commit_runs_rewrites_times_and_table(tmp_path, monkeypatch):
    """--inplace at full size on a CPU: the passing lessons' seconds land in the times file and the README table."""
    (tmp_path / "docs" / "results").mkdir(parents=True)
    start, end = results.block_markers(runner.README_BLOCK)
    (tmp_path / "README.md").write_text(f"# x\n{start}\nold\n{end}\n")
    monkeypatch.setattr(runner, "times_file", lambda: tmp_path / "docs" / "results" / runner.TIMES_FILE)
    runner.commit_runs([{"lesson": "00_setup", "ok": True, "seconds": 41.4},
                        {"lesson": "01_pytorch_baseline", "ok": False, "seconds": 3.0}], "full", "CPU X")
    runs = runner.committed_runs()
    assert list(runs) == ["00_setup"] and runs["00_setup"].seconds == 41 and runs["00_setup"].hardware == "CPU X"
    table = results.read_block(tmp_path / "README.md", runner.README_BLOCK)
    assert "| 41 s |" in table[2] and "not run yet" in table[3]


def test_committed_runs_keep_the_figures_their_specs_name():
    """The GPU estimator reads these typed figures (never a notebook's printed text): each spec's figures are in its
    committed run, with a spread where the estimator uses one."""
    runs = runner.committed_runs()
    for spec in lessons.LESSONS:
        for name in spec.figures:
            assert runs[spec.name].figure(name).value is not None, (spec.name, name)
    assert all(runs["02_lightning"].figure(name).low is not None for name in lessons.TRAINER_ROWS_EPOCHS)


def test_spec_targets_name_gpu_check_rows():
    """Each lesson spec's GPU target compares two rows gpu_check runs (its TARGETS come from the specs)."""
    from scripts import gpu_check

    rows = {c["name"] for c in gpu_check.configs()}
    for spec in lessons.LESSONS:
        for target in spec.targets:
            assert {target.config, target.baseline} <= rows, (spec.name, target)
    assert [t[0] for t in gpu_check.TARGETS] == [s.number for s in lessons.LESSONS for _ in s.targets]


def test_gpu_check_rows_are_the_specs_gpu_rows(monkeypatch):
    """gpu_check runs each lesson spec's gpu_rows, in course order, as the bench configurations run_configs reads; a
    row for one precision policy (lesson 05's fp16 compile) only where the policy picks it."""
    from scripts import gpu_check

    monkeypatch.setattr(hardware, "choose_precision", lambda *a, **k: "bf16-mixed")
    rows = [r for spec in lessons.LESSONS for r in spec.gpu_rows]
    assert [c["name"] for c in gpu_check.configs()] == [r.name for r in rows if r.policy is None]
    assert {spec.number for spec in lessons.LESSONS if spec.gpu_rows} == {"03", "04", "05"}
    monkeypatch.setattr(hardware, "choose_precision", lambda *a, **k: "16-mixed")
    fp16 = [c for c in gpu_check.configs() if c["policy"] == "16-mixed"]
    assert [c["name"] for c in fp16] == ["ResNet-9 16-mixed + compile + channels_last"] and fp16[0]["alone"]
    cfg = bench.BenchConfig.of(gpu_check.configs()[0])  # what run_configs reads of a row
    assert (cfg.name, cfg.precision, cfg.build["model"]) == (rows[0].name, rows[0].precision, rows[0].model)


#: code that trains or times: a notebook section holding it has a spec section (base.workloads), with its work or a note
TRAINS_OR_TIMES = re.compile(r"\.fit\(|\b(?:run_configs|time_calls|seed_runs|run_seed|train_plain|lr_find|"
                             r"scale_batch_size|scaling\.measure\w*|ceilings\.measure|ddp_train|train_steps|"
                             r"perf_counter|breakdown\.measure|breakdown\.report)\(")


def sections(path: Path) -> list[tuple[str, list[str], str]]:
    """A notebook's '## ' sections: (heading, its '### ' subheadings, its code), headings without the '#'s."""
    out = []
    for cell in json.loads(path.read_text())["cells"]:
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            for line in text.splitlines():
                if line.startswith("## "):
                    out.append((line[3:].strip(), [], ""))
                elif line.startswith("### ") and out:
                    out[-1][1].append(line[4:].strip())
        elif out:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + "\n" + text)
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_spec_sections_name_the_notebooks_headings(path):
    """Each spec section names a heading of its notebook, in the notebook's order, once; one without work says why."""
    found = [h for heading, subs, _ in sections(path) for h in (heading, *subs)]
    named = [s.heading for s in lessons.get(path.stem).sections]
    assert set(named) <= set(found), set(named) - set(found)
    assert named == sorted(set(named), key=found.index), "spec sections out of the notebook's order, or twice"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_sections_that_train_or_time_have_a_spec_section(path):
    """A notebook section (or one of its subsections) that trains or times code has a spec section: the work the GPU
    estimator counts, or a note saying where it is counted or why not."""
    named = {s.heading for s in lessons.get(path.stem).sections}
    missing = [heading for heading, subs, text in sections(path)  # the numbered ones: not the install cell's
               if heading[:1].isdigit() and TRAINS_OR_TIMES.search(text) and not named & {heading, *subs}]
    assert not missing, f"add these sections to {path.stem}'s spec (course_lib/base/lessons.py): {missing}"


def test_benchmark_configurations_come_from_the_spec():
    """A lesson's benchmark configurations are its spec's: its notebook reads them (no literal of its own), and
    gpu_check runs each on a GPU as 'ResNet-9 <name>'."""
    from scripts import gpu_check

    rows = {c["name"] for c in gpu_check.configs()}
    for spec in (s for s in lessons.LESSONS if s.configs):
        assert "lessons.get(LESSON).configs" in code(REPO / "notebooks" / f"{spec.name}.ipynb"), spec.name
        assert {f"ResNet-9 {c.name}" for c in spec.configs} <= rows, spec.name
