"""`python -m course_lib fit|test` end to end on a tiny folder, run from outside the checkout, COURSE_BUILD in tmp."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cli(tmp_path_factory, tiny_folder):
    """Runs `python -m course_lib <command> --config configs/lenet.yaml <args>` from a folder outside the checkout."""
    out = tmp_path_factory.mktemp("cli")
    (out / "elsewhere").mkdir()
    env = {**os.environ, "COURSE_SIZE": "smoke", "COURSE_DATA": str(tiny_folder),
           "COURSE_DATA_ROOT": str(out / "data"), "COURSE_BUILD": str(out / "build")}

    def run(command: str, *args: str, check: bool = True, **env_extra) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [sys.executable, "-m", "course_lib", command, "--config", str(REPO / "configs/lenet.yaml"), *args],
            cwd=out / "elsewhere", env={**env, **env_extra}, capture_output=True, text=True, timeout=180)
        if check:
            assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        return result

    run.out = out
    run.run_dir = out / "build" / "runs" / "lenet"
    run.fit = run("fit", "--model.num_classes", "3")  # the one training run the tests below share
    return run


def test_fit_writes_checkpoint_and_logs(cli, tiny_folder):
    """fit exits 0 and writes last.ckpt, best.ckpt and the CSV logs under $COURSE_BUILD/runs/lenet, whatever the
    working folder; nothing lands in the working folder."""
    assert (cli.run_dir / "checkpoints" / "last.ckpt").exists() and (cli.run_dir / "checkpoints" / "best.ckpt").exists()
    assert not any((cli.out / "elsewhere").iterdir())
    metrics = next((cli.run_dir / "logs").glob("version_*/metrics.csv")).read_text()
    assert "val_acc" in metrics and "train_loss" in metrics
    saved = yaml.safe_load(next((cli.run_dir / "logs").glob("version_*/config.yaml")).read_text())
    assert saved["trainer"]["max_epochs"] == 1  # COURSE_SIZE=smoke
    assert saved["data"]["subset"] == 2048 and saved["data"]["image_folder"] == str(tiny_folder)


def test_fit_redirected_to_a_file_logs_a_line_per_epoch(cli):
    """With stdout not a terminal (captured here), fit prints one line per epoch and no progress-bar refreshes."""
    log = cli.fit.stdout + cli.fit.stderr
    assert "\r" not in log and len(log.encode()) < 8_000, log[-2000:]
    lines = [line for line in cli.fit.stdout.splitlines() if line.startswith("epoch ")]
    assert len(lines) == 1 and "1/1" in lines[0] and "val_acc" in lines[0] and "train_loss" in lines[0]


def test_log_defaults_keep_the_progress_bar_in_a_terminal():
    """In a terminal the usual progress bar stays; redirected, it is replaced by the per-epoch lines."""
    from course_lib.cli import EpochLines, log_defaults

    assert log_defaults(interactive=True) == {}
    quiet = log_defaults(interactive=False)
    assert quiet["enable_progress_bar"] is False and isinstance(quiet["callbacks"][0], EpochLines)


def test_test_on_foreign_folder_reports_accuracy(cli, tiny_folder):
    """test --ckpt_path last.ckpt --data.test_folder grades the checkpoint and prints test_acc."""
    result = cli("test", "--ckpt_path", str(cli.run_dir / "checkpoints" / "last.ckpt"),
                 "--data.test_folder", str(tiny_folder / "train"))
    assert "test_acc" in result.stdout and "test_loss" in result.stdout


def test_fit_resumes_from_last(cli):
    """fit --ckpt_path last finds last.ckpt in the checkpoint dirpath and restores all states."""
    result = cli("fit", "--ckpt_path", "last")
    log = result.stdout + result.stderr
    assert "Restored all states" in log
    assert str(cli.run_dir / "checkpoints" / "last.ckpt") in log


def test_new_fit_over_an_earlier_run_refuses_and_names_the_remedies(cli):
    """A fresh fit where last.ckpt of an earlier run exists would overwrite it: it stops first, naming the remedies,
    and prints the message alone (no traceback)."""
    result = cli("fit", "--model.num_classes", "3", check=False)
    assert result.returncode == 1
    assert "--ckpt_path last" in result.stderr and "--run_name" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
