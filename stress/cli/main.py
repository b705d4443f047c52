"""The `runnercheck` command line: one parser per command, shared options, lazy imports.

Each command lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int`` (the exit status); only the chosen one is imported (the top-level help is
built from the table below without importing any command, as vLLM's CLI does).  The shared
options (`runnercheck.stress.cli.options`) are added here, once, with one rule each: ``--device auto`` is
cuda when torch sees a GPU, else sim, in every command; ``--seed`` is an integer in [0, 2^63);
``--out`` must be creatable and writable, not a file, not the current folder or one of its
ancestors, ``/`` or ``$HOME``, and not a non-empty folder holding no runnercheck report unless
``--force``; ``--csan`` (stress, verify, chisq) needs the resolved device to be cuda; ``-v``/``-q``
set the log level.  They are checked after parsing and before the command runs: a bad value exits 2
with one line.

Interrupts have one rule, installed here: SIGTERM (a CI job cancelled) is turned into
`runnercheck.checks.interrupts.Terminated`, a `KeyboardInterrupt`, so it unwinds like Ctrl-C; a
command writes what finished as a report marked incomplete, and an interrupt that reaches this
function is one line on stderr.  Either way the exit status is 130.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from dataclasses import dataclass
from importlib import metadata

from runnercheck.stress.cli.options import (
    CsanDeviceError,
    DeviceUnavailableError,
    add_logging_options,
    add_run_options,
    add_shard_option,
    configure_logging,
    resolve_csan,
    resolve_device,
    seed_message,
    seed_type,
)


@dataclass(frozen=True)
class Command:
    module: str
    help: str
    run_options: bool = True  # --device, --seed, --out, --no-progress
    eager: bool = False  # --eager
    csan: bool = False  # --csan
    shard: str | None = None  # --shard I/N over these items (commands whose own module does not declare it)


COMMANDS: dict[str, Command] = {
    "verify": Command("runnercheck.stress.cli.verify", "the main job: runner vs oracle under stress, detectors armed, sampler statistics", eager=True, csan=True),
    "stress": Command("runnercheck.stress.cli.stress_cmd", "long random churn on one seed; writes a repro file on divergence", eager=True, csan=True),
    "replay": Command("runnercheck.stress.cli.replay", "re-run a recorded repro file", run_options=False),
    "chisq": Command("runnercheck.checks.chisq.run", "chi-square tests of a sampler against the exact distributions", csan=True,
                     shard="matrix cases and planted biases (the spec cases and the calibration run in shard 0; "
                           "each shard corrects its own tests)"),
    "invariance": Command("runnercheck.stress.cli.invariance_cmd", "the same requests alone and in batches must give bitwise-equal tokens and logprobs", eager=True),
    "mutants": Command("runnercheck.stress.cli.mutants_cmd", "run the checks against the catalogue of deliberate bugs", eager=True),
    "bench": Command("runnercheck.bench.cli", "benchmarks (results are data, not tests)", eager=True),
    "lint": Command("runnercheck.checks.lint", "static scan of hot-path functions for host reads of device data", run_options=False),
    "env": Command("runnercheck.stress.cli.env_cmd", "device kind, torch/triton versions, whether Triton is interpreted", run_options=False),
}


class UsageError(Exception):
    """A command line argparse rejected; main prints it as one line and exits 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """The one rule for defaults in ``--help``: an option that takes a value shows ``(default: X)``
    after its help, unless its help already says what its default is (it contains "default").  An
    option whose default is None words it that way ("default: not written") or says it is required;
    flags show none (off unless given)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (action.nargs == 0 or not action.option_strings or action.required
                or action.default in (None, argparse.SUPPRESS) or "default" in text):
            return text
        value = action.default
        if isinstance(value, (list, tuple)):
            value = " ".join(map(str, value)) or "none"
        return f"{text} (default: {str(value).replace('%', '%%')})"  # help is %-formatted by argparse


def version() -> str:
    try:
        return metadata.version("runnercheck")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def top_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="runnercheck", description="runnercheck: a GPU model runner and the suite that proves it right")
    parser.add_argument("--version", action="version", version=f"runnercheck {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands",
                                description="`runnercheck COMMAND --help` for a command's options")
    for name, cmd in COMMANDS.items():
        sub.add_parser(name, help=cmd.help, add_help=False)
    return parser


def command_parser(name: str, module) -> argparse.ArgumentParser:
    cmd = COMMANDS[name]
    # conflict_handler="resolve": a command from another package may still declare a shared
    # option itself (its default/choices win); the shared checks below run on it all the same.
    parser = _Parser(prog=f"runnercheck {name}", description=cmd.help, conflict_handler="resolve",
                     formatter_class=HelpFormatter)
    if cmd.run_options:
        add_run_options(parser, eager=cmd.eager, csan=cmd.csan)
    if cmd.shard is not None:
        add_shard_option(parser, cmd.shard)
    add_logging_options(parser)
    module.add_arguments(parser)
    for action in parser._actions:  # a command's own --seed still follows the one seed rule
        if "--seed" in action.option_strings:
            action.type = seed_type
    return parser


def prepare_triton_env(argv: list[str]) -> None:
    """Set TRITON_INTERPRET before triton is imported, unless a real GPU will run the kernels; an
    interpreter gets `speed_up_interpreter` and `check_interpreted_memory`."""
    if "TRITON_INTERPRET" not in os.environ:
        _choose_interpreter(argv)
    from runnercheck.impl.kernels.interpreted_memory import check_interpreted_memory
    from runnercheck.impl.kernels.interpreter import speed_up_interpreter

    speed_up_interpreter()
    check_interpreted_memory()


def _choose_interpreter(argv: list[str]) -> None:
    wants_gpu = True  # the default device is auto
    for i, a in enumerate(argv):
        if a == "--device" and i + 1 < len(argv):
            wants_gpu = argv[i + 1] in ("cuda", "auto")
        elif a.startswith("--device="):
            wants_gpu = a.split("=", 1)[1] in ("cuda", "auto")
    import torch

    if not (wants_gpu and torch.cuda.is_available()):
        os.environ["TRITON_INTERPRET"] = "1"


def check_shared(args: argparse.Namespace) -> None:
    """The shared options' rules, whichever module declared them (`UsageError` with one line)."""
    from runnercheck.checks.report_folder import OutDirError, check_out_dir
    from runnercheck.stress.run.config import seed_problem

    if hasattr(args, "seed") and args.seed is not None and seed_problem(args.seed):
        raise UsageError(f"argument --seed: {seed_message(args.seed)}")
    if getattr(args, "device", None) is not None:
        try:
            args.device = resolve_device(args.device)
        except DeviceUnavailableError as e:
            raise UsageError(str(e)) from None
    if getattr(args, "csan", False):
        try:
            args.csan = resolve_csan(args.csan, args.device)
        except CsanDeviceError as e:
            raise UsageError(str(e)) from None
    if getattr(args, "out", None) is not None:
        try:
            check_out_dir(args.out, force=getattr(args, "force", False))
        except OutDirError as e:
            raise UsageError(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        try:
            top_parser().parse_args(argv or ["--help"])
        except UsageError as e:
            print(e, file=sys.stderr)
            return 2
        except SystemExit as e:  # --help / --version
            return int(e.code or 0)
        return 2
    name, rest = argv[0], argv[1:]
    from runnercheck.checks.interrupts import EXIT_INTERRUPTED, sigterm_as_interrupt, signal_name
    from runnercheck.checks.provenance import record_command_line

    record_command_line(argv)
    try:
        with sigterm_as_interrupt():
            return _run_command(name, rest)
    except KeyboardInterrupt as e:  # one the command did not turn into an incomplete report
        print(f"runnercheck {name}: interrupted ({signal_name(e)}); no report was written", file=sys.stderr)
        return EXIT_INTERRUPTED


def _run_command(name: str, rest: list[str]) -> int:
    prepare_triton_env(rest)
    cmd = COMMANDS[name]
    try:
        module = importlib.import_module(cmd.module)
    except ModuleNotFoundError as e:
        if e.name == cmd.module:
            print(f"runnercheck {name}: not available in this build ({cmd.module} is missing)", file=sys.stderr)
            return 2
        raise
    try:
        args = command_parser(name, module).parse_args(rest)
        check_shared(args)
    except UsageError as e:
        message = str(e)
        print(message if message.startswith("runnercheck") else f"runnercheck {name}: {message}", file=sys.stderr)
        return 2
    except SystemExit as e:  # --help
        return int(e.code or 0)
    configure_logging(getattr(args, "verbose", 0), getattr(args, "quiet", 0))
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
