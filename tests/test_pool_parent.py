"""A `--workers N` sweep's workers end with their parent, however the parent is killed alone."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from themis_mpi.run.pool import _watch_parent, die_with_parent

# A sweep of about a minute on 2 workers (1000+ cells); it is killed within seconds of starting.
SWEEP = ["model", "-t", "8x8x8,16x16x8,4x4x4x4", "-b", "64K", "-e", "4G", "-f", "2", "-p", "all"]
SWEEP += ["-c", "64,256,1024", "--network", "fair", "-q", "--workers", "2"]
DEADLINE_S = 5.0


def children(pid: int) -> list[int]:
    """Live processes whose parent is `pid`, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()  # state, ppid, ...
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the workers through /proc")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_workers_end_within_5_s_of_their_parent(signum):
    """Only the parent gets the signal; no worker is alive 5 s later (they would block for ever)."""
    parent = subprocess.Popen(
        [sys.executable, "-m", "themis_mpi", *SWEEP],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(workers) < 2 and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.1)
            workers = children(parent.pid)
        assert len(workers) == 2 and parent.poll() is None, "the sweep did not start its 2 workers"
        time.sleep(0.5)  # the workers are inside their cells
        os.kill(parent.pid, signum)
        assert parent.wait(timeout=DEADLINE_S) == -signum  # ended by the signal, as before
        end = time.monotonic() + DEADLINE_S
        while any(alive(w) for w in workers) and time.monotonic() < end:
            time.sleep(0.1)
        left = [w for w in workers if alive(w)]
        assert not left, f"workers {left} still alive {DEADLINE_S} s after the parent's {signum.name}"
    finally:
        for pid in [parent.pid, *(w for w in workers if alive(w))]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        parent.wait()


def test_a_process_whose_parent_is_gone_ends_at_once():
    """`die_with_parent` of a pid that is not this process's parent (it died before) ends the process."""
    child = os.fork()
    if child == 0:  # pragma: no cover (the child)
        die_with_parent(os.getppid() + 1_000_000)
        os._exit(0)
    _, status = os.waitpid(child, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 1


def test_the_portable_watch_ends_an_orphan():
    """Without prctl, `_watch_parent` ends a worker once its parent is gone (it was reparented)."""
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:  # pragma: no cover (the child, parent of the watcher)
        me = os.getpid()  # (taken before the fork: this process may be gone when the watcher starts)
        watcher = os.fork()
        if watcher == 0:
            os.close(r)
            os.write(w, str(os.getpid()).encode())
            os.close(w)
            _watch_parent(me)
            time.sleep(60)  # (only if the watch returned instead of ending the process)
        os._exit(0)
    os.close(w)
    watcher = int(os.read(r, 32))
    os.close(r)
    os.waitpid(middle, 0)
    end = time.monotonic() + DEADLINE_S
    while alive(watcher) and time.monotonic() < end:
        time.sleep(0.05)
    assert not alive(watcher)
