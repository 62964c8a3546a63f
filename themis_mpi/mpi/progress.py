"""Waiting without spinning, and a watchdog that names the ranks that stopped answering.

MPICH's blocking calls busy-poll; with more ranks than cores they starve the ranks that have
work, so every wait (data and control alike) tests its requests and sleeps in between, backing
off. While waiting, a rank answers liveness pings; when it sees no progress for `timeout_s`, it
pings everybody, names the silent ranks and raises `Stalled`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np
from mpi4py import MPI

from ..config import DEFAULT_TIMEOUT_S
from ..errors import Stalled
from ..watchdog import end_stalled_job

PING, PONG, BEAT = 7001, 7002, 7003
PING_GRACE_S = 2.0
SERVICE_EVERY_S = 1e-3  # a waiting rank answers pings at least this often (they wait PING_GRACE_S)
MIN_SLEEP_S = 20e-6
MAX_SLEEP_S = float(os.environ.get("THEMIS_MPI_MAX_SLEEP_US", "500")) * 1e-6
YIELDS = int(os.environ.get("THEMIS_MPI_YIELDS", "20"))
VIGIL_EVERY_S = 0.1  # how often a rank's vigil wakes (to beat, hear, answer pings)
VIGIL_IDLE_S = 0.5  # a rank whose wait loops have not paused for this long is busy on its own


class Watchdog:
    """Liveness pings and quiet waits for one communicator.

    Pings go point to point with their own tags on `comm`, which otherwise carries only
    collectives (they never match point-to-point messages). Every waiting loop answers pings
    (`service`), so a rank that is alive answers even while it waits itself; a thread may answer
    too (`Vigil`, `CartGrid.serving`): the pings are handled under a lock.

    Args:
        comm: the communicator whose ranks watch each other.
        timeout_s: seconds without progress before a wait raises `Stalled`.
    """

    def __init__(self, comm: MPI.Comm, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.comm = comm
        self.timeout_s = timeout_s
        self._byte = np.zeros(1, np.uint8)
        self._replies: list[MPI.Request] = []
        self._lock = threading.RLock()  # a ping is received by one thread only
        self.serviced_s = 0.0  # `time.monotonic()` of the last `service`
        self.paused_s = 0.0  # `time.monotonic()` of the last pause of a wait loop (`Backoff`)

    def service(self) -> None:
        """Answer every ping that has arrived."""
        self.serviced_s = time.monotonic()
        self.answer()

    def answer(self) -> None:
        """Answer every ping that has arrived, from any thread (`service` also notes the time)."""
        with self._lock:
            status = MPI.Status()
            while self.comm.Iprobe(MPI.ANY_SOURCE, PING, status):
                source = status.Get_source()
                self.comm.Recv(self._byte, source, PING)
                self._replies.append(self.comm.Isend(self._byte, source, PONG))
            if len(self._replies) > 64:
                self._replies = [r for r in self._replies if not r.Test()]

    def silent(self) -> list[int]:
        """Ranks that do not answer a ping within PING_GRACE_S."""
        me, size = self.comm.Get_rank(), self.comm.Get_size()
        waiting = set(range(size)) - {me}
        with self._lock:
            for rank in sorted(waiting):
                try:
                    self._replies.append(self.comm.Isend(self._byte, rank, PING))
                except MPI.Exception:
                    pass  # it stays in `waiting`
            deadline, status = time.monotonic() + PING_GRACE_S, MPI.Status()
            while waiting and time.monotonic() < deadline:
                try:
                    self.service()
                    while self.comm.Iprobe(MPI.ANY_SOURCE, PONG, status):
                        self.comm.Recv(self._byte, status.Get_source(), PONG)
                        waiting.discard(status.Get_source())
                except MPI.Exception:
                    break
                time.sleep(1e-3)
        return sorted(waiting)

    def lost_ranks(self) -> str:
        """Which ranks no longer answer, for a diagnosis."""
        silent = self.silent()
        if not silent:
            return "a peer died or stopped responding"
        return f"rank(s) {', '.join(map(str, silent))} did not answer (died or stopped)"

    def stalled(self, what: str) -> Stalled:
        """The `Stalled` error for a wait that saw no progress, naming the silent ranks."""
        return Stalled(
            f"rank {self.comm.Get_rank()}: no progress for {self.timeout_s:g} s {what}; {self.lost_ranks()}"
        )

    def backoff(self, describe: Callable[[], str], patient: bool = False) -> Backoff:
        """A pause helper for one waiting loop; `describe()` says what it waits for."""
        return Backoff(self, describe, patient)

    def wait(self, request: MPI.Request, what: str, patient: bool = False) -> None:
        """Complete a nonblocking request quietly (control collectives go through here).

        A `patient` wait (for a rank that is busy on its own, such as rank 0 writing a trace)
        gives up only when a peer stops answering pings, not after `timeout_s` of waiting.
        """
        backoff = self.backoff(lambda: f"in {what}", patient)
        try:
            while not request.Test():
                backoff.pause()
        except MPI.Exception as exc:
            raise Stalled(
                f"rank {self.comm.Get_rank()}: {what} failed ({exc.Get_error_string()}); a peer died"
            ) from None

    def allreduce(self, values, op: MPI.Op = MPI.SUM, what: str = "a reduction of results") -> np.ndarray:
        """Element-wise reduction of a small numpy array over the communicator."""
        values = np.ascontiguousarray(values)
        out = np.empty_like(values)
        self.wait(self.comm.Iallreduce(values, out, op=op), what)
        return out

    def close(self) -> None:
        """Complete the 1-byte replies (eager sends, already delivered); forget any other."""
        with self._lock:
            if self._replies:
                MPI.Request.Testall(self._replies)
            self._replies = []


class Vigil:
    """A thread that watches over a rank while it is busy on its own, from MPI_Init to the final barrier.

    The watchdog's waits name a stopped rank, but a rank only waits once it is set up: before
    that it builds the grid (MPI's blocking constructors), runs the model that times the run
    (every NPU's links under stragglers: minutes at 200 ranks on 2 cores), sets up its policy
    and trace. The vigils of the ranks form a ring: each sends a heartbeat to the next rank every
    `beat_s` and, while its own rank is busy (its wait loops have not paused for `VIGIL_IDLE_S`),
    ends the job (exit 3) naming the previous rank once no heartbeat came from it for
    `timeout_s`. So a rank stopped at any phase is named within the timeout. Heartbeats, not
    pings: a ping must be answered within `PING_GRACE_S`, and with 200 ranks busy on 2 cores a
    live rank's thread may get the processor (and the GIL) only every second or so.

    Meanwhile the vigil also answers the pings of the other ranks' waits while its rank is busy
    (on every watchdog it is given), as `CartGrid.serving` does.

    Args:
        world: the watchdog on COMM_WORLD, whose communicator carries the heartbeats.
        timeout_s: seconds without a heartbeat, while busy, before the job ends.
    """

    def __init__(self, world: Watchdog, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.world, self.timeout_s = world, timeout_s
        self.beat_s = min(1.0, timeout_s / 5)
        comm = world.comm
        self.rank, size = comm.Get_rank(), comm.Get_size()
        self.next, self.previous = (self.rank + 1) % size, (self.rank - 1) % size
        self.watchdogs: list[Watchdog] = [world]
        self._byte = np.zeros(1, np.uint8)
        self._beats: list[MPI.Request] = []  # heartbeats in flight
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="themis-mpi-vigil", daemon=True)
        self._thread.start()

    def add(self, watchdogs: Sequence[Watchdog]) -> None:
        """Also answer these watchdogs' pings while the rank is busy (the grid's, once built)."""
        self.watchdogs = [*self.watchdogs, *watchdogs]

    def _run(self) -> None:
        comm, byte, status = self.world.comm, self._byte, MPI.Status()
        beats = self._beats
        heard = beaten = time.monotonic()
        while not self._stop.wait(VIGIL_EVERY_S):
            now = time.monotonic()
            if now - beaten >= self.beat_s:
                beats[:] = [r for r in beats if not r.Test()]
                beats.append(comm.Isend(byte, self.next, BEAT))
                beaten = now
            while comm.Iprobe(self.previous, BEAT, status):
                comm.Recv(byte, self.previous, BEAT)
                heard = now
            if any(now - w.paused_s < VIGIL_IDLE_S for w in self.watchdogs):
                heard = max(heard, now)  # waiting: the wait loop watches, and answers its own pings
                continue
            for watchdog in self.watchdogs:
                watchdog.answer()
            if now - heard >= self.timeout_s:
                end_stalled_job(comm, self.diagnosis(now - heard), alone=True)  # (its one successor)

    def diagnosis(self, quiet_s: float) -> str:
        """The one line naming the previous rank, silent for `quiet_s` while this one was busy."""
        return (
            f"rank {self.rank}: no heartbeat from rank {self.previous} for {quiet_s:.0f} s while busy on "
            f"its own (set-up, a model run); rank(s) {self.previous} did not answer (died or stopped)"
        )

    def close(self) -> None:
        """Stop the thread (before the final barrier: a heartbeat to a rank past it could hang)."""
        self._stop.set()
        self._thread.join()

    def drain(self, limit_s: float = 1.0) -> None:
        """After the final barrier: take the heartbeats left for this rank, see its own delivered.

        A message left unreceived, or a send left pending, at MPI_Finalize can leave a rank there.
        """
        comm, status, deadline = self.world.comm, MPI.Status(), time.monotonic() + limit_s
        while True:
            while comm.Iprobe(self.previous, BEAT, status):
                comm.Recv(self._byte, self.previous, BEAT)
            if MPI.Request.Testall(self._beats) or time.monotonic() > deadline:
                return
            time.sleep(1e-3)


class Backoff:
    """Idle between two tests without spinning, and notice when nothing moves any more.

    The first `YIELDS` pauses give the core away (``sched_yield``), which costs little when a
    peer is runnable; after that the rank sleeps from 20 us, doubling up to `MAX_SLEEP_S`.
    `reset` after progress. A pause more than the timeout after the last reset raises `Stalled`,
    or, when `patient`, pings every rank and raises only if one stays silent.
    """

    def __init__(self, watchdog: Watchdog, describe: Callable[[], str], patient: bool = False):
        self.watchdog, self.describe, self.patient = watchdog, describe, patient
        self.reset()

    def reset(self) -> None:
        """Start over after progress."""
        self.idle, self.sleep_s, self.since = 0, MIN_SLEEP_S, time.monotonic()

    def pause(self, limit_s: float | None = None) -> None:
        """Yield or sleep once; `limit_s` caps the sleep (a wall-clock deadline is near).

        Pings are answered every `SERVICE_EVERY_S`, not at every pause: a probe costs as much as
        the test of all the rank's requests, and pauses come many per step.
        """
        now = self.watchdog.paused_s = time.monotonic()
        if now - self.watchdog.serviced_s >= SERVICE_EVERY_S:
            self.watchdog.service()
        if now - self.since > self.watchdog.timeout_s:
            if not self.patient:
                raise self.watchdog.stalled(self.describe())
            silent = self.watchdog.silent()
            if silent:
                me, waited = self.watchdog.comm.Get_rank(), self.watchdog.timeout_s
                raise Stalled(
                    f"rank {me}: waited {waited:g} s {self.describe()}; "
                    f"rank(s) {', '.join(map(str, silent))} did not answer (died or stopped)"
                )
            self.reset()
        self.idle += 1
        if self.idle <= YIELDS:
            os.sched_yield()
            return
        time.sleep(self.sleep_s if limit_s is None else max(0.0, min(self.sleep_s, limit_s)))
        self.sleep_s = min(2 * self.sleep_s, MAX_SLEEP_S)
