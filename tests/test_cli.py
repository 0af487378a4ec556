"""`python -m course_lib fit|test` end to end on a tiny folder, with every output redirected to tmp."""
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
    """Runs `python -m course_lib <args> --config configs/lenet.yaml --config <tmp override>` in the repo root."""
    out = tmp_path_factory.mktemp("cli")
    cfg = yaml.safe_load((REPO / "configs/lenet.yaml").read_text())
    override = {"trainer": {  # the lenet.yaml logger and checkpoint, pointed at tmp (a second --config replaces them)
        "logger": {**cfg["trainer"]["logger"], "init_args": {"save_dir": str(out / "runs"), "name": "logs"}},
        "callbacks": [{**cfg["trainer"]["callbacks"][0],
                       "init_args": {**cfg["trainer"]["callbacks"][0]["init_args"], "dirpath": str(out / "ckpt")}}],
    }}
    (out / "override.yaml").write_text(yaml.safe_dump(override))
    env = {**os.environ, "COURSE_SIZE": "smoke", "COURSE_DATA": str(tiny_folder),
           "COURSE_DATA_ROOT": str(out / "data"), "COURSE_BUILD": str(out / "build")}

    def run(command: str, *args: str) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [sys.executable, "-m", "course_lib", command, "--config", "configs/lenet.yaml",
             "--config", str(out / "override.yaml"), "--trainer.default_root_dir", str(out), *args],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
        assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        return result

    run.out = out
    run.fit = run("fit")  # the one training run the tests below share
    return run


def test_fit_writes_checkpoint_and_logs(cli, tiny_folder):
    """fit exits 0, writes last.ckpt to the configured dirpath and logs val_acc to the CSV logger."""
    assert (cli.out / "ckpt" / "last.ckpt").exists()
    metrics = next((cli.out / "runs" / "logs").glob("version_*/metrics.csv")).read_text()
    assert "val_acc" in metrics and "train_loss" in metrics
    saved = yaml.safe_load(next((cli.out / "runs" / "logs").glob("version_*/config.yaml")).read_text())
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
    result = cli("test", "--ckpt_path", str(cli.out / "ckpt" / "last.ckpt"),
                 "--data.test_folder", str(tiny_folder / "train"))
    assert "test_acc" in result.stdout and "test_loss" in result.stdout


def test_fit_resumes_from_last(cli):
    """fit --ckpt_path last finds last.ckpt in the checkpoint dirpath and restores all states."""
    result = cli("fit", "--ckpt_path", "last")
    log = result.stdout + result.stderr
    assert "Restored all states" in log
    assert str(cli.out / "ckpt" / "last.ckpt") in log
