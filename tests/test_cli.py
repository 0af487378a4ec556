"""`python -m course_lib fit|test`: one real command, run from outside the checkout with COURSE_BUILD in tmp, that the
other tests read (never change); the CLI's other paths, errors above all, through main(args) in this process."""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from course_lib.base.errors import CourseError
from course_lib.entry.cli import main

REPO = Path(__file__).resolve().parents[1]
LENET = str(REPO / "configs/lenet.yaml")


@pytest.fixture(scope="module")
def cli(tmp_path_factory, tiny_folder):
    """One `python -m course_lib fit --config configs/lenet.yaml --model.num_classes 3`, run from a folder outside the
    checkout with its output captured (not a terminal): the tests read its run folder and never write to it."""
    out = tmp_path_factory.mktemp("cli")
    (out / "elsewhere").mkdir()
    env = {**os.environ, "COURSE_SIZE": "smoke", "COURSE_DATA": str(tiny_folder),
           "COURSE_DATA_ROOT": str(out / "data"), "COURSE_BUILD": str(out / "build")}
    fit = subprocess.run([sys.executable, "-m", "course_lib", "fit", "--config", LENET, "--model.num_classes", "3"],
                         cwd=out / "elsewhere", env=env, capture_output=True, text=True, timeout=180)
    assert fit.returncode == 0, f"exit {fit.returncode}\n{fit.stdout[-3000:]}\n{fit.stderr[-3000:]}"
    return {"out": out, "fit": fit, "run_dir": out / "build" / "runs" / "lenet",
            "last": out / "build" / "runs" / "lenet" / "checkpoints" / "last.ckpt"}


@pytest.fixture
def course_env(tiny_folder, tmp_path, monkeypatch):
    """This process's COURSE_* for main(): smoke size, the tiny folder, and a build folder of this test's own."""
    monkeypatch.setenv("COURSE_SIZE", "smoke")
    monkeypatch.setenv("COURSE_DATA", str(tiny_folder))
    monkeypatch.setenv("COURSE_BUILD", str(tmp_path / "build"))
    return tmp_path / "build"


# the checkpoint is read from the shared run's folder (or a copy of it) while this test's build folder differs, on
# purpose: Lightning says that its ModelCheckpoint's folder moved
MOVED_RUN = pytest.mark.filterwarnings("ignore:The dirpath has changed from:UserWarning")


def run_main(capsys, *args: str):
    """main(args) in this process: (its exit code, 0 when it returns; stdout; stderr; the CLI it returned)."""
    try:
        result, code = main(list(args)), 0
    except SystemExit as stop:
        result, code = None, stop.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err, result


def test_fit_writes_checkpoint_and_logs(cli, tiny_folder):
    """fit exits 0 and writes last.ckpt, best.ckpt and the CSV logs under $COURSE_BUILD/runs/lenet, whatever the
    working folder; nothing lands in the working folder."""
    run_dir = cli["run_dir"]
    assert (run_dir / "checkpoints" / "last.ckpt").exists() and (run_dir / "checkpoints" / "best.ckpt").exists()
    assert not any((cli["out"] / "elsewhere").iterdir())
    (version,) = (run_dir / "logs").glob("version_*")
    metrics = (version / "metrics.csv").read_text()
    assert "val_acc" in metrics and "train_loss" in metrics
    saved = yaml.safe_load((version / "config.yaml").read_text())
    assert saved["trainer"]["max_epochs"] == 1  # COURSE_SIZE=smoke
    assert saved["data"]["subset"] == 2048 and saved["data"]["image_folder"] == str(tiny_folder)


def test_fit_redirected_to_a_file_logs_a_line_per_epoch(cli):
    """With stdout not a terminal (captured here), fit prints one line per epoch and no progress-bar refreshes."""
    log = cli["fit"].stdout + cli["fit"].stderr
    assert "\r" not in log and len(log.encode()) < 8_000, log[-2000:]
    lines = [line for line in cli["fit"].stdout.splitlines() if line.startswith("epoch ")]
    assert len(lines) == 1 and "1/1" in lines[0] and "val_acc" in lines[0] and "train_loss" in lines[0]


def test_log_defaults_keep_the_progress_bar_in_a_terminal():
    """In a terminal the usual progress bar stays; redirected, it is replaced by the per-epoch lines."""
    from course_lib.entry.cli import EpochLines, log_defaults

    assert log_defaults(interactive=True) == {}
    quiet = log_defaults(interactive=False)
    assert quiet["enable_progress_bar"] is False and isinstance(quiet["callbacks"][0], EpochLines)


@MOVED_RUN
def test_test_on_foreign_folder_reports_accuracy(cli, tiny_folder, course_env, capsys):
    """test --ckpt_path last.ckpt --test_folder grades the checkpoint and prints test_acc."""
    code, out, err, _ = run_main(capsys, "test", "--config", LENET, "--ckpt_path", str(cli["last"]),
                                 "--test_folder", str(tiny_folder / "train"))
    assert code == 0, err[-2000:]
    assert "test_acc" in out and "test_loss" in out


@MOVED_RUN
def test_fit_resumes_from_last(cli, course_env, caplog, capsys):
    """fit --ckpt_path last finds last.ckpt in the run's checkpoint folder and restores all states (from a copy of the
    shared run, which the other tests read as the one fit left it): its one epoch counts as done, none is trained."""
    shutil.copytree(cli["out"] / "build", course_env)
    with caplog.at_level(logging.INFO):
        resumed = main(["fit", "--config", LENET, "--ckpt_path", "last"])
    last = course_env / "runs" / "lenet" / "checkpoints" / "last.ckpt"
    assert resumed.trainer.ckpt_path == str(last)
    assert f"Restored all states from the checkpoint at {last}" in caplog.text, caplog.text[-2000:]
    assert resumed.trainer.fit_loop.epoch_progress.current.completed == 1
    assert not [line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch ")]


def test_new_fit_over_an_earlier_run_refuses_and_names_the_remedies(cli, monkeypatch, capsys):
    """A fresh fit where last.ckpt of an earlier run exists would overwrite it: it stops first, naming the remedies,
    and prints the message alone (no traceback)."""
    monkeypatch.setenv("COURSE_SIZE", "smoke")
    monkeypatch.setenv("COURSE_BUILD", str(cli["out"] / "build"))
    before = cli["last"].stat().st_mtime_ns
    code, _, err, _ = run_main(capsys, "fit", "--config", LENET, "--model.num_classes", "3")
    assert code == 1 and "--ckpt_path last" in err and "--run_name" in err
    assert "Traceback" not in err and cli["last"].stat().st_mtime_ns == before, err[-2000:]


@MOVED_RUN
def test_test_folder_graded_by_the_checkpoints_classes_whatever_course_data_says(cli, make_folder, course_env,
                                                                                 tmp_path, monkeypatch):
    """The same checkpoint and cat/ship folder give the same accuracy with COURSE_DATA at the 3-class training folder
    and at a 2-class cat/ship folder: the labels come from the classes the checkpoint records, not COURSE_DATA's."""
    foreign = make_folder(tmp_path / "foreign", classes=("cat", "ship"), per_class=10)
    other = make_folder(tmp_path / "other" / "train", classes=("cat", "ship"), per_class=4).parent
    args = ["test", "--config", LENET, "--ckpt_path", str(cli["last"]), "--test_folder", str(foreign)]
    same = main(args).trainer.callback_metrics
    monkeypatch.setenv("COURSE_DATA", str(other))
    moved = main(args).trainer.callback_metrics
    for name in ("test_acc", "test_loss"):
        assert same[name].item() == moved[name].item()
    assert torch.load(cli["last"], weights_only=True)["hyper_parameters"]["classes"] == ["airplane", "cat", "ship"]


def test_test_folder_with_a_class_the_checkpoint_lacks_is_refused(cli, make_folder, course_env, tmp_path, capsys):
    """A test folder with a class the model never learned fails, naming it, without a traceback."""
    foreign = make_folder(tmp_path / "foreign", classes=("cat", "dog"), per_class=2)
    code, _, err, _ = run_main(capsys, "test", "--config", LENET, "--ckpt_path", str(cli["last"]),
                               "--test_folder", str(foreign))
    assert code == 1 and "dog" in err and "Traceback" not in err


def test_failed_fit_prints_the_message_alone_and_leaves_no_empty_run_folder(make_folder, course_env, tmp_path,
                                                                            monkeypatch, capsys):
    """A fit that fails at setup (an 11-class folder on a 10-way head) exits 1 with the course's message and no
    traceback (--debug raises the error itself), and leaves no empty logs/version_N folder."""
    from course_lib.data.data import CIFAR10_CLASSES

    make_folder(tmp_path / "eleven" / "train", classes=CIFAR10_CLASSES, per_class=2)
    shutil.copytree(tmp_path / "eleven" / "train" / "cat", tmp_path / "eleven" / "train" / "lynx")
    monkeypatch.setenv("COURSE_DATA", str(tmp_path / "eleven"))
    code, _, err, _ = run_main(capsys, "fit", "--config", LENET)
    assert code == 1 and "--model.num_classes 11" in err
    assert "Traceback" not in err, err[-2000:]
    assert not list(course_env.rglob("version_*"))
    with pytest.raises(CourseError, match="--model.num_classes 11"):
        main(["fit", "--config", LENET, "--debug"])  # the same run folder: the failed fit released it


def test_test_folder_is_the_cli_argument_of_test_and_predict_only(course_env, capsys):
    """--test_folder (the CLI's own argument, never the DataModule's) is refused by validate, naming test and
    predict; the DataModule has no such setting."""
    code, _, err, _ = run_main(capsys, "validate", "--config", LENET, "--test_folder", "my_images")
    assert code == 1 and "`test`" in err and "`predict`" in err and "Traceback" not in err
    code, _, err, _ = run_main(capsys, "test", "--config", LENET, "--data.test_folder", "my_images")
    assert code == 2  # a parser error: no such DataModule setting


def test_16_mixed_on_a_cpu_is_an_error_not_a_silent_bf16_run(capsys):
    """--trainer.precision 16-mixed on a CPU stops with the policy's message (Lightning alone would run bf16-mixed)."""
    code, _, err, _ = run_main(capsys, "fit", "--config", LENET, "--trainer.accelerator", "cpu",
                               "--trainer.precision", "16-mixed")
    assert code == 1
    assert "16-mixed" in err and "GPU" in err and "32-true" in err and "Traceback" not in err


def test_precision_the_cpu_has_passes_through():
    """32-true (and its short name 32) pass the policy unchanged on any machine; unset is the policy's choice, the
    default of every entry point; a setting the policy does not cover is Lightning's."""
    from course_lib.base import hardware
    from course_lib.entry.cli import CourseCLI
    from course_lib.training import runs

    assert CourseCLI._checked_precision("32", "cpu") == "32-true"
    policy = hardware.choose_precision()
    assert CourseCLI._checked_precision(None, "auto") == policy
    assert runs.trainer_kwargs()["precision"] in (policy, None)  # None: 16-mixed as the CPU's fp16 plugin
    assert CourseCLI._checked_precision(None, "cpu") == hardware.choose_precision(accelerator="cpu")
    assert CourseCLI._checked_precision("64-true", "cpu") == "64-true"


def test_yaml_syntax_error_names_the_file_and_line(tmp_path, capsys):
    """A broken config names its file and line, before LightningCLI's parser (which names neither file)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  max_epochs: 2\n   devices: [1\n")
    code, _, err, _ = run_main(capsys, "fit", "--config", str(bad))
    assert code == 2 and str(bad) in err and "line 3" in err


def test_a_bug_keeps_its_traceback(monkeypatch):
    """An error that is not a CourseError (here a KeyError from inside a check) propagates unchanged: the CLI prints
    only the course's own errors as a message."""
    from course_lib.base import hardware

    def broken(accelerator, devices):
        raise KeyError("a bug")

    monkeypatch.setattr(hardware, "check_devices", broken)
    with pytest.raises(KeyError, match="a bug"):
        main(["fit", "--config", LENET])


def test_bad_environment_is_a_message_and_debug_still_applies(monkeypatch, capsys):
    """A COURSE_DATA that does not exist (found while the parser is built, before --debug is parsed) prints as one
    message; with --debug it is raised, a MissingPathError (a CourseError and a FileNotFoundError)."""
    monkeypatch.setenv("COURSE_DATA", "/nonexistent/cifar")
    code, _, err, _ = run_main(capsys, "fit", "--config", LENET)
    assert code == 1 and "/nonexistent/cifar" in err and "COURSE_DATA" in err and "Traceback" not in err
    with pytest.raises(FileNotFoundError, match="/nonexistent/cifar") as raised:
        main(["fit", "--config", LENET, "--debug"])
    assert isinstance(raised.value, CourseError)


def test_explicit_backbone_that_contradicts_the_checkpoint_is_an_error(cli, course_env, capsys):
    """--model.backbone simple_cnn with a LeNet checkpoint is refused, naming both (LightningCLI alone silently
    replaces the flag with the checkpoint's hyperparameters); the config's model settings are not flags."""
    code, _, err, _ = run_main(capsys, "test", "--config", LENET, "--model.backbone", "simple_cnn",
                               "--ckpt_path", str(cli["last"]))
    assert code == 1
    assert "--model.backbone simple_cnn contradicts" in err and "backbone=lenet" in err
    code, _, err, _ = run_main(capsys, "test", "--model.backbone", "lenet", "--config", LENET,
                               "--model", "{lr: 0.3}", "--ckpt_path", str(cli["last"]))
    assert code == 1 and "--model.lr 0.3 contradicts" in err and "backbone" not in err


def test_every_keyword_only_setting_is_set_from_yaml_and_from_a_flag(tmp_path, capsys):
    """ImageClassifierModule's and CIFAR10DataModule's keyword-only settings all reach LightningCLI's config: a YAML
    value and a command-line flag each override the default (print_config shows the parsed result)."""
    import inspect

    from course_lib.data.data import CIFAR10DataModule
    from course_lib.training.modules import ImageClassifierModule

    yaml_file = tmp_path / "over.yaml"
    yaml_file.write_text("model:\n  momentum: 0.8\n  warmup_fraction: 0.3\ndata:\n  seed: 7\n  val_fraction: 0.2\n")
    code, out, _, _ = run_main(capsys, "fit", "--config", LENET, "--config", str(yaml_file), "--model.lr", "0.123",
                               "--data.test_fraction", "0.15", "--print_config")
    assert code == 0
    cfg = yaml.safe_load(out)
    for cls, section in ((ImageClassifierModule, "model"), (CIFAR10DataModule, "data")):
        keyword_only = [p.name for p in inspect.signature(cls).parameters.values() if p.kind is p.KEYWORD_ONLY]
        linked = {"classes"} if section == "model" else set()  # model.classes: linked from data.classes on instantiate
        assert len(keyword_only) >= 11 and set(keyword_only) - linked <= set(cfg[section])
    assert (cfg["model"]["momentum"], cfg["model"]["warmup_fraction"], cfg["model"]["lr"]) == (0.8, 0.3, 0.123)
    assert (cfg["data"]["seed"], cfg["data"]["val_fraction"], cfg["data"]["test_fraction"]) == (7, 0.2, 0.15)
