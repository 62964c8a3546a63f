"""Rules for the inter-dim policies, checked against the reference numbers in THEMIS.md."""

import pytest

from themis_mpi.policies import ThemisTracker, chunk_orders
from themis_mpi.topology import parse_topology

HETERO = parse_topology("3D-SW_SW_SW_hetero")
MIB64 = 64 * 2**20


def test_themis_loads_and_fallbacks_match_reference():
    """64 MiB, 64 chunks on 3D-SW_SW_SW_hetero: loads ~36.3/37.0/36.5 MiB, 2 baseline chunks."""
    tracker = ThemisTracker(HETERO, (0, 1, 2))
    for _ in range(64):
        tracker.next_order("all_reduce", MIB64 // 64)
    assert tracker.loads == pytest.approx([36.3, 37.0, 36.5], abs=0.05)
    assert tracker.fallbacks == 2


def test_themis_first_chunk_orders_match_reference():
    """The first three chunk orders are (0,1,2), (2,1,0), (1,0,2)."""
    orders = chunk_orders("themis", HETERO, "all_reduce", MIB64, 64, (0, 1, 2))
    assert [tuple(o) for o in orders[:3]] == [(0, 1, 2), (2, 1, 0), (1, 0, 2)]


def test_baseline_loads_match_reference():
    """Baseline order every chunk: loads 60 / 7 / 1.75 MiB at 200 GB/s."""
    tracker = ThemisTracker(HETERO, (0, 1, 2))
    tracker._sorted = [0, 1, 2]
    m = MIB64 // 64
    loads = [0.0, 0.0, 0.0]
    for _ in range(64):
        size = m
        for d in range(3):
            p = HETERO.dims[d].npus
            loads[d] += size / 2**20 * (p - 1) / p / (HETERO.dims[d].bandwidth_gbps / 200)
            size //= p
    assert loads == pytest.approx([60, 7, 1.75])
    assert all(
        tuple(o) == (0, 1, 2) for o in chunk_orders("baseline", HETERO, "all_reduce", MIB64, 64, (0, 1, 2))
    )


@pytest.mark.parametrize(
    "op,order",
    [
        ("all_reduce", (0, 1, 2)),
        ("reduce_scatter", (0, 1, 2)),
        ("all_gather", (2, 1, 0)),
        ("all_to_all", (0, 1, 2)),
    ],
)
def test_baseline_order_per_op(op, order):
    """Baseline: ascending dims, a standalone all-gather descending."""
    assert tuple(chunk_orders("baseline", HETERO, op, MIB64, 4, (0, 1, 2))[0]) == order


def test_all_to_all_is_never_reordered():
    """Themis leaves all-to-all in the baseline order."""
    orders = chunk_orders("themis", HETERO, "all_to_all", MIB64, 16, (0, 1, 2))
    assert all(tuple(o) == (0, 1, 2) for o in orders)


@pytest.mark.parametrize("name", ["3D-FC_Ring_SW", "4D-Ring_SW_SW_SW", "4D-Ring_FC_Ring_SW"])
def test_themis_orders_are_permutations(name):
    """Every chunk order is a permutation of the dims."""
    topo = parse_topology(name)
    orders = chunk_orders("themis", topo, "all_reduce", 2**30, 64, tuple(range(len(topo.dims))))
    assert all(sorted(o) == list(range(len(topo.dims))) for o in orders.tolist())


def test_themis_balances_loads_better_than_baseline():
    """Themis's max/min load ratio is far below the baseline's 60/1.75."""
    tracker = ThemisTracker(HETERO, (0, 1, 2))
    for _ in range(64):
        tracker.next_order("all_reduce", MIB64 // 64)
    assert max(tracker.loads) / min(tracker.loads) < 1.05
