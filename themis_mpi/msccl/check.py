"""The checker: an MSCCL algorithm that could not run is refused before anything runs.

In order, each stage only once the one before it found nothing (docs/custom-algorithms.md lists
the messages):

1. **Structure**: GPU and threadblock ids, peers and channels, one threadblock per (peer,
   channel) and direction, steps numbered in order, a send peer for every send and a receive
   peer for every receive, offsets and counts within the buffers (the sizes the file declares,
   which may not exceed the collective's), dependencies that name an existing step that signals
   (``hasdep``), and RCCL's rule that nops carrying waits are followed by a step with a wait.
2. **Messages**: per (sender, receiver, channel), the k-th send pairs with the k-th receive, with
   the same count.
3. **Dependencies** inside each GPU (program order and waits) are acyclic.
4. **Deadlock**: the abstract execution (`program.schedule`) runs every threadblock as far as it
   can; a threadblock that waits forever is named with the cycle of waits it is part of.
5. **Races**: two steps of different threadblocks of a GPU that touch the same chunk, one of
   them writing, with neither waiting (through any chain of waits and messages) for the other:
   their result would depend on timing. Checked with vector clocks over the schedule, for each
   placement (in place, out of place) the file declares.

Every violation is one line naming the GPU, threadblock and step; `require` raises the first as
a `UsageError` (exit 2 on the CLI).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import UsageError
from .ir import BUFFER_NAMES, MAX_CHUNKS, NOP, READS_SRC, REDUCE, WRITES_DST, Algorithm, where
from .program import GpuProgram, Op, connection, programs, schedule, signal_step, views

MAX_REPORTED = 20  # violations kept per stage
MAX_THREADBLOCKS = 4096  # of all GPUs: the race check keeps a clock of this many entries per threadblock
MAX_BUFFER_CHUNKS = 2**22  # of all GPUs' buffers: what the proofs allocate


@dataclass(frozen=True)
class Violation:
    """One thing wrong, and where: a GPU, a threadblock and a step (None where it is wider)."""

    gpu: int | None
    tb: int | None
    step: int | None
    what: str

    def __str__(self) -> str:
        if self.gpu is None:
            return self.what
        return f"{where(self.gpu, self.tb, self.step)}: {self.what}"


def _structure_algo(algo: Algorithm) -> list[Violation]:
    out = []
    coll = algo.collective
    if coll.per_gpu and algo.nchunksperloop % algo.ngpus:
        out.append(
            Violation(
                None,
                None,
                None,
                f"a {coll.name} needs nchunksperloop ({algo.nchunksperloop}) "
                f"to be a multiple of ngpus ({algo.ngpus})",
            )
        )
    ids = [g.id for g in algo.gpus]
    for g in sorted(set(ids)):
        if ids.count(g) > 1:
            out.append(Violation(g, None, None, "appears more than once"))
        if not 0 <= g < algo.ngpus:
            out.append(Violation(g, None, None, f"is not below ngpus ({algo.ngpus})"))
    missing = sorted(set(range(algo.ngpus)) - set(ids))
    if missing:
        out.append(Violation(None, None, None, f"GPU {missing[0]} is missing (ngpus {algo.ngpus})"))
    tbs = sum(len(g.threadblocks) for g in algo.gpus)
    if tbs > MAX_THREADBLOCKS:
        out.append(
            Violation(None, None, None, f"{tbs} threadblocks in all; the checker takes {MAX_THREADBLOCKS}")
        )
    chunks = sum(sum(coll.chunks(algo.nchunksperloop, algo.ngpus)) + max(0, g.s_chunks) for g in algo.gpus)
    if chunks > MAX_BUFFER_CHUNKS:
        out.append(
            Violation(
                None,
                None,
                None,
                f"the GPUs' buffers hold {chunks} chunks in all; the checker takes {MAX_BUFFER_CHUNKS}",
            )
        )
    return out


def _structure_gpu(algo: Algorithm, gi: int) -> list[Violation]:
    gpu = algo.gpus[gi]
    out = []
    n_in, n_out = algo.collective.chunks(algo.nchunksperloop, algo.ngpus)
    for key, declared, real in (("i_chunks", gpu.i_chunks, n_in), ("o_chunks", gpu.o_chunks, n_out)):
        if not 0 <= declared <= real:
            out.append(
                Violation(
                    gpu.id,
                    None,
                    None,
                    f"{key} {declared} is not between 0 and the {real} chunks "
                    f"of a {algo.coll}'s buffer (nchunksperloop {algo.nchunksperloop})",
                )
            )
    if not 0 <= gpu.s_chunks <= MAX_CHUNKS:
        out.append(
            Violation(gpu.id, None, None, f"s_chunks {gpu.s_chunks} is not between 0 and {MAX_CHUNKS}")
        )
    ids = [tb.id for tb in gpu.threadblocks]
    if ids != list(range(len(ids))):
        gap = next(i for i in range(len(ids) + 1) if i >= len(ids) or ids[i] != i)
        out.append(
            Violation(
                gpu.id,
                None,
                None,
                f"threadblock ids are not 0..{len(ids) - 1}: threadblock {gap} is missing or repeated",
            )
        )
        return out
    seen: dict[tuple[str, int, int], int] = {}
    for tb in gpu.threadblocks:
        for role, peer in (("send", tb.send), ("recv", tb.recv)):
            if peer == gpu.id or not -1 <= peer < algo.ngpus:
                out.append(Violation(gpu.id, tb.id, None, f"{role} peer {peer} is not -1 or another GPU"))
            elif peer >= 0 and (role, peer, tb.chan) in seen:
                other = seen[(role, peer, tb.chan)]
                out.append(
                    Violation(
                        gpu.id,
                        tb.id,
                        None,
                        f"threadblock {other} already has {role} peer {peer} "
                        f"on channel {tb.chan} (one threadblock per peer and channel)",
                    )
                )
            else:
                seen[(role, peer, tb.chan)] = tb.id
        if not 0 <= tb.chan < algo.nchannels:
            out.append(
                Violation(gpu.id, tb.id, None, f"channel {tb.chan} is not below nchannels ({algo.nchannels})")
            )
        out += _structure_steps(algo, gi, tb.id)
    return out


def _structure_steps(algo: Algorithm, gi: int, ti: int) -> list[Violation]:
    gpu = algo.gpus[gi]
    tb = gpu.threadblocks[ti]
    out = []
    pending_nop_waits = False
    previous = None  # the last step that is not a nop (RCCL's chain of fused reductions)
    for k, st in enumerate(tb.steps):
        bad = []
        if st.s != k:
            bad.append(f"is numbered s={st.s} at position {k} (steps are numbered 0, 1, ... in order)")
        if st.type != NOP and st.cnt < 1:
            bad.append(f"cnt {st.cnt} is not positive")
        if st.sends and tb.send < 0:
            bad.append(f"a {st.type} sends, but the threadblock has no send peer")
        if st.receives and tb.recv < 0:
            bad.append(f"a {st.type} receives, but the threadblock has no recv peer")
        for role, buffer, offset, used in (
            ("src", st.srcbuf, st.srcoff, st.type in READS_SRC),
            ("dst", st.dstbuf, st.dstoff, st.type in WRITES_DST),
        ):
            size = gpu.chunks(buffer)
            if used and st.cnt >= 1 and not (0 <= offset and offset + st.cnt <= size):
                bad.append(
                    f"{role}off {offset} + cnt {st.cnt} is outside the {BUFFER_NAMES[buffer]} buffer "
                    f"of {size} chunks"
                )
        if st.depid >= 0:
            bad += _dependency(algo, gi, ti, k)
        continuation = (
            st.type == REDUCE
            and st.depid < 0
            and previous is not None
            and previous.type == REDUCE
            and not previous.hasdep
            and (previous.dstbuf, previous.dstoff, previous.srcbuf) == (st.dstbuf, st.dstoff, st.srcbuf)
        )
        if st.type == NOP:
            pending_nop_waits = pending_nop_waits or st.depid >= 0
        else:
            if pending_nop_waits and st.depid < 0 and not continuation:
                bad.append(
                    "the nop steps before it wait for other threadblocks but it does not "
                    "(RCCL's parser refuses this: a nop's wait joins the next step's)"
                )
            pending_nop_waits = pending_nop_waits and continuation
            previous = st
        out += [Violation(gpu.id, tb.id, k, b) for b in bad]
    return out


def _dependency(algo: Algorithm, gi: int, ti: int, k: int) -> list[str]:
    gpu = algo.gpus[gi]
    st = gpu.threadblocks[ti].steps[k]
    if st.depid >= len(gpu.threadblocks):
        return [f"depid {st.depid} is not a threadblock of the GPU"]
    target = gpu.threadblocks[st.depid]
    if not 0 <= st.deps < len(target.steps):
        return [f"deps {st.deps} is not a step of threadblock {st.depid} ({len(target.steps)} steps)"]
    if st.depid == ti and st.deps >= k:
        return [f"waits for step {st.deps} of its own threadblock, which comes after it"]
    if signal_step(algo, gi, st.depid, st.deps) is None:
        return [
            f"waits for threadblock {st.depid} step {st.deps}, which never signals (hasdep is 0 on it "
            "and on every later step)"
        ]
    return []


def structure(algo: Algorithm) -> list[Violation]:
    """Stage 1: ids, peers, channels, numbering, bounds and dependencies (module doc)."""
    out = _structure_algo(algo)
    if out:
        return out
    for gi in range(len(algo.gpus)):
        out += _structure_gpu(algo, gi)
    return out


def _times(n: int) -> str:
    return {0: "never", 1: "once"}.get(n, f"{n} times")


def messages(progs: tuple[GpuProgram, ...]) -> list[Violation]:
    """Stage 2: per (sender, receiver, channel), sends and receives pair in order, counts equal."""
    sends: dict[tuple[int, int, int], list[Op]] = {}
    recvs: dict[tuple[int, int, int], list[Op]] = {}
    for p in progs:
        for op in p.ops():
            if op.send_peer >= 0:
                sends.setdefault((p.gpu, op.send_peer, op.chan), []).append(op)
            if op.recv_peer >= 0:
                recvs.setdefault((op.recv_peer, p.gpu, op.chan), []).append(op)
    out = []
    for key in sorted(set(sends) | set(recvs)):
        a, b, c = key
        s, r = sends.get(key, []), recvs.get(key, [])
        for x, y in zip(s, r):
            if x.count != y.count:
                out.append(
                    Violation(
                        b,
                        y.tb,
                        y.step,
                        f"receives {y.count} chunks from GPU {a} on channel {c}, but "
                        f"the matching send ({where(a, x.tb, x.step)}) sends {x.count}",
                    )
                )
        tally = f"GPU {a} sends {_times(len(s))} to GPU {b} on channel {c}, which receives {_times(len(r))}"
        if len(s) > len(r):
            x = s[len(r)]
            out.append(
                Violation(
                    a, x.tb, x.step, f"send to GPU {b} on channel {c} has no matching receive ({tally})"
                )
            )
        elif len(r) > len(s):
            y = r[len(s)]
            out.append(
                Violation(
                    b, y.tb, y.step, f"receive from GPU {a} on channel {c} has no matching send ({tally})"
                )
            )
    return out[:MAX_REPORTED]


def _blocker(prog: GpuProgram, op: Op, done: list[int]) -> tuple[int, int] | None:
    """The (threadblock, step) of the same GPU an op still waits for, if any."""
    return next(((t, s) for t, s in op.waits if done[t] <= s), None)


def cycles(progs: tuple[GpuProgram, ...]) -> list[Violation]:
    """Stage 3: the waits inside each GPU, with program order, form no cycle."""
    out = []
    for p in progs:
        done = [0] * len(p.threadblocks)
        moved = True
        while moved:  # run what needs only this GPU's own steps
            moved = False
            for t, tb in enumerate(p.threadblocks):
                while done[t] < len(tb) and _blocker(p, tb[done[t]], done) is None:
                    done[t] += 1
                    moved = True
        blocked = {t: done[t] for t, tb in enumerate(p.threadblocks) if done[t] < len(tb)}
        if not blocked:
            continue
        t = min(blocked)
        path: list[tuple[int, int]] = []
        while (t, blocked[t]) not in path:
            path.append((t, blocked[t]))
            t = _blocker(p, p.threadblocks[t][blocked[t]], done)[0]  # type: ignore[index]
        loop = path[path.index((t, blocked[t])) :]
        text = " -> ".join(f"threadblock {u} step {s}" for u, s in loop + loop[:1])
        out.append(
            Violation(
                p.gpu,
                loop[0][0],
                loop[0][1],
                f"dependency cycle: {text} (each waits for the next, "
                "by a dependency or an earlier step of its threadblock)",
            )
        )
    return out


def deadlock(progs: tuple[GpuProgram, ...]) -> list[Violation]:
    """Stage 4: every threadblock finishes in the abstract execution, or the cycle of waits is named."""
    stuck = schedule(progs).stuck
    if not stuck:
        return []
    sender: dict[tuple[int, int, int, int], tuple[int, int, int]] = {}
    for p in progs:
        for op in p.ops():
            if op.send_peer >= 0:
                sender[connection(op, p.gpu, True)] = (p.gpu, op.tb, op.step)

    def blocked_by(g: int, t: int) -> tuple[int, int]:
        op = progs[g].threadblocks[t][stuck[(g, t)]]
        for u, s in op.waits:
            if (g, u) in stuck and stuck[(g, u)] <= s:
                return g, u
        a, u, _ = sender[connection(op, g, False)]
        return a, u

    node = min(stuck)
    path: list[tuple[int, int]] = []
    while node not in path:
        path.append(node)
        node = blocked_by(*node)
    loop = path[path.index(node) :]
    text = " -> ".join(where(g, t, stuck[(g, t)]) for g, t in loop + loop[:1])
    g, t = loop[0]
    return [
        Violation(
            g,
            t,
            stuck[(g, t)],
            f"waits forever ({len(stuck)} threadblocks stuck): {text}, each "
            "waiting for a message or a dependency from the next",
        )
    ]


def races(algo: Algorithm, progs: tuple[GpuProgram, ...], inplace: bool) -> list[Violation]:
    """Stage 5: unordered conflicting accesses of a GPU's memory (module doc), for one placement."""
    order = schedule(progs).order
    tbs = [(p.gpu, t) for p in progs for t in range(len(p.threadblocks))]
    index = {key: i for i, key in enumerate(tbs)}
    clocks = np.zeros((len(index), len(index)), dtype=np.int32)
    saved: dict[tuple[int, int, int], np.ndarray] = {}
    uses: dict[tuple[int, int, int], int] = {}  # waits still to read a saved clock
    for p in progs:
        for op in p.ops():
            for u, s in op.waits:
                uses[(p.gpu, u, s)] = uses.get((p.gpu, u, s), 0) + 1
    in_flight: dict[tuple[int, int, int, int], np.ndarray] = {}
    maps = [views(algo, p.gpu, inplace) for p in progs]
    last_write: dict[tuple[int, str, int], tuple[int, int, str]] = {}
    reads: dict[tuple[int, str, int], list[tuple[int, int, str]]] = {}
    out: list[Violation] = []
    for g, t, k in order:
        op = progs[g].threadblocks[t][k]
        me = index[(g, t)]
        clock = clocks[me]
        for u, s in op.waits:
            np.maximum(clock, saved[(g, u, s)], out=clock)
            uses[(g, u, s)] -= 1
            if not uses[(g, u, s)]:
                del saved[(g, u, s)]
        if op.recv_peer >= 0:
            np.maximum(clock, in_flight.pop(connection(op, g, False)), out=clock)
        clock[me] = k + 1
        here = f"threadblock {t} step {k}"
        accesses = [] if op.src is None else [(op.src, False)]
        if op.dst is not None:
            accesses += [(op.dst, False), (op.dst, True)] if op.type == REDUCE else [(op.dst, True)]
        for ref, writes in accesses:
            view = maps[g][ref.buffer]
            for c in range(ref.offset, ref.offset + ref.count):
                key = (g, view.storage, view.base + c)
                name = f"{BUFFER_NAMES[ref.buffer]} chunk {c}"
                earlier = [last_write[key]] if key in last_write else []
                if writes:
                    earlier += reads.get(key, [])
                for who, count, what in earlier:
                    if who != me and clock[who] < count and len(out) < MAX_REPORTED:
                        verb = "writes" if writes else "reads"
                        out.append(
                            Violation(
                                g,
                                t,
                                k,
                                f"{verb} {name}, which {what} also touches with no wait "
                                f"between them (a race{', in place' if inplace else ''})",
                            )
                        )
                if writes:
                    last_write[key] = (me, k + 1, here)
                    reads.pop(key, None)
                else:
                    reads.setdefault(key, []).append((me, k + 1, here))
        if uses.get((g, t, k)):
            saved[(g, t, k)] = clock.copy()
        if op.send_peer >= 0:
            in_flight[connection(op, g, True)] = clock.copy()
    return out


def check(algo: Algorithm) -> list[Violation]:
    """Every violation of the first stage that finds any (module doc); empty when the file is sound."""
    found = structure(algo)
    if found:
        return found[:MAX_REPORTED]
    progs = programs(algo)
    for stage in (messages, cycles, deadlock):
        found = stage(progs)
        if found:
            return found
    for inplace in algo.placements:
        found = races(algo, progs, inplace)
        if found:
            return found
    return []


def require(algo: Algorithm, source: str) -> tuple[GpuProgram, ...]:
    """The GPUs' programs of a sound algorithm; the first violation as one `UsageError` line otherwise."""
    found = check(algo)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise UsageError(f"{source}: {found[0]}{more}")
    return programs(algo)
