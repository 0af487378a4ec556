"""The CLI's command line around LightningCLI's parser: --config files first, the settings given explicitly (read by
the parser), YAML errors with their file and line, and the command that resumes a stopped run. Nothing here reads or
changes sys.argv: main() passes the arguments."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

from jsonargparse import ArgumentParser, Namespace, get_loader

from ..base.errors import CourseError

SUBCOMMANDS = ("fit", "validate", "test", "predict")


def split_configs(argv: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(everything up to the subcommand, the --config/-c options after it in their order, the other arguments)."""
    start = next((i + 1 for i, a in enumerate(argv) if a in SUBCOMMANDS), len(argv))
    configs, rest, i = [], [], start
    while i < len(argv):
        if argv[i] in ("--config", "-c") and i + 1 < len(argv):
            configs += argv[i:i + 2]
            i += 2
            continue
        (configs if argv[i].startswith("--config=") else rest).append(argv[i])
        i += 1
    return argv[:start], configs, rest


def configs_first(argv: list[str]) -> list[str]:
    """The arguments with the --config files moved right after the subcommand, in their order: jsonargparse applies
    arguments in order, so a flag placed before a config would be silently overridden by it. Flags always win."""
    head, configs, rest = split_configs(argv)
    return [*head, *configs, *rest]


def given_settings(parser: ArgumentParser, argv: list[str], subcommand: str, section: str) -> tuple[set[str], set[str]]:
    """The <section> settings that argv (in configs_first's order) sets, as the parser reads them with its defaults
    left out: (those set by a flag or a --config file, those a flag sets to other than what the configs say).

    jsonargparse records no value's origin, and the flags cannot be parsed without the configs (a flag may refine a
    config's value, e.g. --trainer.callbacks.patience after a config that lists callbacks), so the flags' share is
    what parsing the configs alone (a prefix of argv) does not give."""
    head, configs, _ = split_configs(argv)

    def section_of(args: list[str]):
        return parser.parse_args(args, defaults=False)[subcommand].get(section) or Namespace()

    given, from_configs = section_of(argv), section_of([*head, *configs])
    flagged = {k for k in given.keys() if k not in from_configs or from_configs[k] != given[k]}
    return set(given.keys()), flagged


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
