"""Interrupted runs: one rule for Ctrl-C (SIGINT) and a CI job being cancelled (SIGTERM).

Both arrive in a command as `KeyboardInterrupt` (SIGTERM as its subclass `Terminated`, installed
once by the CLI's ``main`` through `sigterm_as_interrupt`).  A command that is interrupted stops its
work, writes a report marked ``incomplete`` holding what finished, says so in one line on stderr
and exits `EXIT_INTERRUPTED` (130, whichever of the two signals stopped it).
"""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator

EXIT_INTERRUPTED = 130
STATUS_COMPLETE = "complete"
STATUS_INCOMPLETE = "incomplete"
STATUSES = (STATUS_COMPLETE, STATUS_INCOMPLETE)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, so it unwinds exactly like Ctrl-C."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside the block SIGTERM raises `Terminated`; the previous handler comes back after it.
    Off the main thread (where Python cannot set handlers) the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class CatchInterrupt:
    """A context that stops a `KeyboardInterrupt` at its end and keeps it in `interrupt`, so the
    code after the block can report what finished before it (``enabled=False``: it lets it through)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.interrupt: KeyboardInterrupt | None = None

    def __enter__(self) -> "CatchInterrupt":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool:
        if self.enabled and isinstance(exc, KeyboardInterrupt):
            self.interrupt = exc
            return True
        return False

    def note(self) -> str | None:
        """``interrupted (SIGINT)``-style words when the block was interrupted, else None."""
        return None if self.interrupt is None else f"interrupted ({signal_name(self.interrupt)})"


def signal_name(interrupt: BaseException) -> str:
    """``SIGTERM`` for `Terminated`, else ``SIGINT``."""
    return "SIGTERM" if isinstance(interrupt, Terminated) else "SIGINT"


def incomplete_banner(note: str) -> str:
    """The line an incomplete report's Markdown starts with."""
    return f"> **INCOMPLETE REPORT**: {note}\n\n"


__all__ = ["EXIT_INTERRUPTED", "STATUS_COMPLETE", "STATUS_INCOMPLETE", "STATUSES", "Terminated", "CatchInterrupt", "sigterm_as_interrupt",
           "signal_name", "incomplete_banner"]
