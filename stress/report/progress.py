"""Progress for long commands, on a terminal and in CI logs.

On a terminal: a rich progress bar (transient).  Elsewhere (a CI log, a pipe) or with
``--no-progress``: plain lines on stderr -- one as each run starts, one as it ends, and one every
``interval_s`` seconds while it runs -- so a log shows life long before the first run ends.
``--no-progress`` keeps the start/end lines and drops the periodic ones and the bar.

Ownership: a `Progress` owns its rich bar (when there is one) and its last-line timestamp.
"""
from __future__ import annotations

import sys
import time
from typing import Any

PROGRESS_INTERVAL_S = 30.0


class Progress:
    """``with Progress(title, total) as p: p.start(name); p.advance(done); p.end(line)``."""

    def __init__(self, title: str, total: int, *, enabled: bool = True, interval_s: float = PROGRESS_INTERVAL_S,
                 stream: Any = None):
        from rich.console import Console

        self.title, self.total, self.enabled, self.interval_s = title, max(total, 1), enabled, interval_s
        self.stream = stream if stream is not None else sys.stderr
        self.console = Console(file=self.stream)
        self.bar = None
        self._task = None
        self._last = time.monotonic()
        self._started = time.monotonic()
        self._current = ""

    def __enter__(self) -> "Progress":
        if self.enabled and self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            self.bar = Bar(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                           TimeElapsedColumn(), console=self.console, transient=True)
            self.bar.__enter__()
            self._task = self.bar.add_task(self.title, total=self.total)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def line(self, text: str) -> None:
        """A plain line above the bar (or in the log)."""
        if self.bar is not None:
            self.bar.console.print(text, highlight=False, markup=False)
        else:
            print(text, file=self.stream, flush=True)

    def start(self, name: str) -> None:
        self._current = name
        self._last = time.monotonic()
        if self.bar is not None:
            self.bar.update(self._task, description=name)
        else:
            self.line(f"start {name}")

    def advance(self, completed: int) -> None:
        if self.bar is not None:
            self.bar.update(self._task, completed=completed)
            return
        now = time.monotonic()
        if self.enabled and now - self._last >= self.interval_s:
            self._last = now
            self.line(f"  ... {self._current}: {completed}/{self.total} ({now - self._started:.0f} s elapsed)")

    def end(self, text: str) -> None:
        self.line(text)


__all__ = ["Progress", "PROGRESS_INTERVAL_S"]
