"""How far a long piece of work is: the callback the library calls and the command line shows.

Library functions that run long (a training run, a graph replay, a trace replay, a fit) take a
`Progress` or None and call it from where the work happens, in their own units (layer steps,
graph nodes, trace rows, fitted groups). They never print: the CLI turns the calls into a bar
or log lines (`cli.options.Meter`).
"""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    """Told `done` of `total` units of the work have finished (several callers may race: keep the most)."""

    def __call__(self, done: int, total: int) -> None:
        """`done` of `total` units finished (0 <= done <= total)."""


def tell(progress: Progress | None, done: int, total: int) -> None:
    """Call `progress` when there is one."""
    if progress is not None:
        progress(done, total)


class Runs:
    """`n` runs one after the other, each telling its own units: `next()` is the next run's callback."""

    def __init__(self, progress: Progress | None, n: int):
        self.progress, self.n, self.started = progress, n, 0

    def next(self) -> Progress | None:
        """The callback of the next run (None without a `progress`)."""
        i, whole = self.started, self.progress
        self.started += 1
        if whole is None:
            return None

        def tell_run(done: int, total: int) -> None:
            if total:
                whole(i * total + done, self.n * total)

        return tell_run
