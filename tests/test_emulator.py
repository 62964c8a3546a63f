"""Rules for the MPI emulator, each case spawned as `mpiexec -n K` with a timeout."""

import itertools

import pytest
from harness import run_specs

# (ranks, topology): every dim kind and algorithm, sizes that are and are not powers of two.
TOPOLOGIES = [
    (1, "Ring(1,100,20)"),
    (2, "Ring(2,100,20)"),
    (2, "FC(2,100,700)_SW(1,50,700)"),
    (4, "SW(4,100,700)"),
    (4, "FC(4,150,500)"),
    (4, "Ring(2,100,20)_SW(2,50,700,direct)"),
    (5, "Ring(5,100,20)"),
    (6, "Ring(3,200,20)_SW(2,50,700)"),
    (8, "2x2x2"),
    (8, "4x2"),
    (8, "SW(2,100,700)_FC(4,100,700,ring)"),
    (8, "Ring(8,100,20,hd)"),
]
DTYPES = ["float32", "float64", "int32", "int64"]
POLICIES = [("baseline", "fifo"), ("baseline", "scf"), ("themis", "fifo"), ("themis", "scf")]


def cases_for(sizes):
    return [
        {
            "op": "all_reduce",
            "count": count,
            "chunks": chunks,
            "dtype": dtype,
            "policy": pol,
            "intra": intra,
            "active": active,
        }
        for dtype, (pol, intra), (count, chunks, active) in itertools.product(DTYPES, POLICIES, sizes)
    ]


@pytest.fixture(scope="module", params=TOPOLOGIES, ids=lambda t: f"{t[0]}r-{t[1]}")
def rows(request, jobs):
    return jobs[("sizes", *request.param)]


def test_reduced_values_are_exact(rows):
    """Every all-reduce leaves exactly the closed-form sum on every rank (wrong = 0)."""
    assert len(rows) == len(DTYPES) * len(POLICIES) * 3
    assert all(r["emu"]["wrong"] == 0 for r in rows), [r["case"] for r in rows if r["emu"]["wrong"]]


def test_emulator_time_equals_model_time(rows):
    """The virtual-clock time and per-dim busy times equal the model's exactly (same sums, same order)."""
    for r in rows:
        emu, model = r["emu"], r["model"]
        assert emu["time_us"] == model["time_us"], r["case"]
        for de, dm in zip(emu["dims"], model["dims"]):
            assert de["busy_us"] == dm["busy_us"], r["case"]
            assert de["bytes"] == dm["bytes"]


def test_busy_time_is_the_cost_of_the_stages_served(rows):
    """Each dim's busy time equals the summed cost-model time of its stages, on every rank."""
    for r in rows:
        assert r["busy_minus_cost_us"] <= 1e-3 * max(1.0, max(r["cost_sums_us"])), r["case"]


def test_collective_time_bounds(rows):
    """The collective takes at least the busiest dim's time, and all ranks agree on it."""
    for r in rows:
        emu = r["emu"]
        busiest = max(d["busy_us"] for d in emu["dims"]) / r["case"]["active"]
        assert emu["time_us"] >= busiest * (1 - 1e-9)
        assert r["time_min_us"] == r["time_max_us"]


COMPAT = [
    (4, "FC(4,150,500,ring)"),
    (8, "2x2x2"),
    (8, "SW(2,100,700)_FC(4,100,700,hd)"),
    (8, "Ring(8,100,20,hd)"),
]


def compat_cases() -> list[dict]:
    """astra-sim-1.0's compat cases: three policies, a size nothing divides and a power of two."""
    return [
        {
            "op": "all_reduce",
            "count": count,
            "chunks": chunks,
            "dtype": "float32",
            "policy": pol,
            "intra": intra,
            "endpoint_delay_ns": 10.0,
            "compat": "astra-sim-1.0",
        }
        for pol, intra in [("baseline", "fifo"), ("themis", "scf"), ("themis", "fifo")]
        for count, chunks in [(100003, 7), (1 << 18, 16)]
    ]


@pytest.mark.parametrize("n,topo", COMPAT)
def test_astra_sim_compat_mode_moves_exact_data_in_the_models_time(jobs, n, topo):
    """Under compat astra-sim-1.0 (fused AR stage, ASTRA's event order, whole-ns steps) the emulator equals the model."""
    rows = jobs[("compat", n, topo)]
    assert len(rows) == len(compat_cases())
    for r in rows:
        assert r["emu"]["wrong"] == 0, r["case"]
        assert r["emu"]["time_us"] == r["model"]["time_us"], r["case"]
        assert [d["busy_us"] for d in r["emu"]["dims"]] == [d["busy_us"] for d in r["model"]["dims"]], r[
            "case"
        ]


EVERY_POLICY = [
    ("baseline", "fifo"),
    ("themis", "scf"),
    ("themisFlex", "scf"),
    ("roundRobin", "fifo"),
    ("themis-lat", "scf"),
    ("predictive", "scf"),
    ("themis", "rg"),
    ("themis", "lrpf"),
    ("baseline", "lrpf"),
    ("themisFlex", "rg"),
]


EVERY_POLICY_TOPOLOGIES = ["2x2x2", "SW(2,100,700)_FC(4,100,700,ring)"]


def every_policy_cases() -> list[dict]:
    """Every policy pair of `EVERY_POLICY` on four collectives."""
    return [
        {"op": op, "count": count, "chunks": chunks, "dtype": "float32", "policy": pol, "intra": intra}
        for pol, intra in EVERY_POLICY
        for op, count, chunks in [
            ("all_reduce", 100003, 7),
            ("all_reduce", 1 << 18, 16),
            ("reduce_scatter", 1 << 16, 8),
            ("all_gather", 1 << 16, 8),
        ]
    ]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Every emulator run of this module, one mpiexec per rank count (`harness.run_specs`)."""
    sizes = [(100003, 7, 1), (1 << 15, 16, 2), (5, 8, 1)]
    specs = {("sizes", n, topo): (n, topo, cases_for(sizes)) for n, topo in TOPOLOGIES}
    specs.update({("compat", n, topo): (n, topo, compat_cases()) for n, topo in COMPAT})
    specs.update({("policies", 8, t): (8, t, every_policy_cases()) for t in EVERY_POLICY_TOPOLOGIES})
    return run_specs(specs, tmp_path_factory.mktemp("mpi"))


@pytest.mark.parametrize("topo", EVERY_POLICY_TOPOLOGIES)
def test_every_policy_on_8_ranks_moves_exact_data_in_the_models_time(jobs, topo):
    """Every inter- and intra-dim policy of the registry (variable chunks included): wrong = 0 and the model's times exactly."""
    rows = jobs[("policies", 8, topo)]
    assert len(rows) == len(every_policy_cases())
    for r in rows:
        assert r["emu"]["wrong"] == 0, r["case"]
        assert r["emu"]["time_us"] == r["model"]["time_us"], r["case"]
        assert r["emu"]["chunks"] == r["model"]["chunks"], r["case"]
        assert [d["busy_us"] for d in r["emu"]["dims"]] == [d["busy_us"] for d in r["model"]["dims"]], r[
            "case"
        ]
    if topo == "2x2x2":  # here themisFlex's loads drift apart, so some chunks grow
        flex = [r for r in rows if r["case"]["policy"] == "themisFlex" and r["case"]["op"] == "all_reduce"]
        assert any(r["emu"]["chunks"] != r["case"]["chunks"] for r in flex)
