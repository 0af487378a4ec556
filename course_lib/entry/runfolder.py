"""A CLI run's folder: one run at a time (a lock held for the run's lifetime), checkpoints written atomically,
last.ckpt after every epoch, and checkpoints read with errors that name the file and the remedy."""
from __future__ import annotations

import csv
import errno
import io
import os
import pickle
import shlex
import shutil
import sys
import tempfile
import zipfile
from importlib.util import find_spec
from pathlib import Path

import lightning as L
import torch
from filelock import FileLock, Timeout
from lightning.pytorch.callbacks import BasePredictionWriter, ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.exceptions import SIGTERMException

from ..base import config
from ..base.errors import CourseError, DivergedError, WriteError
from ..base.files import atomic_file
from .divergence import StopOnDivergence

LOCK_NAME = ".run.lock"  # in the run folder; its text names the process that holds it
SPLIT_KEYS = ("seed", "val_fraction", "test_fraction", "subset", "eval_subset")  # what decides the held-out images
DISK_FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))  # the OS errors of a full disk or quota


def writable(folder: Path) -> Path:
    """The folder, created if needed, after a probe write; an OS error names it and the variable that sets it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as err:
        raise config.unwritable(folder, err) from None
    return folder


def launched_rank_zero() -> bool:
    """Whether this process is the job's global rank 0 by its launcher's variables (torchrun sets RANK; Lightning's
    own launcher sets LOCAL_RANK and NODE_RANK): only that process holds the run folder's lock, so the other ranks
    of one DDP job are not refused as a second fit. Read before the Trainer exists, hence from the environment."""
    if "RANK" in os.environ:
        return int(os.environ["RANK"]) == 0
    return int(os.environ.get("LOCAL_RANK", 0)) == 0 and int(os.environ.get("NODE_RANK", 0)) == 0


class RunLock:
    """An exclusive lock on a run folder (filelock's FileLock: flock, which the OS drops even on SIGKILL), held while
    the process lives; a second run of the same folder is refused with the holder's pid and command, which the
    holder writes into the lock file."""

    def __init__(self, folder: Path):
        self.folder, self._lock = Path(folder), None

    def acquire(self) -> RunLock:
        path = self.folder / LOCK_NAME
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            lock = FileLock(path, timeout=0)
            lock.acquire()
        except Timeout:
            holder = path.read_text().strip() if path.is_file() else ""
            raise CourseError(f"{self.folder} is in use by a running fit: {holder or 'another process (starting up)'}"
                              f". Wait for it to end or stop it, or start this one with --run_name <another name>."
                              ) from None
        except OSError as err:
            raise config.unwritable(self.folder, err) from None
        command = [sys.executable, "-m", "course_lib", *sys.argv[1:]] if sys.argv[0].endswith("__main__.py") \
            else sys.argv
        path.write_text(f"pid {os.getpid()}, command {shlex.join(command)}\n")  # the lock is the inode's, kept
        self._lock = lock
        return self

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None


class AtomicCheckpointIO(TorchCheckpointIO):
    """torch.save through files.atomic_file (a temporary file in the checkpoint's own folder, flushed, renamed): a
    process killed at any instant leaves the previous checkpoint or the new one, never half a file. (Lightning's own
    save goes through a temporary file in the system's temp folder, which is a copy, not a rename, across disks.)"""

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        """Write `checkpoint` to `path` atomically; a write the OS or torch's zip writer refuses (a full disk: torch
        reports it as '[enforce fail at inline_container.cc] unexpected pos') is one WriteError naming the file, the
        size needed and COURSE_BUILD; any other RuntimeError of torch.save keeps its traceback."""
        path, opened = Path(path), False
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_file(path, "wb") as f:
                opened = True  # from here on an OSError is the write's, not the folder's
                torch.save(checkpoint, f)
        except (OSError, RuntimeError) as err:
            if isinstance(err, OSError) and not opened:
                raise (not_written(path, err) if err.errno in DISK_FULL else config.unwritable(path.parent, err)) \
                    from None
            if isinstance(err, OSError) or "inline_container" in str(err):
                raise not_written(path, err, tensor_bytes(checkpoint), path.parent / "last.ckpt") from None
            raise


def tensor_bytes(obj) -> int:
    """The bytes of the tensors in a nested dict/list/tuple: what a checkpoint of it needs at least."""
    if isinstance(obj, torch.Tensor):
        return obj.nbytes
    values = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    return sum(tensor_bytes(v) for v in values)


def size_text(n: int) -> str:
    """Bytes in words: kB below a megabyte, else MB (or GB) with one decimal."""
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{max(1, round(n / 1e3))} kB"


def not_written(path: Path, err: BaseException, needed: int = 0, last: Path | None = None) -> WriteError:
    """The one message for an output the disk refused: the file, the reason, the space it needs (at least its earlier
    version's size) and the space free, what is kept (the run's `last` checkpoint), and the remedies (free space, or
    COURSE_BUILD elsewhere)."""
    path, reason = Path(path), (getattr(err, "strerror", None) or str(err).splitlines()[0])[:160]
    needed = max(needed, path.stat().st_size if path.is_file() else 0)
    there = next((p for p in (path, *path.parents) if p.is_dir()), Path("."))
    try:
        free = f"{size_text(shutil.disk_usage(there).free)} free there"
    except OSError:
        free = "its free space unknown"
    kept = f" The previous {path.name} is kept whole." if path.is_file() else ""
    resume = (f" Nothing is lost: resume with --ckpt_path last once there is room (with {config.BUILD_ENV} elsewhere, "
              f"move {config.build_dir().resolve() / 'runs'} there first)." if last and last.is_file() else "")
    return WriteError(f"Cannot write {path} ({type(err).__name__}: {reason}); "
                      f"{f'it needs about {size_text(needed)}, ' if needed else ''}{free}.{kept} Free space on that "
                      f"disk, or set {config.BUILD_ENV} to a folder on a disk with room.{resume}")


def as_course_error(err: BaseException, folder: Path | None) -> CourseError | None:
    """The course's message for a failed run: the CourseError that `err` is or was raised while handling (Lightning's
    cleanup after an error can fail the same way), else a full disk's OSError on an output (a file in COURSE_BUILD,
    or one it does not name) as not_written, else None (a bug, or another folder's error: its traceback names it)."""
    chain = []
    while err is not None and err not in chain:
        chain.append(err)
        err = err.__context__
    full = [e for e in chain if isinstance(e, OSError) and e.errno in DISK_FULL
            and (not e.filename or under(e.filename, config.build_dir()))]
    if not any(isinstance(e, CourseError) for e in chain) and full:
        last = Path(folder) / "checkpoints" / "last.ckpt" if folder else None
        return not_written(Path(full[0].filename or folder or "."), full[0], last=last)
    return next((e for e in reversed(chain) if isinstance(e, CourseError)), None)  # the first one raised


class PredictionCSV(BasePredictionWriter):
    """predict's output: one row per image (file, predicted class, confidence) in <run folder>/predictions.csv,
    whose path it prints."""

    def __init__(self, path: Path):
        super().__init__(write_interval="epoch")
        self.path = Path(path)

    def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices) -> None:
        probs = torch.cat([p.float().cpu() for p in predictions])  # (N, classes) softmax outputs
        confidence, index = probs.max(dim=1)
        dm = trainer.datamodule
        names = dm.test_names() if hasattr(dm, "test_names") else [str(i) for i in range(len(probs))]
        classes = list(pl_module.hparams.get("classes") or getattr(dm, "classes", None) or range(probs.shape[1]))
        rows = io.StringIO()
        out = csv.writer(rows)
        out.writerow(["file", "predicted_class", "confidence"])
        out.writerows([name, classes[i], f"{c:.4f}"] for name, i, c in zip(names, index.tolist(),
                                                                            confidence.tolist()))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        config.write_atomically(self.path, rows.getvalue())
        print(f"Predictions for {len(probs)} images written to {self.path}", flush=True)


class NoEmptyRunFolders(L.Callback):
    """A run that fails before its first training step leaves no empty logs/version_N folder behind."""

    def on_exception(self, trainer, pl_module, exception) -> None:
        if isinstance(exception, SIGTERMException) or trainer.global_step > 0:
            return  # an interrupted run's logs stay, next to its last.ckpt
        for logger in trainer.loggers:
            folder = Path(logger.log_dir) if getattr(logger, "log_dir", None) else None
            if folder and folder.is_dir() and not (folder / "metrics.csv").exists():
                shutil.rmtree(folder, ignore_errors=True)


def under(path, folder: Path) -> bool:
    """Whether a path (an OSError's filename, maybe None) lies in folder."""
    return bool(path) and Path(folder).resolve() in (Path(path).resolve(), *Path(path).resolve().parents)


def remove_stale_temporaries(folder: Path) -> None:
    """Delete half-written checkpoints (.<name>.ckpt.*.tmp) that a killed run left; call only under the run lock."""
    for tmp in Path(folder).glob(".*.ckpt.*.tmp"):
        tmp.unlink(missing_ok=True)


class LastCheckpoint(ModelCheckpoint):
    """ModelCheckpoint for last.ckpt, which also saves when a run stops early (save_on_exception), except from weights
    that are no longer finite (a diverged run) and after a write the disk refused (it would fail again): then the
    previous last.ckpt stays."""

    @property
    def state_key(self) -> str:
        """ModelCheckpoint's own key, so that checkpoints written by either class restore this one's state."""
        return super().state_key.replace(type(self).__qualname__, ModelCheckpoint.__qualname__, 1)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if isinstance(exception, (DivergedError, WriteError)) or getattr(exception, "errno", None) in DISK_FULL:
            return
        finite = [torch.isfinite(p).all() for p in pl_module.parameters()]
        if finite and not bool(torch.stack(finite).all()):  # one host read, once
            print(f"note: the weights are no longer finite (the loss diverged): {self.dirpath}/last.ckpt keeps the "
                  f"last finished epoch.", file=sys.stderr, flush=True)
            return
        super().on_exception(trainer, pl_module, exception)


def run_checkpoints(folder: Path) -> list[ModelCheckpoint]:
    """The run's checkpoints: best.ckpt at the highest val_acc, and last.ckpt after every epoch (the top-1 of no
    monitor, i.e. the newest, replaced each epoch) and on any stop (SIGINT, SIGTERM, an exception; LastCheckpoint).

    Lightning's save_last=True with save_top_k=0 writes last.ckpt only in a step where a top-k checkpoint was saved,
    i.e. at the very end or on an exception: a SIGKILL mid-run left none. So last.ckpt is the top-k file itself."""
    return [ModelCheckpoint(dirpath=folder, filename="best", monitor="val_acc", mode="max",
                            enable_version_counter=False),
            LastCheckpoint(dirpath=folder, filename="last", monitor=None, save_top_k=1, every_n_epochs=1,
                           save_on_exception=True, enable_version_counter=False)]


def run_callbacks(subcommand: str, folder: Path) -> list[L.Callback]:
    """A CLI run's callbacks: its checkpoints, no empty log folder on a failure, a fit stopped when its loss diverges,
    and predict's CSV."""
    callbacks = [*run_checkpoints(folder / "checkpoints"), NoEmptyRunFolders()]
    if subcommand == "fit":
        callbacks.append(StopOnDivergence())
    if subcommand == "predict":
        callbacks.append(PredictionCSV(folder / "predictions.csv"))
    return callbacks


def logger_class() -> str:
    """The CLI's logger: TensorBoard's where the tensorboard package is installed (its curves: tensorboard --logdir
    <run folder>/logs), else CSV (metrics.csv); either writes <run folder>/logs/version_N/."""
    name = "TensorBoardLogger" if find_spec("tensorboard") else "CSVLogger"
    return f"lightning.pytorch.loggers.{name}"


def read_checkpoint(path: str | Path, flag: str = "--ckpt_path") -> dict:
    """A checkpoint's contents through torch.load(weights_only=True); a missing, truncated, foreign or unsafe file is
    one error naming the file, the flag that gave it and the remedy."""
    path = Path(path)
    if not path.is_file():
        raise CourseError(f"{flag} {path}: no such file. Pass the path of a .ckpt written by fit (in "
                          f"$COURSE_BUILD/runs/<run_name>/checkpoints/), or 'last' to resume this run.")
    try:
        ckpt = torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as err:
        raise CourseError(f"{flag} {path} holds Python objects beyond tensors and plain values, which this course "
                          f"never loads (torch.load(weights_only=True) refused: {str(err).splitlines()[0][:160]}). "
                          f"Use a checkpoint written by this course's fit; never load one you do not trust with "
                          f"weights_only=False.") from None
    except (RuntimeError, EOFError, OSError, zipfile.BadZipFile) as err:
        raise CourseError(f"{flag} {path} cannot be read: it is cut short or not a checkpoint "
                          f"({type(err).__name__}: {str(err).splitlines()[0][:160]}). Use another checkpoint (e.g. "
                          f"best.ckpt beside it), or start the run afresh.") from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise CourseError(f"{flag} {path} is a torch file but not a Lightning checkpoint (no state_dict). Pass a "
                          f".ckpt written by fit.")
    return ckpt
