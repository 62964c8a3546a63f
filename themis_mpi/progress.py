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
