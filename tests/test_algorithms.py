"""Serial rules for the per-dim algorithm plans: run all P ranks in lockstep on numpy arrays."""

import numpy as np
import pytest

from themis_mpi import algorithms
from themis_mpi.algorithms import plan
from themis_mpi.collectives import owned_region
from themis_mpi.cost import AG, RS, steps
from themis_mpi.topology import Dim


def lockstep(algorithm, op, p, lo, hi, bufs):
    """Apply every rank's plan step by step, as MPI would with all messages of a step at once."""
    plans = [plan(algorithm, op, p, c, lo, hi) for c in range(p)]
    assert len({len(pl) for pl in plans}) == 1
    for k in range(len(plans[0])):
        inbox = {}
        for c in range(p):
            for peer, a, b in plans[c][k].sends:
                inbox[(peer, c)] = bufs[c][a:b].copy()
        for c in range(p):
            step = plans[c][k]
            for peer, a, b in step.recvs:
                data = inbox.pop((c, peer))
                assert len(data) == b - a
                if step.mode == algorithms.REDUCE:
                    bufs[c][a:b] += data
                else:
                    bufs[c][a:b] = data
        assert not inbox
    return len(plans[0])


CASES = (
    [("ring", p) for p in (2, 3, 4, 5, 8)]
    + [("direct", p) for p in (2, 3, 4, 7)]
    + [("halving_doubling", p) for p in (2, 4, 8)]
)


@pytest.mark.parametrize("algorithm,p", CASES)
@pytest.mark.parametrize("n", [1, 7, 64, 101])
def test_reduce_scatter_leaves_reduced_own_block(algorithm, p, n):
    """After RS, coordinate c holds the sum over ranks of its own block."""
    lo, hi = 3, 3 + n
    bufs = [np.arange(hi + 2, dtype=np.int64) * (c + 1) for c in range(p)]
    lockstep(algorithm, RS, p, lo, hi, bufs)
    total = np.arange(hi + 2, dtype=np.int64) * (p * (p + 1) // 2)
    for c in range(p):
        a, b = owned_region(p, c, lo, hi)
        np.testing.assert_array_equal(bufs[c][a:b], total[a:b])
        np.testing.assert_array_equal(bufs[c][:lo], np.arange(lo) * (c + 1))  # untouched


@pytest.mark.parametrize("algorithm,p", CASES)
@pytest.mark.parametrize("n", [1, 7, 64, 101])
def test_all_gather_fills_every_block(algorithm, p, n):
    """After AG from owned blocks, every rank holds every rank's block."""
    lo, hi = 0, n
    want = np.full(n, -1, dtype=np.int64)
    bufs = [np.full(n, -1, dtype=np.int64) for _ in range(p)]
    for c in range(p):
        a, b = owned_region(p, c, lo, hi)
        bufs[c][a:b] = 1000 * c + np.arange(a, b)
        want[a:b] = 1000 * c + np.arange(a, b)
    lockstep(algorithm, AG, p, lo, hi, bufs)
    for c in range(p):
        np.testing.assert_array_equal(bufs[c], want)


@pytest.mark.parametrize("algorithm,p", CASES)
@pytest.mark.parametrize("op", [RS, AG])
def test_plan_steps_match_cost_model_steps(algorithm, p, op):
    """The plan has as many steps, and messages per step, as the cost model charges for."""
    dim = Dim("Switch", p, 100, 700, algorithm)
    nominal = steps(dim, op, 64, 8)
    real = plan(algorithm, op, p, 0, 0, 64)
    assert len(real) == len(nominal)
    for step, (msg_bytes, n_msgs) in zip(real, nominal):
        assert len(step.sends) == n_msgs
        assert max(b - a for _, a, b in step.sends) * 8 <= msg_bytes


@pytest.mark.parametrize("algorithm,p", CASES)
@pytest.mark.parametrize("dtype,rtol", [(np.float32, 1e-5), (np.float64, 1e-12)])
def test_float_all_reduce_matches_numpy_within_tolerance(algorithm, p, dtype, rtol):
    """Random floats, RS then AG: every rank ends with numpy's sum over ranks, within P * eps."""
    rng = np.random.default_rng(p)
    n = 1000
    bufs = [rng.standard_normal(n).astype(dtype) for _ in range(p)]
    reference = np.sum(np.stack(bufs).astype(np.float64), axis=0)
    lockstep(algorithm, RS, p, 0, n, bufs)
    lockstep(algorithm, AG, p, 0, n, bufs)
    scale = np.abs(np.stack(bufs)).max()
    for c in range(p):
        np.testing.assert_allclose(bufs[c], reference, rtol=rtol, atol=p * np.finfo(dtype).eps * scale * 4)
        np.testing.assert_array_equal(bufs[c], bufs[0])  # every rank holds the same bits
