"""A function run in a forked child: a crash, a hang or an error there becomes one line.

HDF5 can abort or segfault its process on a damaged file or a full disk; the trace reader and
writer (`trace`) run it in a child so that this process never takes that blow.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import time
from collections.abc import Callable
from typing import Any, TypeVar

from .errors import UsageError

T = TypeVar("T")


def in_child(
    fn: Callable[[], T], failed: str, timeout_s: float, service: Callable[[], None] | None = None
) -> T:
    """Run `fn` in a forked child and return its result; a crash, hang or error there is one line.

    HDF5 can abort or segfault its process on a damaged file or a full disk. Run in a child, that
    becomes a `UsageError` starting with `failed`. `service` is called while waiting (an MPI rank
    answers liveness pings meanwhile).
    """
    if not hasattr(os, "fork"):
        return fn()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(r)
            try:
                payload: tuple[str, Any] = ("ok", fn())
            except UsageError as exc:
                payload = ("error", str(exc))
            except Exception as exc:  # h5py raises many kinds
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                payload = ("error", f"{failed} ({first})")
            with os.fdopen(w, "wb") as out:
                pickle.dump(payload, out, protocol=pickle.HIGHEST_PROTOCOL)
        finally:
            os._exit(0)
    os.close(w)
    chunks, deadline = [], time.monotonic() + timeout_s
    with os.fdopen(r, "rb") as pipe:
        while True:
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise UsageError(f"{failed} (it did not finish in {timeout_s:g} s)")
            if service is not None:
                service()
            ready, _, _ = select.select([pipe], [], [], 0.01)
            if not ready:
                continue
            data = os.read(pipe.fileno(), 1 << 20)
            if not data:
                break
            chunks.append(data)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status) or not chunks:
        signal_note = f", signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else ""
        raise UsageError(f"{failed} (the HDF5 library crashed{signal_note})")
    kind, value = pickle.loads(b"".join(chunks))
    if kind == "error":
        raise UsageError(value)
    return value
