"""Serial rules for chunking, stage lists and the closed-form result check."""

import numpy as np
import pytest

from themis_mpi.collectives import Collective, chunk_stages, split_bounds
from themis_mpi.policies import chunk_orders
from themis_mpi.topology import parse_topology
from themis_mpi.verify import count_wrong, fill_input, input_values, owned_regions, owners, reduced_values

TOPO = parse_topology("Ring(3,100,20)_SW(2,50,700)")
COORDS = (2, 1)  # group rank 2 + 3 * 1 = 5


@pytest.mark.parametrize("n,parts", [(10, 3), (7, 7), (100003, 64), (5, 8)])
def test_chunks_differ_by_at_most_one_element(n, parts):
    """split_bounds covers [0, n) with pieces whose sizes differ by at most one."""
    b = split_bounds(n, parts)
    sizes = np.diff(b)
    assert b[0] == 0 and b[-1] == n and sizes.max() - sizes.min() <= 1


def test_all_reduce_stages_mirror_the_order():
    """An all-reduce chunk visits RS along its order, then AG back along the reverse."""
    coll = Collective("all_reduce", 1000, "float32", 1, (0, 1))
    stages = chunk_stages(TOPO, coll, 0, 0, 1000, [1, 0])
    assert [(s.op, s.dim) for s in stages] == [("RS", 1), ("RS", 0), ("AG", 0), ("AG", 1)]
    assert [s.full_elems for s in stages] == [1000, 500, 500, 1000]


def test_reduced_values_are_the_sum_over_ranks():
    """The closed form equals the explicit sum of every rank's input."""
    n = 6
    explicit = sum(input_values(r, n, 100, 200, np.int64) for r in range(n))
    np.testing.assert_array_equal(reduced_values("sum", n, 100, 200, np.int64), explicit)


def _orders(coll):
    return chunk_orders("baseline", TOPO, coll.op, coll.size_bytes, coll.n_chunks, coll.dims)


@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_check_counts_exactly_the_corrupted_elements_of_an_all_reduce(dtype):
    """A perfect all-reduce result has 0 wrong; two corrupted elements count as 2."""
    coll = Collective("all_reduce", 10007, dtype, 7, (0, 1))
    buf = reduced_values("sum", 6, 0, coll.count, dtype)
    assert count_wrong(buf, TOPO, coll, COORDS, _orders(coll)) == 0
    buf[17] += 1
    buf[9000] -= 3
    assert count_wrong(buf, TOPO, coll, COORDS, _orders(coll)) == 2


def test_reduce_scatter_check_looks_only_at_the_owned_blocks():
    """Reduce-scatter: corrupting outside this NPU's blocks is ignored, inside it is caught."""
    coll = Collective("reduce_scatter", 1000, "int64", 4, (0, 1))
    orders = _orders(coll)
    buf = reduced_values("sum", 6, 0, coll.count, np.int64)
    regions = owned_regions(TOPO, coll, COORDS, orders)
    inside = regions[0][0]
    outside = next(i for i in range(coll.count) if not any(lo <= i < hi for lo, hi in regions))
    buf[outside] = -1
    assert count_wrong(buf, TOPO, coll, COORDS, orders) == 0
    buf[inside] = -1
    assert count_wrong(buf, TOPO, coll, COORDS, orders) == 1


def test_all_gather_check_needs_every_owners_block():
    """All-gather: the input alone (own blocks only) is far from complete; the full result is not."""
    coll = Collective("all_gather", 999, "int32", 3, (0, 1))
    orders = _orders(coll)
    buf = np.empty(coll.count, np.int32)
    fill_input(buf, TOPO, coll, COORDS, orders)
    assert count_wrong(buf, TOPO, coll, COORDS, orders) > coll.count // 2
    full = input_values(owners(TOPO, coll, orders), 6, 0, coll.count, np.int32)
    assert count_wrong(full, TOPO, coll, COORDS, orders) == 0


def test_all_to_all_check_rejects_unexchanged_data():
    """All-to-all: a buffer still holding the input is reported wrong (except this NPU's own block)."""
    coll = Collective("all_to_all", 6 * 50, "float64", 1, (0, 1))
    buf = np.empty(coll.count)
    fill_input(buf, TOPO, coll, COORDS, _orders(coll))
    assert count_wrong(buf, TOPO, coll, COORDS, _orders(coll)) == 5 * 50


def test_int32_sums_that_would_overflow_are_refused():
    """Over 46341 NPUs the int32 sums of the inputs overflow: refused, not silently wrapped."""
    from themis_mpi.errors import UsageError
    from themis_mpi.topology import parse_topology as topo

    big = topo("SW(256,100,0)_SW(256,100,0)")  # 65536 NPUs (model-sized; one rank's buffer is enough)
    coll = Collective("all_reduce", 16, "int32", 1, (0, 1))
    with pytest.raises(UsageError, match="int32 cannot hold the sums of 65536"):
        fill_input(np.empty(16, np.int32), big, coll, (0, 0), [[0, 1]])
    fill_input(
        np.empty(16, np.int64), big, Collective("all_reduce", 16, "int64", 1, (0, 1)), (0, 0), [[0, 1]]
    )
