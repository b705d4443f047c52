"""The options every `runnercheck` command shares, with one rule each, and typed numeric flags.

* ``--device {auto,cuda,cpu,sim}``: **auto means cuda when torch sees a GPU, else sim** -- in
  every command (`resolve_device`); asking for cuda without one is a usage error.
* ``--seed S``: an integer in ``[0, 2^63)`` everywhere (`runnercheck.stress.run.config.seed_problem` words
  the message).
* ``--out DIR``: a report folder that can be created and written and is not a file, never the
  current folder, an ancestor of it, ``/`` or ``$HOME``, and -- unless ``--force`` -- not a
  non-empty folder that holds no runnercheck report (`runnercheck.checks.report_folder.check_out_dir`),
  checked before any work.  What DIR held before is moved aside, never deleted.
* ``--force``: a non-empty ``--out`` folder that is not a runnercheck report is moved aside to
  ``DIR.prev-<UTC time>`` and the report written in its place.
* ``--no-progress``: no progress bar (progress lines still go to a non-terminal log).
* ``-v`` / ``-q``: more / less logging (`logging`, to stderr).
* ``--eager``: run the runner without CUDA graphs (``cuda_graphs=False`` to factories that take it).
* ``--csan`` (stress, verify, chisq): run under PyTorch's CUDA stream sanitizer (`runnercheck.checks.detectors.csan`);
  a race it reports is a finding of check ``csan``.  Needs cuda: ``resolve_csan`` is the one rule,
  applied after ``--device`` is resolved and before any work (`CsanDeviceError` otherwise).
* ``--shard I/N`` (campaigns: verify's runs, mutants' seeds): this job takes items ``I, I+N,
  I+2N, ...`` of the campaign (0-based), so N jobs on N GPUs or CI runners cover every item exactly
  once (`Shard.select`).

A bad value is an `argparse.ArgumentTypeError` raised while parsing, so the command exits 2 with
one line before it starts any work.
"""
from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

_T = TypeVar("_T")

from runnercheck.stress.run.config import seed_problem

DEVICE_CHOICES = ("auto", "cuda", "cpu", "sim")


class DeviceUnavailableError(RuntimeError):
    """``--device cuda`` on a machine where torch sees no GPU."""


class CsanDeviceError(ValueError):
    """``--csan`` with a device that is not cuda (CSAN watches CUDA streams only)."""


def resolve_csan(csan: bool, device: str) -> bool:
    """The one rule for ``--csan``: only on a resolved ``cuda`` device."""
    from runnercheck.checks.detectors.csan import NEEDS_CUDA

    if csan and device != "cuda":
        raise CsanDeviceError(f"{NEEDS_CUDA} (the device resolved to {device})")
    return bool(csan)


def resolve_device(device: str) -> str:
    """`runnercheck.impl.device.resolve_device_kind`'s rule (auto -> cuda when a GPU is present, else sim) for
    ``--device``; a missing GPU is `DeviceUnavailableError`."""
    from runnercheck.impl.device import DeviceError, resolve_device_kind

    try:
        return resolve_device_kind(device)
    except DeviceError:
        if device == "cuda":
            raise DeviceUnavailableError("--device cuda asked for, but torch sees no CUDA device") from None
        raise


def seed_message(text: object) -> str:
    """The one message for a bad seed, in every command."""
    return f"must be an integer in [0, 2^63), got {text}"


def seed_type(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(seed_message(text)) from None
    if seed_problem(value):
        raise argparse.ArgumentTypeError(seed_message(text))
    return value


def int_type(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in ``[minimum, maximum]``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
            raise argparse.ArgumentTypeError(f"must be an integer {bound}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def float_type(minimum: float, maximum: float | None = None) -> Callable[[str], float]:
    """An argparse type: a finite number in ``[minimum, maximum]``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not (value >= minimum and (maximum is None or value <= maximum)):
            bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
            raise argparse.ArgumentTypeError(f"must be a number {bound}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


@dataclass(frozen=True)
class Shard:
    """Job ``index`` of ``count`` splitting one campaign: it takes every ``count``-th item from ``index``."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if not (isinstance(self.count, int) and isinstance(self.index, int) and self.count >= 1
                and 0 <= self.index < self.count):
            raise ValueError(f"shard {self.index}/{self.count}: need 0 <= I < N")

    @property
    def whole(self) -> bool:
        return self.count == 1

    def select(self, items: Sequence[_T]) -> list[_T]:
        """This shard's items, in campaign order (round robin: the shards of N jobs partition ``items``)."""
        return list(items[self.index :: self.count])

    def describe(self) -> str:
        return f"{self.index}/{self.count}"

    def __str__(self) -> str:  # as `--shard` takes it (and `--help` shows the default)
        return self.describe()


def shard_type(text: str) -> Shard:
    """``I/N`` with ``0 <= I < N``."""
    index, sep, count = text.partition("/")
    try:
        return Shard(int(index), int(count)) if sep else Shard(-1, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected I/N with 0 <= I < N (e.g. 0/2), got {text!r}") from None


def add_shard_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--shard", type=shard_type, default=Shard(), metavar="I/N",
                        help=f"run only this job's share of the {what}: items I, I+N, ... (0-based)")


RUNNER_HELP = "runner factory: 'package.module:factory' or 'path/file.py:factory'"


def runner_spec_type(text: str) -> str:
    """A runner factory spec in the form every process loads again: a file spec's path made
    absolute against the folder the command was started in (a repro file replayed from elsewhere,
    or a child process, finds the same file).  Only the syntax is checked here; loading happens
    when the command runs."""
    from runnercheck.checks.loader import SpecSyntaxError, canonical_spec

    try:
        return canonical_spec(text, "runner")
    except SpecSyntaxError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_runner_option(parser: argparse.ArgumentParser, default: str | None, help: str) -> None:
    """``--runner``: the one definition every command that takes a runner factory uses."""
    parser.add_argument("--runner", type=runner_spec_type, default=default, metavar="SPEC", help=help)


def add_timeout_option(parser: argparse.ArgumentParser, default: float, unit: str) -> None:
    """``--timeout SECONDS``: the wall-clock limit of each isolated ``unit`` (a run, a case); past it
    the unit's process group is killed and the unit fails, naming the limit.  0 means no limit.  One
    definition for every command that isolates third-party code; ``--in-process``/``--no-isolation``
    runs have no child to kill, so the limit does not apply to them."""
    parser.add_argument("--timeout", type=float_type(0.0), default=default, metavar="SECONDS",
                        help=f"fail {unit} that runs longer, killing its process group (default {default:g}; 0: no limit)")


def timeout_seconds(value: float) -> float | None:
    """The ``timeout_s`` an isolated job takes for a ``--timeout`` value (0: None, no limit)."""
    return value or None


def add_logging_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("output")
    group.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv: debug)")
    group.add_argument("-q", "--quiet", action="count", default=0, help="only errors in the log")


def add_run_options(parser: argparse.ArgumentParser, *, eager: bool, csan: bool = False) -> None:
    group = parser.add_argument_group("run")
    group.add_argument("--device", default="auto", choices=DEVICE_CHOICES,
                       help="auto: cuda when torch sees a GPU, else sim (the same rule in every command)")
    group.add_argument("--seed", type=seed_type, default=0, help="an integer in [0, 2^63)")
    group.add_argument("--out", default=None,
                       help="report folder (written atomically; checked before any work; what it held before is "
                            "moved to DIR.prev-<UTC time>, never deleted)")
    group.add_argument("--force", action="store_true",
                       help="write the report even when --out is a non-empty folder that is not a runnercheck report "
                            "(it is moved aside to DIR.prev-<UTC time>, nothing is deleted)")
    group.add_argument("--no-progress", action="store_true", help="no progress bar")
    if eager:
        group.add_argument("--eager", action="store_true", help="run the runner without CUDA graphs")
    if csan:
        group.add_argument("--csan", action="store_true",
                           help="run under PyTorch's CUDA stream sanitizer; a race is a 'csan' finding (needs --device cuda)")


def configure_logging(verbose: int, quiet: int) -> None:
    level = logging.WARNING - 10 * verbose + 10 * quiet
    logging.basicConfig(level=max(logging.DEBUG, min(level, logging.CRITICAL)), format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(max(logging.DEBUG, min(level, logging.CRITICAL)))


__all__ = ["DEVICE_CHOICES", "CsanDeviceError", "DeviceUnavailableError", "resolve_csan", "Shard", "resolve_device", "seed_message", "seed_type", "int_type",
           "float_type", "shard_type", "add_shard_option", "add_logging_options", "add_run_options", "configure_logging"]
