"""Write the MSCCL-IR fixtures of tests/data/msccl/: small algorithms written step by step, by hand.

Each exercises step types the shared files do not (docs/custom-algorithms.md walks through
them): ``rcs`` (a ring all-gather), ``rrs`` (a ring reduce-scatter), ``rrcs`` (a ring
all-reduce with the fused steps NCCL's ring uses), ``cpy`` (an all-to-all out of place), ``re``
and ``nop`` (a one-shot all-reduce that reduces from scratch), and the worked example: a
two-channel counter-rotating ring all-reduce (on 8 GPUs, and on 4 for a FullyConnected dim).
Every step, wait and ``hasdep`` is spelled out
here; nothing is derived. ``python scripts/msccl_fixtures.py`` rewrites them (``--out DIR``
elsewhere); tests/test_msccl.py checks that the shipped files are what this writes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from themis_mpi.msccl.ir import Algorithm, Gpu, Step, Threadblock, write_algorithm

ROOT = Path(__file__).resolve().parent.parent


def step(s: int, type_: str, buf: str, off: int, cnt: int = 1, dep=(-1, -1), hasdep=False, src=None) -> Step:
    """A step on `buf[off:off+cnt]` (``src``: another source buffer and offset, as ``(buf, off)``)."""
    sbuf, soff = src or (buf, off)
    return Step(s, type_, sbuf, soff, buf, off, cnt, dep[0], dep[1], hasdep)


def ring(p: int, g: int, types: list[str], first: int, step_dir: int, buf: str, base: int = 0) -> list[Step]:
    """One GPU's steps of a ring: the k-th step works on chunk ``base + (g + step_dir*(first - k)) mod p``."""
    return [step(k, t, buf, base + (g + step_dir * (first - k)) % p) for k, t in enumerate(types)]


def ring_algorithm(name: str, coll: str, buf: str, types: list[str], first: int, p: int = 4) -> Algorithm:
    """A one-channel ring (send to g+1, receive from g-1) in place, P chunks."""
    gpus = []
    for g in range(p):
        tb = Threadblock(0, (g + 1) % p, (g - 1) % p, 0, tuple(ring(p, g, types, first, 1, buf)))
        used = (p, 0) if buf == "i" else (0, p)
        gpus.append(Gpu(g, used[0], used[1], 0, (tb,)))
    return Algorithm(name, coll, p, 1, p, "Simple", True, False, tuple(gpus))


def allreduce_types(p: int) -> list[str]:
    """NCCL's ring all-reduce: send, recv-reduce-send, recv-reduce-copy-send, recv-copy-send, recv."""
    return ["s"] + ["rrs"] * (p - 2) + ["rrcs"] + ["rcs"] * (p - 2) + ["r"]


def two_channel_ring(p: int = 8) -> Algorithm:
    """The worked example: two rings, one each way, half the chunks each (2P chunks, in place)."""
    gpus = []
    for g in range(p):
        types = allreduce_types(p)
        cw = Threadblock(0, (g + 1) % p, (g - 1) % p, 0, tuple(ring(p, g, types, -1, 1, "i")))
        ccw = Threadblock(1, (g - 1) % p, (g + 1) % p, 1, tuple(ring(p, g, types, -1, -1, "i", p)))
        gpus.append(Gpu(g, 2 * p, 0, 0, (cw, ccw)))
    return Algorithm(f"ring_2ch_allreduce_{p}", "allreduce", p, 2, 2 * p, "Simple", True, False, tuple(gpus))


def every_ring_allreduce() -> Algorithm:
    """NCCL-like channels over every link of a FullyConnected dim of 4: every directed ring, one channel each.

    The three rings through all four GPUs (0123, 0132, 0213), each both ways: six channels of 4
    chunks each (24 chunks, in place). Each directed link is in two of
    them (K4's twelve links cannot split into three directed rings: Tillson's theorem), so every
    link carries the same share.
    """
    p, rings = 4, [(0, 1, 2, 3), (0, 1, 3, 2), (0, 2, 1, 3)]
    orders = [r for ring_ in rings for r in (ring_, ring_[:1] + ring_[:0:-1])]
    tbs: list[list[Threadblock]] = [[] for _ in range(p)]
    for c, order in enumerate(orders):
        for i, g in enumerate(order):  # position i: chunk c*P + (i - 1 - k) mod P at its step k
            steps = tuple(step(k, t, "i", c * p + (i - 1 - k) % p) for k, t in enumerate(allreduce_types(p)))
            tbs[g].append(Threadblock(c, order[(i + 1) % p], order[(i - 1) % p], c, steps))
    gpus = tuple(Gpu(g, len(orders) * p, 0, 0, tuple(tbs[g])) for g in range(p))
    n = len(orders)
    return Algorithm(f"ring_{n}ch_allreduce_{p}", "allreduce", p, n, n * p, "Simple", True, False, gpus)


def alltoall_copy(p: int = 4) -> Algorithm:
    """All-to-all out of place: a local ``cpy`` of the own block, one threadblock per peer."""
    gpus = []
    for g in range(p):
        tbs = [Threadblock(0, -1, -1, 0, (step(0, "cpy", "o", g, src=("i", g)),))]
        for q in (q for q in range(p) if q != g):
            steps = (step(0, "s", "o", g, src=("i", q)), step(1, "r", "o", q))
            tbs.append(Threadblock(len(tbs), q, q, 0, steps))
        gpus.append(Gpu(g, p, p, 0, tuple(tbs)))
    return Algorithm("alltoall_copy_4", "alltoall", p, 1, p, "Simple", False, True, tuple(gpus))


def one_shot_reduce(p: int = 4) -> Algorithm:
    """All-reduce in one shot: every GPU sends its whole input into each peer's scratch, then ``re``.

    The reducing threadblock must wait for every receive (they fill the scratch) and every send
    (they read the input it overwrites): one wait on its first ``re``, the others on ``nop``s.
    """
    gpus = []
    for g in range(p):
        peers = [q for q in range(p) if q != g]
        tbs = []
        for j, q in enumerate(peers):
            steps = (step(0, "s", "s", p * j, p, src=("i", 0)), step(1, "r", "s", p * j, p, hasdep=True))
            tbs.append(Threadblock(j, q, q, 0, steps))
        reduce = [step(k, "nop", "o", -1, 0, dep=(j, 1), src=("i", -1)) for k, j in enumerate(range(p - 2))]
        for j in range(p - 1):
            dep = (p - 2, 1) if j == 0 else (-1, -1)
            reduce.append(step(len(reduce), "re", "i", 0, p, dep=dep, src=("s", p * j)))
        tbs.append(Threadblock(p - 1, -1, -1, 0, tuple(reduce)))
        gpus.append(Gpu(g, p, 0, p * (p - 1), tuple(tbs)))
    return Algorithm("one_shot_allreduce_4", "allreduce", p, 1, p, "Simple", True, False, tuple(gpus))


def fixtures() -> dict[str, Algorithm]:
    """Every fixture by file name."""
    return {
        "ring_allgather_rcs_4.xml": ring_algorithm(
            "ring_allgather_rcs_4", "allgather", "o", ["s", "rcs", "rcs", "r"], 0
        ),
        "ring_reducescatter_rrs_4.xml": ring_algorithm(
            "ring_reducescatter_rrs_4", "reduce_scatter", "i", ["s", "rrs", "rrs", "rrc"], -1
        ),
        "ring_allreduce_rrcs_4.xml": ring_algorithm(
            "ring_allreduce_rrcs_4", "allreduce", "i", allreduce_types(4), -1
        ),
        "alltoall_cpy_4.xml": alltoall_copy(),
        "one_shot_allreduce_re_nop_4.xml": one_shot_reduce(),
        "ring_2ch_allreduce_8.xml": two_channel_ring(),
        "ring_2ch_allreduce_4.xml": two_channel_ring(
            4
        ),  # (both ways round a FullyConnected dim's neighbours)
        "ring_6ch_allreduce_4.xml": every_ring_allreduce(),  # (every link of a FullyConnected dim)
    }


def main(argv: list[str] | None = None) -> int:
    """Write every fixture; print where."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "msccl"), help="folder to write to")
    args = ap.parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for name, algo in fixtures().items():
        write_algorithm(str(Path(args.out) / name), algo)
    print(f"# wrote {len(fixtures())} fixtures to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
