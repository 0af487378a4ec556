"""Runs that survive a hard kill and never grade wrong (issue 30): real `python -m course_lib fit` processes killed
with SIGKILL, raced against each other and interrupted while exiting; in-process CLI calls for the error messages."""
from __future__ import annotations

import contextlib
import csv
import io
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import run_main

from course_lib.data.data import CIFAR10DataModule
from course_lib.entry.cli import main

REPO = Path(__file__).resolve().parents[1]
LENET = str(REPO / "configs" / "lenet.yaml")
EPOCHS, BATCH, STEPS = 3, 8, 6  # the tiny folder's 48 training images: 6 steps per epoch
MID_EPOCH_2 = 8  # two batches into the second epoch


def fit_env(build: Path, data_root: Path, folder: Path) -> dict[str, str]:
    """The COURSE_* settings of the fits below: smoke size, the tiny folder, outputs in build."""
    return {"COURSE_SIZE": "smoke", "COURSE_DATA": str(folder), "COURSE_DATA_ROOT": str(data_root),
            "COURSE_BUILD": str(build)}


def fit_args(*extra: str) -> list[str]:
    """`fit` of LeNet for 3 epochs of 6 steps, then `extra`."""
    return ["fit", "--config", LENET, "--model.num_classes", "3", "--trainer.max_epochs", str(EPOCHS),
            "--data.batch_size", str(BATCH), *extra]


def launch(build: Path, data_root: Path, folder: Path, *extra: str) -> subprocess.Popen:
    """Start `python -m course_lib fit` (LeNet, tiny folder, 3 epochs) with its outputs in build."""
    env = {**os.environ, **fit_env(build, data_root, folder), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    build.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "course_lib", *fit_args(*extra)], cwd=build, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def fit_here(build: Path, data_root: Path, folder: Path) -> tuple[int, str, str]:
    """launch()'s fit through main() in this process (no interpreter to start): its exit code and output."""
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as env, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        for name, value in fit_env(build, data_root, folder).items():
            env.setenv(name, value)
        try:
            main(fit_args())
            code = 0
        except SystemExit as stop:
            code = stop.code
    return code, out.getvalue(), err.getvalue()


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=240)
    return proc.returncode, out, err


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.exists(), f"{path} never appeared (exit {proc.poll()})"


def pause(step: int, marker: Path) -> list[str]:
    """Flags that pause a fit after `step` until a signal arrives (up to 5 minutes: the runs wait for each other)."""
    return ["--trainer.callbacks+=cli_callbacks.PauseAtStep", f"--trainer.callbacks.step={step}",
            f"--trainer.callbacks.marker={marker}", "--trainer.callbacks.seconds=300"]


def ckpt_dir(build: Path) -> Path:
    return build / "runs" / "lenet" / "checkpoints"


def load(path: Path) -> dict:
    return torch.load(path, weights_only=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_folder):
    """Three fits at once (one thread each): one killed with SIGKILL mid-epoch 2, one interrupted by Ctrl+C and again
    while exiting, one paused mid-epoch 2 while a second fit of its folder is tried (in this process: the lock is the
    OS's, across processes) and then stopped by SIGTERM; then the killed and the stopped runs resumed."""
    root = tmp_path_factory.mktemp("robust")
    data, builds = root / "data", {k: root / k / "build" for k in ("killed", "held", "exiting")}
    marks = {k: root / f"{k}.paused" for k in builds}
    procs = {"killed": launch(builds["killed"], data, tiny_folder, *pause(MID_EPOCH_2, marks["killed"])),
             "held": launch(builds["held"], data, tiny_folder, *pause(MID_EPOCH_2, marks["held"])),
             "exiting": launch(builds["exiting"], data, tiny_folder, *pause(2, marks["exiting"]),
                               "--trainer.callbacks+=cli_callbacks.SlowExit",
                               f"--trainer.callbacks.marker={root / 'exiting.atexit'}")}
    out = {}
    wait_for(marks["killed"], procs["killed"])
    procs["killed"].kill()  # SIGKILL: no handler runs
    out["killed"] = finish(procs["killed"])
    out["after_kill"] = sorted(p.name for p in ckpt_dir(builds["killed"]).iterdir())
    out["killed_last"] = load(ckpt_dir(builds["killed"]) / "last.ckpt") if "last.ckpt" in out["after_kill"] else {}
    wait_for(marks["exiting"], procs["exiting"])
    procs["exiting"].send_signal(signal.SIGINT)
    wait_for(root / "exiting.atexit", procs["exiting"])  # now in its exit handlers
    procs["exiting"].send_signal(signal.SIGINT)
    out["exiting"] = finish(procs["exiting"])
    wait_for(marks["held"], procs["held"])
    out["second"] = fit_here(builds["held"], data, tiny_folder)  # same run folder, while the first runs
    out["held_pid"] = procs["held"].pid
    procs["held"].send_signal(signal.SIGTERM)
    out["held"] = finish(procs["held"])
    out["held_step"] = load(ckpt_dir(builds["held"]) / "last.ckpt")["global_step"]
    resumed = {k: launch(builds[k], data, tiny_folder, "--ckpt_path", "last") for k in ("killed", "held")}
    out.update({f"{k}_resumed": finish(p) for k, p in resumed.items()})
    return {"builds": builds, "out": out, "data": data}


def test_sigkill_in_epoch_2_leaves_last_ckpt_of_epoch_1_and_resume_continues(runs):
    """last.ckpt is written after every epoch: a SIGKILL two batches into epoch 2 leaves the end of epoch 1 (and no
    half-written file); `fit --ckpt_path last` continues from there to the end of epoch 3."""
    out = runs["out"]
    assert out["killed"][0] == -signal.SIGKILL
    assert "last.ckpt" in out["after_kill"], out["after_kill"]
    assert not [n for n in out["after_kill"] if n.endswith(".tmp")]
    assert (out["killed_last"]["epoch"], out["killed_last"]["global_step"]) == (0, STEPS)
    rc, stdout, stderr = out["killed_resumed"]
    assert rc == 0, stderr[-3000:]
    assert "Restored all states" in stdout + stderr
    lines = [line.split(" |")[0] for line in stdout.splitlines() if line.startswith("epoch ")]
    assert lines == ["epoch 2/3", "epoch 3/3"], stdout[-2000:]
    assert load(ckpt_dir(runs["builds"]["killed"]) / "last.ckpt")["global_step"] == EPOCHS * STEPS


def test_second_fit_of_a_running_folder_is_refused_naming_the_first(runs):
    """While a fit runs, a second fit of the same run folder exits 1 naming the running one's pid and command, and
    touches none of its files; the first then stops and resumes normally."""
    rc, _, stderr = runs["out"]["second"]
    assert rc == 1, stderr[-3000:]
    assert f"pid {runs['out']['held_pid']}" in stderr and "in use" in stderr and "--run_name" in stderr
    assert "Traceback" not in stderr
    rc, _, stderr = runs["out"]["held"]
    assert rc == 143 and runs["out"]["held_step"] == MID_EPOCH_2


def test_resume_line_names_this_interpreter(runs):
    """The printed resume command starts with the interpreter that ran the fit, not a bare `python`."""
    stderr = runs["out"]["held"][2]
    assert f"{shlex.quote(sys.executable)} -m course_lib fit" in stderr and "--ckpt_path last" in stderr


def test_mid_epoch_resume_prints_that_epoch_saying_what_its_train_metrics_cover(runs):
    """A run resumed two batches into epoch 2 prints epoch 2's line, marked as covering batches 3 on."""
    rc, stdout, stderr = runs["out"]["held_resumed"]
    assert rc == 0, stderr[-3000:]
    lines = [line for line in stdout.splitlines() if line.startswith("epoch ")]
    assert [line.split(" |")[0] for line in lines] == ["epoch 2/3", "epoch 3/3"], stdout[-2000:]
    assert "train metrics from batch 3 on" in lines[0] and "resumed" not in lines[1]


def test_ctrl_c_while_exiting_prints_no_atexit_traceback(runs):
    """A second Ctrl+C while the stopped run's exit handlers run ends it at once, with exit status 130 and no
    'Exception ignored in atexit callback' traceback."""
    rc, _, stderr = runs["out"]["exiting"]
    assert rc == 130, stderr[-3000:]
    assert "Stopped by SIGINT" in stderr
    assert "Exception ignored" not in stderr and "Traceback" not in stderr, stderr[-2000:]


@pytest.fixture
def trained(runs, monkeypatch):
    """The resumed run's last.ckpt, with this process's COURSE_* pointing at its data and build folders."""
    build = runs["builds"]["killed"]
    monkeypatch.setenv("COURSE_SIZE", "smoke")
    monkeypatch.setenv("COURSE_BUILD", str(build))
    monkeypatch.setenv("COURSE_DATA_ROOT", str(runs["data"]))
    return ckpt_dir(build) / "last.ckpt"


def test_predict_writes_a_csv_in_the_run_folder_and_says_where(trained, tiny_folder, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_DATA", str(tiny_folder))
    code, out, err = run_main(capsys, "predict", "--config", LENET, "--ckpt_path", str(trained),
                              "--test_folder", str(tiny_folder / "train"))
    assert code == 0, err[-2000:]
    path = trained.parents[1] / "predictions.csv"
    assert str(path) in out
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == 60 and set(rows[0]) == {"file", "predicted_class", "confidence"}
    assert all(Path(r["file"]).is_file() and r["predicted_class"] in ("airplane", "cat", "ship") for r in rows)
    assert all(0 < float(r["confidence"]) <= 1 for r in rows)
    assert Path(rows[0]["file"]).parent.name == "airplane" and Path(rows[-1]["file"]).parent.name == "ship"


def test_test_rebuilds_the_split_from_the_checkpoint_and_refuses_a_contradiction(trained, tiny_folder, tmp_path,
                                                                                 monkeypatch, capsys):
    """A model fitted with seed 1 is tested on seed 1's held-out images without being told; --data.seed 2 is
    refused, naming the flag and the checkpoint's value."""
    monkeypatch.setenv("COURSE_DATA", str(tiny_folder))
    ckpt = load(trained)
    ckpt["datamodule_hyper_parameters"].update(seed=1, val_fraction=0.2)
    seeded = tmp_path / "seed1.ckpt"
    torch.save(ckpt, seeded)
    cli = main(["test", "--config", LENET, "--ckpt_path", str(seeded)])
    assert (cli.datamodule.hparams.seed, cli.datamodule.hparams.val_fraction) == (1, 0.2)
    assert type(cli.trainer.strategy.checkpoint_io).__name__ == "AtomicCheckpointIO"  # what fit saves through
    capsys.readouterr()
    code, _, err = run_main(capsys, "test", "--config", LENET, "--ckpt_path", str(seeded), "--data.seed", "2")
    assert code == 1 and "--data.seed 2 contradicts" in err and "seed=1" in err and "Traceback" not in err


def test_split_folder_missing_a_class_is_labelled_by_name(make_folder, tmp_path):
    """A test/ split that lacks airplane keeps cat and ship at the training classes' indices (not shifted to 0, 1);
    a test/ class that train/ lacks is refused."""
    make_folder(tmp_path / "d" / "train", classes=("airplane", "cat", "ship"), per_class=4)
    make_folder(tmp_path / "d" / "test", classes=("cat", "ship"), per_class=3)
    dm = CIFAR10DataModule(image_folder=str(tmp_path / "d"), data_dir=str(tmp_path / "cache"))
    dm.setup("test")
    assert dm.test_set.labels.tolist() == [1] * 3 + [2] * 3
    assert [Path(n).parent.name for n in dm.test_names()] == ["cat"] * 3 + ["ship"] * 3
    make_folder(tmp_path / "e" / "train", classes=("cat", "ship"), per_class=4)
    make_folder(tmp_path / "e" / "test", classes=("airplane", "cat"), per_class=2)
    with pytest.raises(ValueError, match=r"classes \['airplane'\] that its train/ lacks"):
        CIFAR10DataModule(image_folder=str(tmp_path / "e"), data_dir=str(tmp_path / "cache")).setup("test")


def test_flags_before_config_still_override_it(capsys):
    code, out, _ = run_main(capsys, "fit", "--data.batch_size", "8", "--model.lr", "0.001", "--config", LENET,
                            "--print_config")
    cfg = yaml.safe_load(out)
    assert code == 0 and (cfg["data"]["batch_size"], cfg["model"]["lr"]) == (8, 0.001)


@pytest.mark.parametrize("size", ["0", "-1"])
def test_batch_size_below_one_is_one_clear_error(size, tiny_folder, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_DATA", str(tiny_folder))
    code, _, err = run_main(capsys, "fit", "--config", LENET, "--data.batch_size", size, "--run_name", "bs")
    assert code == 1 and f"--data.batch_size {size}" in err and "Traceback" not in err


class Payload:
    """A pickled object whose unpickling would write a file: weights_only=True must refuse it, unrun."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "executed"))


def test_truncated_and_unsafe_checkpoints_are_named_with_a_remedy(trained, tmp_path, capsys):
    truncated = tmp_path / "cut.ckpt"
    truncated.write_bytes(trained.read_bytes()[:20_000])
    code, _, err = run_main(capsys, "test", "--config", LENET, "--ckpt_path", str(truncated))
    assert code == 1 and str(truncated) in err and "cut short" in err and "Traceback" not in err
    crafted, marker = tmp_path / "crafted.ckpt", tmp_path / "executed"
    torch.save({"state_dict": {}, "x": Payload(marker)}, crafted)
    code, _, err = run_main(capsys, "test", "--config", LENET, "--ckpt_path", str(crafted))
    assert code == 1 and str(crafted) in err and "weights_only" in err and "Traceback" not in err
    assert not marker.exists()


def test_course_data_naming_a_non_tensor_pt_file_is_one_clear_error(tmp_path, monkeypatch, capsys):
    """A .pt that is not the course's tensor file (a list; a pickled object) names itself and COURSE_DATA, and never
    suggests weights_only=False."""
    for name, obj in (("list.pt", [1, 2, 3]), ("object.pt", Payload(tmp_path / "executed"))):
        torch.save(obj, tmp_path / name)
        monkeypatch.setenv("COURSE_DATA", str(tmp_path / name))
        code, _, err = run_main(capsys, "fit", "--config", LENET, "--run_name", f"pt-{name}")
        assert code == 1 and str(tmp_path / name) in err and "COURSE_DATA" in err, err[-2000:]
        assert "weights_only=False" not in err and "Traceback" not in err
    assert not (tmp_path / "executed").exists()


@pytest.mark.parametrize("command", ["fit", "test"])
def test_unwritable_output_folder_names_it_and_course_build(command, trained, tiny_folder, tmp_path, monkeypatch,
                                                            capsys):
    """A build folder that cannot be created (a file in the way; root ignores permission bits) is one message naming
    the folder and COURSE_BUILD."""
    (tmp_path / "blocker").write_text("a file, not a folder")
    monkeypatch.setenv("COURSE_BUILD", str(tmp_path / "blocker" / "build"))
    monkeypatch.setenv("COURSE_DATA", str(tiny_folder))
    args = ["--ckpt_path", str(trained)] if command == "test" else []
    code, _, err = run_main(capsys, command, "--config", LENET, *args)
    assert code == 1 and str(tmp_path / "blocker") in err and "COURSE_BUILD" in err and "Traceback" not in err


def test_fit_from_another_runs_checkpoint_is_refused_before_writing(trained, tiny_folder, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_DATA", str(tiny_folder))
    code, _, err = run_main(capsys, "fit", "--config", LENET, "--run_name", "other", "--ckpt_path", str(trained))
    assert code == 1 and "another run" in err and "Traceback" not in err
    assert not (trained.parents[2] / "other" / "checkpoints").exists()


def test_resume_with_no_last_ckpt_is_refused(trained, tiny_folder, monkeypatch, capsys):
    """`--ckpt_path last` where the run has no last.ckpt stops with a message (Lightning alone warns and trains
    from step 0, exit 0)."""
    monkeypatch.setenv("COURSE_DATA", str(tiny_folder))
    code, _, err = run_main(capsys, "fit", "--config", LENET, "--run_name", "never", "--ckpt_path", "last")
    assert code == 1 and "no " in err and "last.ckpt to resume" in err and "Traceback" not in err


def test_atomic_checkpoint_write_keeps_the_old_file_when_interrupted(tmp_path, monkeypatch):
    """A save that dies mid-write leaves the previous checkpoint whole and no temporary file; a save that completes
    replaces it through a temporary file in the same folder."""
    from course_lib.entry.runfolder import AtomicCheckpointIO

    io, path = AtomicCheckpointIO(), tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1}, path)
    replaced = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (replaced.append(Path(src).parent), real_replace(src, dst)))
    io.save_checkpoint({"step": 2}, path)
    assert replaced == [tmp_path] and load(path) == {"step": 2}

    def dies(obj, f):
        f.write(b"half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", dies)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"step": 3}, path)
    assert load(path) == {"step": 2} and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
