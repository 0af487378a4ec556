"""`python -m course_lib fit|validate|test|predict`: LightningCLI over the course's module and data, sized by
COURSE_SIZE, with its outputs in $COURSE_BUILD/runs/<run_name> and runs that an interrupt never loses."""
from __future__ import annotations

import os
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path

import lightning as L
from jsonargparse import Namespace, get_loader
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities.exceptions import SIGTERMException

from . import config, hardware, runs
from .data import CIFAR10DataModule
from .modules import ImageClassifierModule

DEBUG_ENV = "COURSE_DEBUG"  # set to 1 (or pass --debug) for the full traceback of the course's own errors
PACKAGE = Path(__file__).resolve().parent
PRECISION_ALIASES = {"16": "16-mixed", "bf16": "bf16-mixed", "32": "32-true"}  # Lightning's short names


class EpochLines(L.Callback):
    """One line per epoch (time and logged metrics) instead of a progress bar, for logs written to a file."""

    _start: float | None = None

    def _print_finished_epoch(self, trainer) -> None:
        """Print the epoch that just ended; its train metrics exist only once the module's epoch-end hook ran."""
        if self._start is not None:
            metrics = " | ".join(f"{k} {v.item():.4g}" for k, v in sorted(trainer.callback_metrics.items()))
            print(f"epoch {trainer.current_epoch}/{trainer.max_epochs} | {time.perf_counter() - self._start:.1f} s "
                  f"with validation | {metrics}", flush=True)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._print_finished_epoch(trainer)  # current_epoch already counts the finished one
        self._start = time.perf_counter()

    def on_train_end(self, trainer, pl_module) -> None:
        self._print_finished_epoch(trainer)
        self._start = None


class StopAtStepEnd(L.Callback):
    """Ctrl+C (SIGINT) ends a fit the way Lightning ends one on SIGTERM: after the step in progress, so that last.ckpt
    holds a state that resumes exactly. A second Ctrl+C stops at once. Records which signal stopped the run."""

    def __init__(self):
        self.signum: int | None = None  # the signal that stopped the run, once one did
        self.stopped_at: str = ""  # where, e.g. "epoch 2/3, step 17"
        self._previous = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.signum = None
        self._previous = signal.signal(signal.SIGINT, self._on_sigint)  # Lightning already handles SIGTERM

    def _on_sigint(self, signum, frame) -> None:
        if self.signum is not None:  # pressed twice: the user wants out now
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):  # Lightning's handler absent (Windows)
            raise KeyboardInterrupt
        self.signum = signum
        print("\nCtrl+C: stopping after this step and saving last.ckpt (press Ctrl+C again to stop at once) ...",
              file=sys.stderr, flush=True)
        signal.raise_signal(signal.SIGTERM)  # Lightning's own graceful stop at the end of the step

    def on_exception(self, trainer, pl_module, exception) -> None:
        if isinstance(exception, SIGTERMException):
            self.signum = self.signum or signal.SIGTERM
            self.stopped_at = f"epoch {trainer.current_epoch + 1}/{trainer.max_epochs}, step {trainer.global_step}"
        self._restore()

    def on_train_end(self, trainer, pl_module) -> None:
        self._restore()

    def _restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None


class NoEmptyRunFolders(L.Callback):
    """A run that fails before its first training step leaves no empty logs/version_N folder behind."""

    def on_exception(self, trainer, pl_module, exception) -> None:
        if isinstance(exception, SIGTERMException) or trainer.global_step > 0:
            return  # an interrupted run's logs stay, next to its last.ckpt
        for logger in trainer.loggers:
            folder = Path(logger.log_dir) if getattr(logger, "log_dir", None) else None
            if folder and folder.is_dir() and not (folder / "metrics.csv").exists():
                shutil.rmtree(folder, ignore_errors=True)


def run_checkpoints(folder: Path) -> list[ModelCheckpoint]:
    """The run's checkpoints: best.ckpt at the highest val_acc, and last.ckpt after every epoch and on any interrupt
    (SIGINT, SIGTERM, an exception), whatever the monitor; `--ckpt_path last` resumes from it."""
    return [ModelCheckpoint(dirpath=folder, filename="best", monitor="val_acc", mode="max",
                            enable_version_counter=False),
            ModelCheckpoint(dirpath=folder, filename="last", save_top_k=0, save_last=True, save_on_exception=True,
                            enable_version_counter=False)]


def log_defaults(interactive: bool) -> dict:
    """Trainer defaults for the output: the progress bar in a terminal, one line per epoch when redirected."""
    return {} if interactive else {"enable_progress_bar": False, "callbacks": [EpochLines()]}


class CourseError(Exception):
    """Bad input to the CLI, with its remedy in the message."""


class CourseCLI(LightningCLI):
    """LightningCLI whose defaults follow the run-size switch and the data source; flags and configs override them.
    Outputs (checkpoints, logs) go to $COURSE_BUILD/runs/<run_name>, from any working folder."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument("--run_name", type=str, default="run",
                            help="outputs go to $COURSE_BUILD/runs/<run_name> (default build/ in the checkout)")
        parser.set_defaults(runs.cli_defaults())

    def parse_arguments(self, parser, args) -> None:
        """Parse; `--ckpt_path last` becomes the run's last.ckpt where it exists (so the model is built from the
        checkpoint's settings, as for a file path), and the model flags given explicitly are kept for a check."""
        super().parse_arguments(parser, args)
        cfg = self.config[self.config.subcommand] if self.config.get("subcommand") else self.config
        last = config.build_dir().resolve() / "runs" / cfg.run_name / "checkpoints" / "last.ckpt"
        if cfg.get("ckpt_path") == "last" and last.is_file():
            cfg.ckpt_path = str(last)
        argv = sys.argv[1:] if args is None else list(args)
        keys = {a[len("--model."):].split("=")[0] for a in argv if a.startswith("--model.")}
        self._explicit_model = {k: cfg.model.get(k) for k in keys if k in cfg.model}

    def _check_explicit_model_flags(self, cfg) -> None:
        """A checkpoint's settings replace the config's; an explicit --model flag that contradicts them is an error
        (the checkpoint's weights fit only its own model), not silently dropped."""
        if not cfg.get("ckpt_path"):
            return
        for key, given in getattr(self, "_explicit_model", {}).items():
            if cfg.model.get(key) != given:
                raise CourseError(f"--model.{key} {given} contradicts the checkpoint {cfg.ckpt_path}, whose model has "
                                  f"{key}={cfg.model.get(key)} (its weights fit only that model). Drop "
                                  f"--model.{key}, or train a new model with it (fit without --ckpt_path).")

    @staticmethod
    def _checked_precision(precision, accelerator):
        """An explicit precision goes through the course's policy (hardware.choose_precision): one this hardware lacks
        is an error naming the alternative, never Lightning's silent fallback (16-mixed on a CPU runs bf16)."""
        name = PRECISION_ALIASES.get(str(precision), str(precision))
        if precision is None or name not in hardware.PRECISIONS:
            return precision  # Lightning's default (32-true), or a setting the policy does not cover (64-true, ...)
        info = hardware.facts()
        if str(accelerator).lower() == "cpu":
            info = {**info, "gpu": None}  # a CPU run on a GPU machine follows the CPU's rules
        return hardware.choose_precision(name, info)

    def before_instantiate_classes(self) -> None:
        """Check the devices and precision against this machine, and point the outputs at the run folder."""
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        trainer = cfg.trainer
        hardware.check_devices(trainer.accelerator, trainer.devices)
        trainer.precision = self._checked_precision(trainer.precision, trainer.accelerator)
        self._check_explicit_model_flags(cfg)
        if self.subcommand in ("test", "validate", "predict") and cfg.data.get("test_folder") and not cfg.model.classes:
            raise CourseError(f"{cfg.get('ckpt_path') or 'This model'} records no class names, so the folders of "
                              f"{cfg.data.test_folder} cannot be mapped to its outputs. Name them in the order the "
                              f"model was trained on, e.g. --model.classes '[airplane, cat, ship]', or pass a "
                              f"checkpoint written by this course's fit (it records them).")
        run_dir = config.build_dir().resolve() / "runs" / cfg.run_name
        if trainer.default_root_dir is None:
            trainer.default_root_dir = str(run_dir)
        if trainer.logger in (None, True):
            trainer.logger = Namespace(class_path="lightning.pytorch.loggers.CSVLogger",
                                       init_args=Namespace(save_dir=str(run_dir), name="logs"))
        ckpt_dir = run_dir / "checkpoints"
        if self.subcommand == "fit" and cfg.ckpt_path is None and (ckpt_dir / "last.ckpt").exists():
            raise CourseError(f"{ckpt_dir / 'last.ckpt'} holds an earlier run, which a new fit would overwrite. "
                              f"Resume it with --ckpt_path last, start a new run with --run_name <another name>, "
                              f"or delete {ckpt_dir} first.")
        callbacks = self.trainer_defaults.setdefault("callbacks", [])
        callbacks += [*run_checkpoints(ckpt_dir), NoEmptyRunFolders()]


def _strip_debug(args: list[str] | None) -> tuple[list[str] | None, bool]:
    """Remove --debug from the arguments (the parser does not know it); whether it or COURSE_DEBUG asks for it."""
    argv = sys.argv[1:] if args is None else args
    debug = "--debug" in argv or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    if args is None:
        sys.argv[1:] = [a for a in argv if a != "--debug"]
        return None, debug
    return [a for a in args if a != "--debug"], debug


def _course_error(err: BaseException) -> bool:
    """Whether the course raised this error on purpose (bad input; its message names the remedy), not a library
    and not a bug (KeyError, TypeError, ... keep their traceback)."""
    frames = traceback.extract_tb(err.__traceback__)
    raised_here = bool(frames) and Path(frames[-1].filename).resolve().parent == PACKAGE
    return isinstance(err, CourseError) or raised_here and isinstance(err, (ValueError, OSError, RuntimeError))


def check_config_files(argv: list[str]) -> None:
    """Parse every --config file first, so a YAML syntax error names its file and line (jsonargparse's does not)."""
    paths = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--config", "-c")]
    paths += [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
    for path in paths:
        if not Path(path).is_file():
            continue  # jsonargparse names a missing file itself
        try:
            get_loader("yaml")(Path(path).read_text())  # the loader LightningCLI's parser itself uses
        except Exception as err:  # yaml's errors (pyyaml comes with jsonargparse, not as our own dependency)
            where = getattr(err, "problem_mark", None)
            line = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
            raise CourseError(f"{path}: YAML syntax error{line}: {getattr(err, 'problem', None) or err}. Fix the "
                              f"file (indentation and brackets are the usual culprits).") from None


def _resume_command(args: list[str]) -> str:
    """The command line that resumes this run: the same arguments and --ckpt_path last."""
    kept, skip = [], False
    for a in args:
        if skip or a.startswith("--ckpt_path="):
            skip = False
            continue
        if a == "--ckpt_path":
            skip = True
            continue
        kept.append(a)
    return " ".join(["python -m course_lib", *kept, "--ckpt_path", "last"])


def main(args: list[str] | None = None) -> CourseCLI:
    """Entry point; `args` lets tests call it in-process. A stopped fit exits 128 + the signal's number (130 for
    Ctrl+C, 143 for SIGTERM) and says how to resume; the course's own errors print as their message alone."""
    args, debug = _strip_debug(args)
    try:
        check_config_files(sys.argv[1:] if args is None else args)
    except CourseError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    stopper = StopAtStepEnd()
    defaults = log_defaults(sys.stdout.isatty())
    defaults["callbacks"] = [*defaults.get("callbacks", []), stopper]
    try:
        return CourseCLI(ImageClassifierModule, CIFAR10DataModule, seed_everything_default=0, args=args,
                         save_config_kwargs={"overwrite": True}, trainer_defaults=defaults)
    except SIGTERMException:
        name, argv = signal.Signals(stopper.signum or signal.SIGTERM).name, sys.argv[1:] if args is None else args
        if "fit" in argv[:1]:
            print(f"\nStopped by {name} at {stopper.stopped_at or 'the start'}; last.ckpt holds that state. "
                  f"Resume with:\n  {_resume_command(argv)}", file=sys.stderr)
        else:
            print(f"\nStopped by {name}.", file=sys.stderr)
        raise SystemExit(128 + (stopper.signum or signal.SIGTERM)) from None
    except Exception as err:
        if debug or not _course_error(err):
            raise
        print(f"error: {err}\n(run with --debug or {DEBUG_ENV}=1 for the traceback)", file=sys.stderr)
        raise SystemExit(1) from None

