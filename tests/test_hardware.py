"""Rules for the hardware the seeds describe: ina, the endpoint model and ACE, calibration, presets."""

import json
import math
from types import SimpleNamespace

import pytest
from harness import DATA, cli_jobs, run_specs

from themis_mpi.calibrate import fit, read_nccl_log
from themis_mpi.cli import main
from themis_mpi.collectives import PRICED_ITEMSIZE, Collective, chunk_stages
from themis_mpi.config import RunConfig
from themis_mpi.cost import AG, AR, RS, CostModel, Endpoint
from themis_mpi.errors import UsageError
from themis_mpi.policies import ThemisTracker
from themis_mpi.run.collective import model_collective
from themis_mpi.run.training import model_training
from themis_mpi.topology import PRESETS, SOURCES, parse_topology
from themis_mpi.units import BYTES_PER_GB
from themis_mpi.workloads.text import parse_workload
from themis_mpi.workloads.training import TrainingSpec, compute_rate

LOG = DATA / "nccl-tests" / "h100x8_nvls_dgxc.txt"
MIB = 1 << 20
GB = BYTES_PER_GB / 1e9  # bytes per ns of 1 GB/s


def ar_time_us(topology, size_bytes, chunks=1, policy="baseline", endpoint=None):
    """One all-reduce of float32 on the model, under ideal (the cost model's closed forms)."""
    coll = Collective(
        "all_reduce", size_bytes // 4, "float32", chunks, tuple(range(len(parse_topology(topology).dims)))
    )
    result, _ = model_collective(
        parse_topology(topology), coll, policy, RunConfig(endpoint=endpoint or Endpoint(), network="ideal")
    )
    return result.time_us


# --- in-network aggregation --------------------------------------------------------------------


def test_ina_needs_a_switch_dim_and_a_valid_efficiency():
    """An ina on a Ring or FullyConnected dim, or an efficiency outside (0, 1], is one line."""
    for text in (
        "Ring(4,100,20,ina)",
        "FC(4,100,20,ina)",
        "SW(4,100,20,ina:0)",
        "SW(4,100,20,ina:1.5)",
        "SW(4,1,1,ina:x)",
    ):
        with pytest.raises(UsageError):
            parse_topology(text)


def test_ina_inline_form_round_trips_with_its_efficiency():
    """SW(4,100,700,ina:0.8) reads back to an equal topology; plain ina keeps efficiency 1."""
    topo = parse_topology("SW(4,100,700,ina:0.8)_SW(2,50,700,ina)")
    assert topo.spec() == "SW(4,100,700,ina:0.8)_SW(2,50,700,ina)"
    assert parse_topology(topo.spec()) == topo
    assert [d.efficiency for d in topo.dims] == [0.8, 1.0]
    assert parse_topology("SW(4,100,700)").with_overrides(algorithms=["ina"]).dims[0].algorithm == "ina"


@pytest.mark.parametrize("efficiency", [1.0, 0.5])
def test_ina_stage_is_two_hops_and_the_larger_payload_at_efficiency_times_bandwidth(efficiency):
    """AR, RS and AG on an ina dim are one step: 2 * latency + S / (efficiency * B) (S up and/or down)."""
    cost = CostModel(parse_topology(f"SW(8,100,700,ina:{efficiency:g})"), 4)
    elems = MIB // 4
    want = 2 * 700 + MIB / (efficiency * 100 * GB)
    for op in (AR, RS, AG):
        assert cost.step_times_ns(0, op, elems) == pytest.approx((want,), rel=1e-12)
    assert cost.stage_bytes(0, RS, elems) == cost.stage_bytes(0, AR, elems) == MIB
    assert cost.stage_bytes(0, AG, elems) == MIB // 8


def test_ina_halves_a_ring_all_reduce_on_one_switch_at_large_sizes():
    """One 8-NPU switch without latency: ina takes S/B where ring takes 2 (P-1)/P S/B, under both policies."""
    for policy in ("baseline", "themis"):
        ring = ar_time_us("SW(8,100,0,ring)", 64 * MIB, 4, policy)
        ina = ar_time_us("SW(8,100,0,ina)", 64 * MIB, 4, policy)
        assert ina == pytest.approx(64 * MIB / (100 * GB) / 1e3, rel=1e-12)
        assert ring / ina == pytest.approx(2 * 7 / 8, rel=1e-12)


def test_an_ina_last_dim_is_one_all_reduce_stage_and_earlier_ina_dims_are_halves():
    """Themis's chunk on ina dims: RS/AG halves where the order continues, one AR stage on the last dim."""
    topo = parse_topology("SW(2,100,700,ina)_SW(4,100,700,ina)")
    coll = Collective("all_reduce", 1 << 12, "float32", 1, (0, 1))
    stages = chunk_stages(topo, coll, 0, 0, 1 << 12, [1, 0])
    assert [(s.dim, s.op) for s in stages] == [(1, RS), (0, AR), (1, AG)]


def test_themis_loads_count_ina_traffic():
    """The tracker charges an ina dim the whole chunk per RS (1/efficiency), half of it on a fused last dim."""
    topo = parse_topology("SW(4,100,0,ring)_SW(4,100,0,ina:0.5)")
    tracker = ThemisTracker(topo, (0, 1))
    order = tracker.next_order("all_reduce", 4 * MIB)  # balanced: the baseline order 0, 1
    assert order == [0, 1]
    assert tracker.loads == pytest.approx(
        [4 * 3 / 4, 0.5 * 1 / 0.5]
    )  # MiB: ring (P-1)/P S; fused ina S/P / eff / 2
    tracker = ThemisTracker(topo, (0, 1))
    tracker.loads = [10.0, 0.0]
    assert tracker.next_order("all_reduce", 4 * MIB) == [1, 0]
    assert tracker.loads == pytest.approx([10.0 + 1 * 3 / 4, 4 / 0.5])  # ina first: the whole chunk up


# --- the endpoint model and ACE ----------------------------------------------------------------


def test_endpoint_model_is_off_by_default_and_not_part_of_astra_compat():
    """Without --hbm-gbps times are unchanged; ACE or a compute share alone, or with compat, are refused."""
    assert Endpoint() == RunConfig().endpoint and not Endpoint().on
    with pytest.raises(UsageError):
        Endpoint(0, 0, True)
    with pytest.raises(UsageError):
        Endpoint(100, 0.99)
    with pytest.raises(UsageError):
        RunConfig(compat="astra-sim-1.0", endpoint=Endpoint(100))
    assert ar_time_us("SW(8,100,700)", 64 * MIB, 64, "themis", Endpoint(1e6)) == ar_time_us(
        "SW(8,100,700)", 64 * MIB, 64, "themis"
    )


def test_memory_bound_ring_all_reduce_pays_five_bytes_per_reduced_byte_and_two_per_copied_byte():
    """Ring AR on SW(8,100,0) with H = 300: RS steps take 5b/H (memory), AG steps b/B (network)."""
    b = 8 * MIB  # 64 MiB over 8 NPUs
    want = 7 * b * (5 / (300 * GB) + 1 / (100 * GB)) / 1e3
    assert ar_time_us("SW(8,100,0,ring)", 64 * MIB, 1, "baseline", Endpoint(300)) == pytest.approx(
        want, rel=1e-12
    )
    assert ar_time_us("SW(8,100,0,ring)", 64 * MIB, 1, "baseline", Endpoint(1e4)) == pytest.approx(
        14 * b / (100 * GB) / 1e3, rel=1e-12
    )  # enough memory: the network's time


def test_ace_reads_and_writes_the_payload_once_spread_over_the_stage():
    """With ACE at H = B, the one-stage AR's 14 steps each move (S + S) / 14 bytes of memory: 16b/14 per b sent."""
    b = 8 * MIB
    want = 14 * (2 * 64 * MIB / 14) / (100 * GB) / 1e3
    assert ar_time_us("SW(8,100,0,ring)", 64 * MIB, 1, "baseline", Endpoint(100, 0, True)) == pytest.approx(
        want, rel=1e-12
    )
    assert want == pytest.approx(16 * b / (100 * GB) / 1e3)
    assert ar_time_us("SW(8,100,0,ring)", 64 * MIB, 1, "baseline", Endpoint(300, 0, True)) == pytest.approx(
        14 * b / (100 * GB) / 1e3, rel=1e-12
    )


def test_memory_bandwidth_is_split_between_dims_by_network_bandwidth_and_compute_share():
    """M_d = H (1 - s) B_d / sum(B); the share s applies to stages started during compute only."""
    cost = CostModel(parse_topology("SW(4,300,0,ring)_SW(4,100,0,ring)"), 4, endpoint=Endpoint(400, 0.25))
    assert cost.memory_bytes_per_ns == pytest.approx([300 * GB, 100 * GB])
    elems = MIB // 4
    alone = cost.step_times_ns(1, RS, elems)
    shared = cost.step_times_ns(1, RS, elems, shared=True)
    assert alone == pytest.approx((5 * MIB / 4 / (100 * GB),) * 3)
    assert shared == pytest.approx((5 * MIB / 4 / (0.75 * 100 * GB),) * 3)


def test_compute_slows_to_what_the_running_collectives_leave():
    """The compute rate is 1 - min(D, (1 - s) H) / H, D the running stages' mean memory bytes per ns."""
    topo = parse_topology("SW(4,100,0,ring)")
    config = RunConfig(endpoint=Endpoint(200, 0.25))
    cost = CostModel(topo, PRICED_ITEMSIZE, endpoint=config.endpoint)
    coll = Collective("all_reduce", MIB // 4, "float32", 1, (0,))
    stage = chunk_stages(topo, coll, 0, 0, MIB // PRICED_ITEMSIZE, [0], True)[0]
    run = SimpleNamespace(stage=stage, mem_shared=False)
    b = MIB / 4
    d = 21 * b / sum(cost.run_steps_ns(run))  # 3 RS steps of 5b and 3 AG steps of 2b
    assert d / (200 * GB) == pytest.approx(7 / (5 + 2))  # = 1: the collective could take all of H
    transport = SimpleNamespace(config=config, cost=lambda itemsize: cost)
    engine = SimpleNamespace(transport=transport, running_stages=lambda: [run])
    assert compute_rate(engine) == pytest.approx(0.25)  # capped at (1 - s) H: compute keeps its share
    engine_idle = SimpleNamespace(transport=transport, running_stages=lambda: [])
    assert compute_rate(engine_idle) == 1.0


def test_training_compute_beside_an_all_reduce_is_slowed_in_closed_form(tmp_path):
    """DATA, 2 layers: l1's ig compute (20) and l0's wg compute (30) run beside l1's AR at rate 0.25."""
    path = tmp_path / "w.txt"
    path.write_text(
        f"DATA\n2\nl0 -1 10 NONE 0 20 NONE 0 30 ALLREDUCE {MIB} 0\nl1 -1 10 NONE 0 20 NONE 0 30 ALLREDUCE {MIB} 0\n"
    )
    wl = parse_workload(str(path))
    spec = TrainingSpec(chunks=1, iterations=1)
    plain = model_training(wl, parse_topology("SW(4,100,0,ring)"), "baseline", spec)
    slowed = model_training(
        wl, parse_topology("SW(4,100,0,ring)"), "baseline", spec, RunConfig(endpoint=Endpoint(200, 0.25))
    )
    assert plain.compute_us * 1e3 == pytest.approx(10 + 10 + 30 + 20 + 30)
    assert slowed.compute_us * 1e3 == pytest.approx(10 + 10 + 30 + 20 / 0.25 + 30 / 0.25)


def test_training_with_the_endpoint_model_is_the_same_on_the_emulator(tmp_path):
    """Under mpiexec -n 8, train with --hbm-gbps, --compute-share and --ace: wrong = 0 and the model's times exactly."""
    path = tmp_path / "w.txt"
    path.write_text(
        f"DATA\n3\nl0 -1 1000 NONE 0 2000 NONE 0 3000 ALLREDUCE {MIB} 0\n"
        f"l1 -1 1000 NONE 0 2000 NONE 0 3000 ALLREDUCE {2 * MIB} 0\nl2 -1 1000 NONE 0 2000 NONE 0 3000 ALLREDUCE {MIB} 0\n"
    )
    extras = {"share": ["--hbm-gbps", "150", "--compute-share", "0.3"], "ace": ["--hbm-gbps", "150", "--ace"]}
    base = ["train", str(path), "-t", "2x2x2", "-c", "4", "-n", "1"]
    runs = {k: (8, [*base, *e, "--json", str(tmp_path / f"emu-{k}.json")]) for k, e in extras.items()}
    done = cli_jobs(runs, tmp_path)  # one mpiexec for both
    for key, extra in extras.items():
        assert done[key].returncode == 0, done[key].stderr[-2000:]
        assert main([*base, *extra, "--json", str(tmp_path / "model.json")]) == 0
        emu = json.loads((tmp_path / f"emu-{key}.json").read_text())
        model = json.loads((tmp_path / "model.json").read_text())
        assert [r["wrong"] for r in emu] == [0, 0]
        assert [r["iteration_us"] for r in emu] == [r["iteration_us"] for r in model]
        assert [r["compute_us"] for r in emu] == [r["compute_us"] for r in model]


def test_ina_and_endpoint_emulator_reduces_exactly_in_the_models_time(tmp_path):
    """8 ranks, ina dims and the endpoint model (with and without ACE): wrong = 0, emulator = model exactly."""
    cases = [
        {"op": op, "count": count, "dtype": dtype, "chunks": chunks, "policy": pol, "intra": intra, **extra}
        for op, count, dtype, chunks in [
            ("all_reduce", 100003, "float32", 7),
            ("all_reduce", 1 << 15, "int64", 16),
            ("reduce_scatter", 1 << 14, "float64", 8),
            ("all_gather", 1 << 14, "float64", 8),
        ]
        for pol, intra in [("baseline", "fifo"), ("themis", "scf")]
        for extra in [{}, {"hbm_gbps": 120.0}, {"hbm_gbps": 120.0, "ace": True}]
    ]
    topologies = [
        "SW(8,100,700,ina)",
        "Ring(2,100,20)_SW(4,50,700,ina:0.8)",
        "SW(2,200,700,ina)_SW(2,100,700)_SW(2,50,1700,ina)",
    ]
    jobs = run_specs({t: (8, t, cases) for t in topologies}, tmp_path)  # one mpiexec for the three
    for topology in topologies:
        rows = jobs[topology]
        assert len(rows) == len(cases)
        for r in rows:
            assert r["emu"]["wrong"] == 0, (topology, r["case"])
            assert r["emu"]["time_us"] == r["model"]["time_us"], (topology, r["case"])
            assert [d["busy_us"] for d in r["emu"]["dims"]] == [d["busy_us"] for d in r["model"]["dims"]]
            assert r["time_min_us"] == r["time_max_us"]


# --- calibration -------------------------------------------------------------------------------


def test_the_shipped_log_reads_as_an_8_npu_all_reduce_table():
    """The DGX H100 log: all_reduce, 8 ranks, 32 sizes from 8 B to 16 GiB, float, out-of-place and in-place."""
    log = read_nccl_log(str(LOG))
    assert (log.op, log.npus, len(log.rows)) == ("all_reduce", 8, 32)
    assert (log.rows[0].size_bytes, log.rows[-1].size_bytes) == (8, 16 << 30)
    assert log.rows[-1].busbw == 479.90 and log.rows[-1].time_in_place_us == 62636


def test_calibration_reproduces_the_measured_busbw_from_64_mib_within_10_percent():
    """The fitted ring dim's model busbw is within 10 % of the measured one at every size >= 64 MiB."""
    result = fit(read_nccl_log(str(LOG)))
    big = [r for r in result.rows if r["size_bytes"] >= 64 * MIB]
    assert len(big) == 9
    assert max(abs(r["busbw_error_pct"]) for r in big) < 10
    assert result.topology.startswith("SW(8,") and result.chunks == 1


def test_model_with_the_fitted_string_predicts_the_fitted_table(tmp_path, capsys):
    """Calibrate --json, then model -t <topology> -c <chunks> --format nccl: the same times as the fit's rows."""
    out = tmp_path / "fit.json"
    assert main(["calibrate", str(LOG), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc) >= {"topology", "chunks", "rows"}
    capsys.readouterr()
    args = [
        "model",
        "-t",
        doc["topology"],
        "-c",
        str(doc["chunks"]),
        "-d",
        "float32",
        "-b",
        "64M",
        "-e",
        "16G",
    ]
    assert main([*args, "-p", "baseline", "--format", "nccl", "--json", str(tmp_path / "m.json")]) == 0
    printed = [line.split() for line in capsys.readouterr().out.splitlines() if line and line[0] != "#"]
    assert [int(f[0]) for f in printed] == [64 * MIB << k for k in range(9)]
    model = json.loads((tmp_path / "m.json").read_text())
    fitted = {r["size_bytes"]: r["model_us"] for r in doc["rows"]}
    for r in model:
        assert r["time_us"] == pytest.approx(fitted[r["size_bytes"]], rel=1e-12)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "hello world\n",
        "#  Rank  0 Group  0 Pid 1 on h device  0\n   8  2  float  sum  -1  13.6  0.00\n",
        "#  Rank  0 Group  0 Pid 1 on h device  0\n   8  2  float  sum  -1  -3  0 0 0 1 0 0 0\n",
        "   8  2  float  sum  -1  13.6  0.00 0.00 0 13 0 0 0\n",  # no ranks
    ],
)
def test_bad_or_foreign_logs_get_one_line_and_exit_2(tmp_path, capsys, text):
    """An empty, foreign, truncated, negative or rank-less log is refused with one line and status 2."""
    path = tmp_path / "log.txt"
    path.write_text(text)
    assert main(["calibrate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("themis-mpi: error:")


# --- presets -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,npus,kinds",
    [
        ("HGX-H100-SW_SW_SW", 1024, ["Switch"] * 3),
        ("Zion-FC_SW", 1024, ["FullyConnected", "Switch"]),
        ("TPUv4-4x4x4", 64, ["Ring"] * 3),
        ("TPUv4-16x16x16", 4096, ["Ring"] * 3),
    ],
)
def test_platform_presets_have_their_shape_and_sources(name, npus, kinds):
    """Each platform preset parses to its kinds and NPU count, names its sources, and accepts ina on its switches."""
    topo = parse_topology(name)
    assert topo.npus == npus and [d.kind for d in topo.dims] == kinds
    assert name in PRESETS and len(SOURCES[name]) > 40
    algorithms = ["ina" if d.kind == "Switch" else None for d in topo.dims]
    assert math.isfinite(ar_time_us(topo.with_overrides(algorithms=algorithms).spec(), 64 * MIB, 4, "themis"))
