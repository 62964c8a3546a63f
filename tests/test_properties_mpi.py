"""Randomized emulator runs under mpiexec: real data, wrong = 0, no hang, same times as the model."""

import os

from harness import run_cases
from hypothesis import given, settings
from hypothesis import strategies as st

from themis_mpi.collectives import DTYPES, PER_DIM_OPS
from themis_mpi.topology import is_power_of_two

KIND = {"Ring": "Ring", "FullyConnected": "FC", "Switch": "SW"}


@st.composite
def small_topologies(draw):
    """1 to 3 dims whose sizes multiply to at most 8 NPUs, every kind and allowed algorithm."""
    dims, npus = [], 1
    for _ in range(draw(st.integers(1, 3))):
        p = draw(st.integers(1, 8 // npus))
        npus *= p
        algorithms = ["ring", "direct"] + (["hd"] if is_power_of_two(p) else [])
        kind = draw(st.sampled_from(list(KIND)))
        dims.append(
            f"{KIND[kind]}({p},{draw(st.sampled_from([25, 100, 200]))},"
            f"{draw(st.sampled_from([0, 20, 700]))},{draw(st.sampled_from(algorithms))})"
        )
    return "_".join(dims), npus


cases = st.fixed_dictionaries(
    {
        "op": st.sampled_from(PER_DIM_OPS),
        "count": st.integers(1, 60_000),
        "dtype": st.sampled_from(DTYPES),
        "chunks": st.integers(1, 24),
        "policy": st.sampled_from(["baseline", "themis"]),
        "intra": st.sampled_from(["fifo", "scf"]),
        "active": st.integers(1, 2),
        "redop": st.sampled_from(["sum", "max", "min"]),
    }
)


@given(small_topologies(), st.lists(cases, min_size=1, max_size=4))
@settings(max_examples=60 if os.environ.get("THEMIS_HYPOTHESIS_PROFILE") == "long" else 6)
def test_random_emulator_runs_are_exact_and_agree_with_the_model(tmp_path_factory, topology, batch):
    """Random topology, op, size, chunks, policy and dtype: exact results and the model's times."""
    spec, npus = topology
    rows = run_cases(npus, {"topology": spec, "cases": batch}, tmp_path_factory.mktemp("mpi"))
    assert len(rows) == len(batch)
    for r in rows:
        assert r["emu"]["wrong"] == 0, r["case"]
        assert r["max_rel_diff"] <= 1e-3 and r["time_min_us"] == r["time_max_us"], r["case"]
