"""The CLI's command line before LightningCLI parses it: --config files first, the settings given explicitly, YAML
errors with their file and line, and the command that resumes a stopped run."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

from jsonargparse import get_loader

from .runfolder import CourseError

SUBCOMMANDS = ("fit", "validate", "test", "predict")


def explicit_keys(argv: list[str], section: str) -> set[str]:
    """The <section> settings given by a flag (--data.seed 1) or in a --config file's <section>: mapping."""
    keys = {a[len(section) + 3:].split("=")[0] for a in argv if a.startswith(f"--{section}.")}
    for path in config_paths(argv):
        loaded = get_loader("yaml")(Path(path).read_text()) if Path(path).is_file() else None
        keys |= set(loaded.get(section) or {}) if isinstance(loaded, dict) else set()
    return keys


def configs_first(argv: list[str]) -> list[str]:
    """The --config files moved right after the subcommand, in their order: jsonargparse applies arguments in order,
    so a flag placed before a config would be silently overridden by it. Flags always override configs."""
    if not argv or argv[0] not in SUBCOMMANDS:
        return argv
    configs, rest, i = [], [], 1
    while i < len(argv):
        if argv[i] in ("--config", "-c") and i + 1 < len(argv):
            configs += argv[i:i + 2]
            i += 2
            continue
        (configs if argv[i].startswith("--config=") else rest).append(argv[i])
        i += 1
    return [argv[0], *configs, *rest]


def config_paths(argv: list[str]) -> list[str]:
    """The files that --config (or -c) names."""
    paths = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--config", "-c")]
    return paths + [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]


def check_config_files(argv: list[str]) -> None:
    """Parse every --config file first, so a YAML syntax error names its file and line (jsonargparse's does not)."""
    for path in config_paths(argv):
        if not Path(path).is_file():
            continue  # jsonargparse names a missing file itself
        try:
            get_loader("yaml")(Path(path).read_text())  # the loader LightningCLI's parser itself uses
        except Exception as err:  # yaml's errors (pyyaml comes with jsonargparse, not as our own dependency)
            where = getattr(err, "problem_mark", None)
            line = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
            raise CourseError(f"{path}: YAML syntax error{line}: {getattr(err, 'problem', None) or err}. Fix the "
                              f"file (indentation and brackets are the usual culprits).") from None


def resume_command(args: list[str]) -> str:
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
    return shlex.join([sys.executable, "-m", "course_lib", *kept, "--ckpt_path", "last"])
