"""`python -m course_lib fit|validate|test|predict`: LightningCLI over the course's module and data, sized by
COURSE_SIZE, with its outputs in $COURSE_BUILD/runs/<run_name> and runs that an interrupt never loses."""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from pathlib import Path

from jsonargparse import Namespace
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities.exceptions import SIGTERMException

from ..base import config, hardware
from ..base.errors import CourseError
from ..data.data import CIFAR10DataModule, class_folder_split
from ..training import runs
from ..training.modules import ImageClassifierModule
from . import runfolder
from .arguments import check_config_files, configs_first, given_settings, resume_command
from .callbacks import EpochLines, StopAtStepEnd
from .runfolder import run_checkpoints

__all__ = ["CourseCLI", "CourseError", "EpochLines", "log_defaults", "main", "run_checkpoints"]

DEBUG_ENV = "COURSE_DEBUG"  # set to 1 (or pass --debug) for the full traceback of the course's errors and all output


def log_defaults(interactive: bool) -> dict:
    """Trainer defaults for the output: the progress bar in a terminal, one line per epoch when redirected."""
    return {} if interactive else {"enable_progress_bar": False, "callbacks": [EpochLines()]}


class CourseCLI(LightningCLI):
    """LightningCLI whose defaults follow the run-size switch and the data source; flags and configs override them.
    Outputs go to $COURSE_BUILD/runs/<run_name>, from any working folder; the output is quiet (runs.quiet_cli). A
    CourseError or a full disk prints as one message, exit 1; --debug or COURSE_DEBUG=1 brings all output back."""

    def __init__(self, *args, **kwargs):
        self.debug = os.environ.get(DEBUG_ENV, "") not in ("", "0")  # --debug joins it once the arguments are parsed
        self._setup_error: CourseError | None = None  # a bad COURSE_SIZE or COURSE_DATA, raised after parsing
        self._explicit_model: dict = {}
        self._lock: runfolder.RunLock | None = None  # a fit's hold on its run folder
        self._run_dir: Path | None = None
        self._quiet = contextlib.ExitStack()  # runs.quiet_cli, from parsing (once --debug is known) to the end
        try:
            super().__init__(*args, **kwargs)
        except (CourseError, OSError) as raised:  # the course's own (the remedy named), a full disk; else a bug
            err = runfolder.as_course_error(raised, self._run_dir)
            if err is None or self.debug:
                raise
            print(f"error: {err}\n(run with --debug or {DEBUG_ENV}=1 for the traceback)", file=sys.stderr)
            raise SystemExit(1) from None
        finally:
            self._quiet.close()
            if self._lock is not None:
                self._lock.release()  # the run is over: its folder is free now, not when this object is collected

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument("--run_name", type=str, default="run",
                            help="outputs go to $COURSE_BUILD/runs/<run_name> (default build/ in the checkout)")
        parser.add_argument("--debug", action="store_true",
                            help=f"tracebacks, and the notices and warnings the CLI hides (or set {DEBUG_ENV}=1)")
        # the class names: the DataModule's (a checkpoint's, else its source's) become the model's, so every checkpoint
        # records them; neither class reads the other (a checkpoint's reach the data in _data_from_checkpoint)
        parser.link_arguments("data.classes", "model.classes", apply_on="instantiate")
        parser.add_argument("--test_folder", type=str | None, default=None,
                            help="test grades, predict labels this <folder>/<class>/*.jpg|png folder through the "
                                 "model's class names, instead of the held-out split")
        try:
            parser.set_defaults(runs.cli_defaults())
        except CourseError as err:  # raised once the arguments are parsed, so that --debug applies and --help works
            self._setup_error = err

    def parse_arguments(self, parser, args: list[str]) -> None:
        """Parse the arguments main() passes (sys.argv is never read or changed); `--ckpt_path last` becomes the
        run's last.ckpt (so the model is built from the checkpoint's settings, as for a file path), the checkpoint is
        read once with clear errors, the data settings that choose the held-out images come from it, and the model
        flags given explicitly are kept for a check."""
        self.config = parser.parse_args(args)  # LightningCLI's own parse_arguments also warns that sys.argv is set
        subcommand = self.config.subcommand
        cfg = self.config[subcommand]
        self.debug = self.debug or cfg.debug
        if not self.debug:  # a checkpoint tested or used from another run's folder: Lightning's notice is moot there
            self._quiet.enter_context(runs.quiet_cli(*([] if subcommand == "fit" else ["The dirpath has changed"])))
        if self._setup_error is not None:
            raise self._setup_error
        self._run_dir = config.build_dir().resolve() / "runs" / cfg.run_name
        last = self._run_dir / "checkpoints" / "last.ckpt"
        if cfg.get("ckpt_path") == "last":
            if not last.is_file():
                raise CourseError(f"--ckpt_path last: no {last} to resume (the run {cfg.run_name!r} never finished "
                                  f"an epoch or was never started). Run without --ckpt_path to start it, or pass "
                                  f"--run_name of the run to resume.")
            cfg.ckpt_path = str(last)
        if cfg.get("ckpt_path"):  # only a checkpoint's settings can contradict what was given
            _, model_flags = given_settings(parser, args, subcommand, "model")
            self._explicit_model = {k: cfg.model.get(k) for k in model_flags if k in cfg.model}
            data_given, _ = given_settings(parser, args, subcommand, "data")
            self._data_from_checkpoint(cfg, runfolder.read_checkpoint(cfg.ckpt_path), data_given)

    def _data_from_checkpoint(self, cfg, ckpt: dict, explicit: set[str]) -> None:
        """The settings that choose the held-out images (SPLIT_KEYS) come from the checkpoint, so that test and
        validate grade on images the model never trained on; a flag or config that contradicts them is refused. The
        class names the model records label the data (--data.classes, which the CLI links to the model's)."""
        trained_on = (ckpt.get("hyper_parameters") or {}).get("classes")
        if trained_on and "classes" in explicit and list(cfg.data.classes or []) != list(trained_on):
            raise CourseError(f"--data.classes {cfg.data.classes} contradicts {cfg.ckpt_path}, whose model was "
                              f"trained on {list(trained_on)} (its outputs follow that order). Drop --data.classes.")
        cfg.data.classes = list(trained_on) if trained_on else cfg.data.get("classes")
        if cfg.get("test_folder") and self.config.subcommand != "fit":
            return  # a foreign folder is graded whole: no split is carved
        recorded = ckpt.get("datamodule_hyper_parameters") or {}
        if not recorded:
            print(f"note: {cfg.ckpt_path} records no data settings: the held-out split is carved with seed "
                  f"{cfg.data.seed}, val_fraction {cfg.data.val_fraction}, test_fraction {cfg.data.test_fraction}; "
                  f"if the model was trained with others, some of these images were in its training set.",
                  file=sys.stderr)
        for key in (k for k in runfolder.SPLIT_KEYS if k in recorded):
            if key in explicit and cfg.data.get(key) != recorded[key]:
                raise CourseError(f"--data.{key} {cfg.data.get(key)} contradicts {cfg.ckpt_path}, whose run had "
                                  f"{key}={recorded[key]}: the held-out images follow the checkpoint's settings "
                                  f"(others would mix its training images into the split). Drop --data.{key} (and "
                                  f"any {key} in a config), or grade other images with --test_folder.")
            cfg.data[key] = recorded[key]
        if recorded.get("image_folder") != cfg.data.get("image_folder"):
            print(f"note: {cfg.ckpt_path} was trained on {recorded.get('image_folder') or 'torchvision CIFAR-10'}, "
                  f"these data are {cfg.data.get('image_folder') or 'torchvision CIFAR-10'}: its splits are carved "
                  f"from the latter.", file=sys.stderr)

    def _check_explicit_model_flags(self, cfg) -> None:
        """A checkpoint's settings replace the config's; an explicit --model flag that contradicts them is an error
        (the checkpoint's weights fit only its own model), not silently dropped."""
        if not cfg.get("ckpt_path"):
            return
        for key, given in self._explicit_model.items():
            if cfg.model.get(key) != given:
                raise CourseError(f"--model.{key} {given} contradicts the checkpoint {cfg.ckpt_path}, whose model has "
                                  f"{key}={cfg.model.get(key)} (its weights fit only that model). Drop "
                                  f"--model.{key}, or train a new model with it (fit without --ckpt_path).")

    @staticmethod
    def _checked_precision(precision, accelerator):
        """--trainer.precision through the one decision (hardware.choose_precision): unset, the hardware's policy, as at
        every entry point; one this hardware lacks is an error naming the alternative, never Lightning's silent
        fallback (16-mixed on a CPU runs bf16)."""
        if precision is not None and hardware.precision_name(precision) not in hardware.PRECISIONS:
            return precision  # a setting the policy does not cover (64-true, ...): Lightning's own
        return hardware.choose_precision(precision, accelerator=accelerator)

    def before_instantiate_classes(self) -> None:
        """Check the devices and precision against this machine, and point the outputs at the run folder."""
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        trainer = cfg.trainer
        hardware.check_devices(trainer.accelerator, trainer.devices)
        trainer.precision = self._checked_precision(trainer.precision, trainer.accelerator)
        self._check_explicit_model_flags(cfg)
        self._check_test_folder(cfg)
        if cfg.data.batch_size < 1:
            raise CourseError(f"--data.batch_size {cfg.data.batch_size}: a batch needs at least one image. Pass a "
                              f"positive size, e.g. --data.batch_size 64.")
        run_dir, ckpt_dir = self._run_dir, self._run_dir / "checkpoints"
        if self.subcommand == "fit":
            self._claim_run_folder(cfg, run_dir, ckpt_dir)
        else:
            runfolder.writable(run_dir)
        if trainer.default_root_dir is None:
            trainer.default_root_dir = str(run_dir)
        if trainer.logger in (None, True):  # TensorBoard where it is installed, else CSV
            trainer.logger = Namespace(class_path=runfolder.logger_class(),
                                       init_args=Namespace(save_dir=str(run_dir), name="logs"))
        self.trainer_defaults.setdefault("callbacks", []).extend(runfolder.run_callbacks(self.subcommand, run_dir))

    def _check_test_folder(self, cfg) -> None:
        """--test_folder is graded (test) or labelled (predict) through the model's class names: it needs them, one
        per output of the model's head; fit and validate read the data's own splits."""
        folder = cfg.get("test_folder")
        if not folder:
            return
        if self.subcommand not in ("test", "predict"):
            raise CourseError(f"--test_folder {folder}: {self.subcommand} reads the data's own splits. Grade the "
                              f"folder with `test` or label it with `predict`, or drop --test_folder.")
        named, heads = len(cfg.data.get("classes") or []), cfg.model.num_classes
        if not named:
            raise CourseError(f"{cfg.get('ckpt_path') or 'This model'} records no class names, so the folders of "
                              f"{folder} cannot be mapped to its outputs. Name them in the order the model was "
                              f"trained on, e.g. --data.classes '[airplane, cat, ship]', or pass a checkpoint "
                              f"written by this course's fit (it records them).")
        if named != heads:
            raise CourseError(f"The model records {named} class names but its head has {heads} outputs, so the "
                              f"folders of {folder} cannot be graded on it. Retrain it with --model.num_classes "
                              f"{named}, or name its {heads} classes with --data.classes.")

    def before_test(self) -> None:
        """--test_folder's images, labelled through the data's (the model's) class names, replace the held-out split:
        the path lives here, not in the DataModule."""
        folder = self.config[self.subcommand].get("test_folder")
        if folder:
            dm = self.datamodule
            dm.hold_out(*class_folder_split(Path(folder), dm.classes, dm.data_dir / "cache"))

    before_predict = before_test

    def instantiate_trainer(self, **kwargs):
        """The Trainer, writing checkpoints atomically (runfolder.AtomicCheckpointIO) unless --trainer.plugins
        names plugins of its own."""
        if not self._get(self.config_init, "trainer", default={}).get("plugins"):
            kwargs.setdefault("plugins", [runfolder.AtomicCheckpointIO()])
        return super().instantiate_trainer(**kwargs)

    def _claim_run_folder(self, cfg, run_dir: Path, ckpt_dir: Path) -> None:
        """A fit holds the run folder's lock for its lifetime (a second fit of it is refused, naming the first),
        resumes only this run's own checkpoints, and never overwrites an earlier run's last.ckpt."""
        self._lock = runfolder.RunLock(run_dir).acquire() if runfolder.launched_rank_zero() else None
        if cfg.ckpt_path and Path(cfg.ckpt_path).resolve().parent != ckpt_dir:
            raise CourseError(f"fit --ckpt_path resumes this run's own checkpoints ({ckpt_dir}); "
                              f"{cfg.ckpt_path} belongs to another run, whose state would replace this run's "
                              f"last.ckpt. Resume that run with its own --run_name and --ckpt_path last, or start "
                              f"from its weights in Python (ImageClassifierModule.load_from_checkpoint).")
        if cfg.ckpt_path is None and (ckpt_dir / "last.ckpt").exists():
            raise CourseError(f"{ckpt_dir / 'last.ckpt'} holds an earlier run, which a new fit would overwrite. "
                              f"Resume it with --ckpt_path last, start a new run with --run_name <another name>, "
                              f"or delete {ckpt_dir} first.")
        if ckpt_dir.is_dir():
            runfolder.remove_stale_temporaries(ckpt_dir)


def _exit_now(signum, frame) -> None:
    """Ctrl+C while the process exits: out at once, without the traceback a KeyboardInterrupt in an exit handler
    prints ("Exception ignored in atexit callback")."""
    sys.stderr.flush()
    os._exit(128 + signum)


def main(args: list[str] | None = None) -> CourseCLI:
    """Entry point; `args` (default: sys.argv[1:], read, never changed) lets tests and notebooks call it in-process.
    A stopped fit exits 128 + the signal's number (130 for Ctrl+C, 143 for SIGTERM) and says how to resume; the
    course's own errors print as their message alone (CourseCLI), a config file that is not YAML exits 2."""
    from_command_line = args is None
    argv = configs_first(sys.argv[1:] if args is None else list(args))
    try:
        check_config_files(argv)
    except CourseError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    stopper = StopAtStepEnd()
    defaults = log_defaults(sys.stdout.isatty())
    defaults["callbacks"] = [*defaults.get("callbacks", []), stopper]
    try:
        return CourseCLI(ImageClassifierModule, CIFAR10DataModule, seed_everything_default=0, args=argv,
                         save_config_kwargs={"overwrite": True}, trainer_defaults=defaults)
    except (SIGTERMException, SystemExit) as stop:
        if isinstance(stop, SystemExit) and not stopper.stopped_at:
            raise  # --help, --print_config, a parser error, a CourseError's exit: not a stopped run
        name = signal.Signals(stopper.signum or signal.SIGTERM).name
        if "fit" in argv[:1]:
            print(f"\nStopped by {name} at {stopper.stopped_at or 'the start'}; last.ckpt holds that state. "
                  f"Resume with:\n  {resume_command(argv)}", file=sys.stderr)
        else:
            print(f"\nStopped by {name}.", file=sys.stderr)
        raise SystemExit(128 + (stopper.signum or signal.SIGTERM)) from None
    finally:
        if from_command_line and threading.current_thread() is threading.main_thread():  # not a test's call
            signal.signal(signal.SIGINT, _exit_now)  # leaving: only exit handlers run from here on
