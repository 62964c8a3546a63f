"""Property-based rules for the engine, the policies and the model, on random topologies."""

import math

from hypothesis import given
from hypothesis import strategies as st

from themis_mpi.collectives import (
    DTYPES,
    PER_DIM_OPS,
    PRICED_ITEMSIZE,
    Collective,
    active_dims,
    chunk_stages,
    split_bounds,
)
from themis_mpi.config import RunConfig
from themis_mpi.cost import CostModel
from themis_mpi.policies import chunk_orders
from themis_mpi.results import ideal_time_us
from themis_mpi.run.collective import model_collective
from themis_mpi.topology import Dim, Topology, is_power_of_two


@st.composite
def topologies(draw, max_dims=5, max_size=16):
    """1 to 5 dims of every kind and size 1 to 16, with any algorithm the size allows."""
    dims = []
    for _ in range(draw(st.integers(1, max_dims))):
        p = draw(st.integers(1, max_size))
        algorithms = ["ring", "direct"] + (["halving_doubling"] if is_power_of_two(p) else [])
        dims.append(
            Dim(
                draw(st.sampled_from(["Ring", "FullyConnected", "Switch"])),
                p,
                draw(st.sampled_from([12.5, 50, 100, 175, 375])),
                draw(st.sampled_from([0, 1, 20, 700, 1700])),
                draw(st.sampled_from(algorithms)),
            )
        )
    return Topology(tuple(dims))


@st.composite
def runs(draw):
    topo = draw(topologies())
    n = len(topo.dims)
    involved = tuple(sorted(draw(st.sets(st.integers(0, n - 1), min_size=1))))
    coll = Collective(
        draw(st.sampled_from(PER_DIM_OPS)),
        draw(st.integers(1, 300_000)),
        draw(st.sampled_from(DTYPES)),
        draw(st.integers(1, 96)),
        involved,
    )
    return (
        topo,
        coll,
        draw(st.sampled_from(["baseline", "themis"])),
        draw(st.sampled_from(["fifo", "scf"])),
        draw(st.integers(1, 3)),
        draw(st.sampled_from([0.0, 10.0])),
    )


def expected_bytes(topo, coll, orders) -> int:
    """Bytes one NPU must send, from the chunk sizes and orders alone (blocks padded to ceil(n/P)).

    Timing prices bytes: the chunks are the nominal bytes split at the granularity of a priced word.
    """
    bounds = split_bounds(max(1, coll.size_bytes // PRICED_ITEMSIZE), coll.n_chunks)
    total = 0
    for k in range(coll.n_chunks):
        n = int(bounds[k + 1] - bounds[k])
        dims = active_dims(topo, coll, orders[k])
        if coll.op == "all_to_all":
            total += sum((topo.dims[d].npus - 1) * -(-n // topo.dims[d].npus) for d in dims)
            continue
        moved = 0
        for d in dims[::-1] if coll.op == "all_gather" else dims:
            p = topo.dims[d].npus
            moved += (p - 1) * -(-n // p)
            n = -(-n // p)
        total += 2 * moved if coll.op == "all_reduce" else moved
    return total * PRICED_ITEMSIZE


@given(runs())
def test_every_run_completes_conserves_bytes_and_respects_the_bounds(case):
    """Random runs finish every stage, send exactly the required bytes, and obey the lower bounds."""
    topo, coll, policy, intra, active, delay = case
    row, engine = model_collective(
        topo,
        coll,
        policy,
        RunConfig(intra=intra, active_per_dim=active, endpoint_delay_ns=delay, network="ideal"),
    )
    run = engine.collectives[0]
    orders = run.orders
    cost = CostModel(topo, PRICED_ITEMSIZE, delay)
    # completes: every stage of every chunk ran, in order
    assert len(engine.records) == sum(len(s) for s in run.stages)
    assert math.isfinite(run.end_ns) and run.chunks_left == 0
    by_chunk = {}
    for r in engine.records:
        by_chunk.setdefault(r.stage.chunk, []).append(r)
    for recs in by_chunk.values():
        recs.sort(key=lambda r: r.stage.index)
        assert all(b.start_ns >= a.end_ns for a, b in zip(recs, recs[1:]))
    # conserves bytes
    sent = sum(d.bytes for d in row.dims)
    assert sent == expected_bytes(topo, coll, orders)
    n = math.prod(topo.dims[d].npus for d in coll.dims)
    need = (2 if coll.op == "all_reduce" else 1) * coll.size_bytes * (n - 1) / n
    assert sent >= need * (1 - 1e-12) - coll.itemsize * coll.n_chunks * 64
    # cost model: each stage lasts exactly its cost; bounds on the collective time
    for r in engine.records:
        s = r.stage
        assert r.end_ns == cost.stage_end_ns(s.dim, s.op, s.full_elems, r.start_ns)
    time_us = row.time_us
    assert all(d.busy_us <= active * time_us * (1 + 1e-9) + 1e-9 for d in row.dims)
    assert time_us * active >= ideal_time_us(coll.op, coll.size_bytes, topo, coll.dims) * (1 - 1e-9) - 1e-9
    # never more stages at once on a dim than it has slots
    for d in range(len(topo.dims)):
        edges = sorted(
            [(r.start_ns, 1) for r in engine.records if r.stage.dim == d]
            + [(r.end_ns, -1) for r in engine.records if r.stage.dim == d]
        )
        level = 0
        for _, step in edges:
            level += step
            assert level <= active


@given(
    topologies(),
    st.integers(1, 2**34),
    st.integers(1, 256),
    st.sampled_from(["all_reduce", "reduce_scatter", "all_gather"]),
)
def test_themis_orders_are_permutations_and_start_with_the_baseline(topo, size, chunks, op):
    """Every Themis order is a permutation of the dims, and the first chunk keeps the baseline."""
    dims = tuple(range(len(topo.dims)))
    orders = chunk_orders("themis", topo, op, size, chunks, dims)
    base = chunk_orders("baseline", topo, op, size, 1, dims)[0]
    assert all(sorted(o) == list(dims) for o in orders.tolist())
    assert list(orders[0]) == list(base)


@given(topologies(max_size=8), st.integers(1, 10_000), st.integers(1, 40))
def test_stage_sizes_shrink_by_each_dim_and_grow_back(topo, count, chunks):
    """An all-reduce chunk's RS stages shrink by each dim's size; its AG stages mirror them."""
    coll = Collective("all_reduce", count, "float32", chunks, tuple(range(len(topo.dims))))
    stages = chunk_stages(topo, coll, 0, 0, count, list(range(len(topo.dims))))
    half = len(stages) // 2
    rs, ag = stages[:half], stages[half:]
    assert [s.op for s in rs] == ["RS"] * half and [s.op for s in ag] == ["AG"] * half
    assert [(s.dim, s.full_elems) for s in rs] == [(s.dim, s.full_elems) for s in reversed(ag)]
    for a, b in zip(rs, rs[1:]):
        assert b.full_elems == -(-a.full_elems // topo.dims[a.dim].npus)
