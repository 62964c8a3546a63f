"""Rules for the NCCL-like model (`themis_mpi.nccl`) and for reading real nccl-tests logs (issues 29, 47).

The fits of the real logs, their reference tables, the predictions and the Themis study are in
`test_calibrate.py`; this file holds the model's closed forms and the reader.
"""

import json
import math
import time
from dataclasses import replace

import numpy as np
import pytest
from harness import DATA, run_cases

from themis_mpi import nccl
from themis_mpi.calibrate import machine_of, read_nccl_log
from themis_mpi.calibrate.hardware import GPUS, gpu_of
from themis_mpi.cli import main
from themis_mpi.collectives import Collective
from themis_mpi.cost import CostModel
from themis_mpi.errors import UsageError
from themis_mpi.run.collective import model_collective
from themis_mpi.topology import PROTOCOL_CAPS, NcclParams, parse_topology, read_fit
from themis_mpi.units import BYTES_PER_GB

LOGS = DATA / "nccl-tests"
DGX = LOGS / "h100x8_nvls_dgxc.txt"
TWO_NODE = LOGS / "h100x16_2node_ib_issue309_qoofyk.txt"
TWO_NODE_RING = LOGS / "h100x16_2node_ib_ring_issue309_gjaion.txt"
RS_PARTIAL = LOGS / "h100x8_reduce_scatter_ring_issue1047_PARTIAL.txt"
MI300X = LOGS / "mi300x8_1node_rccl.txt"
MI300X_2 = LOGS / "mi300x16_2node_roce_rccl.txt"
A100_2 = LOGS / "a100x16_2node_oci_roce.txt"
GB200 = LOGS / "gb200x8_2tray_mnnvl_NOHEADER.txt"
MI325X = LOGS / "mi325x_1to8node_ring_PARTIAL.txt"
MIB, KIB = 1 << 20, 1 << 10
PARAMS = NcclParams((5000.0, 9000.0, 40000.0), (0.1, 0.5, 0.9), 100000.0, 0.6, channels=4)
GB = BYTES_PER_GB / 1e9  # bytes per ns of 1 GB/s (2^30 B)


def error_line(capsys) -> str:
    """The one stderr line of a refused command."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("themis-mpi: error:"), err
    return err[0]


def times(params, lv, op, size):
    """{(algorithm, protocol): time ns} of every pair at one size."""
    return {(p.algorithm, p.protocol): float(p.times_ns[0]) for p in nccl.pairs(params, lv, op, [size])}


# --- the model ---------------------------------------------------------------------------------


def test_one_level_ring_time_is_base_plus_steps_plus_bytes_over_the_protocol_share():
    """Ring/p on 8 NPUs of 100 GB/s: base_p + 14 L0 f_p + 2 (7/8) S / (eff_p B), f_p NCCL's NVLink step factor."""
    lv = [nccl.Level(8, 100 * GB, 500.0, True)]
    s = 3 * MIB  # above every protocol's channel share times 4 channels: no ramp
    got = times(
        NcclParams(PARAMS.base_ns, PARAMS.efficiency, algos=("Ring",), channels=4), lv, "all_reduce", s
    )
    for k, proto in enumerate(("LL", "LL128", "Simple")):
        step = 500.0 * nccl.STEP_FACTORS[False]["Ring"][k]
        want = PARAMS.base_ns[k] + 14 * step + 2 * 7 / 8 * s / (PARAMS.efficiency[k] * 100 * GB)
        assert got[("Ring", proto)] == pytest.approx(want)


def test_the_fastest_pair_runs_unless_a_log_s_uses_say_which_pair_ran_over_which_sizes():
    """LL wins at 8 B and NVLS at 1 GiB; `uses` ranges hand their sizes to their pair (NCCL's tuner).

    Between two ranges the faster of their pairs runs; below the first range and above the last
    the fastest pair that no range further in claims (each pair wins over one range of sizes).
    """
    topo = parse_topology("SW(8,400,600,nccl)_" + PARAMS.spec())
    lv = nccl.levels(topo, (0,))
    for size, want in ((8, ("Ring", "LL")), (1 << 30, ("NVLS", "Simple"))):
        c = nccl.collective_ns(topo, (0,), "all_reduce", size)
        assert (c.algorithm, c.protocol) == want
        assert c.time_ns == min(times(PARAMS, lv, "all_reduce", size).values())
    uses = (("Ring", "LL", 64, 256 * KIB), ("Ring", "Simple", 4 * MIB, 1 << 30))
    used = parse_topology("SW(8,400,600,nccl)_" + replace(PARAMS, uses=uses).spec())
    assert used.nccl.uses == uses

    def ran(size):
        c = nccl.collective_ns(used, (0,), "all_reduce", size)
        return c.algorithm, c.protocol

    assert ran(1 << 30) == ("Ring", "Simple") and ran(128) == ("Ring", "LL")  # inside a range
    gap = times(PARAMS, lv, "all_reduce", MIB)
    assert ran(MIB) == min((("Ring", "LL"), ("Ring", "Simple")), key=gap.get)  # between: the faster
    assert ran(2 << 30) == ("NVLS", "Simple")  # above: not Ring/LL, which ran below
    below = times(PARAMS, lv, "all_reduce", 8)
    assert ran(8) == min((k for k in below if k != ("Ring", "Simple")), key=below.get)


def test_nvls_runs_in_waves_of_chunks_that_shrink_at_nccl_s_thresholds():
    """NVLS's chunk halves below 64, 8 and 2 waves of channels x heads chunks (enqueue.cc), NVLS-Tree's below 4 and 1.

    Its time is (S + 2 min(S, W)) (1/algbw + cost / (channels chunk)) past its latency, W a wave
    (three waves in flight for NVLS-Tree): with no chunk cost, twice S takes twice the time of
    S plus the pipeline's fill, which is what gives NVLS its apparent latency.
    """
    ops = 32 * 8  # Blackwell: 32 NVLS channels, 8 heads
    sizes = np.array([16, 128, 2048, 4096], dtype=float) * MIB
    assert nccl.nvls_chunk_bytes(1, 8, 32, sizes - 1).tolist() == [16 * KIB, 32 * KIB, 64 * KIB, 128 * KIB]
    assert nccl.nvls_chunk_bytes(1, 8, 32, sizes).tolist() == [32 * KIB, 64 * KIB, 128 * KIB, 128 * KIB]
    assert 2 * ops * 32 * KIB == 16 * MIB and 64 * ops * 128 * KIB == 2048 * MIB
    tree = nccl.nvls_chunk_bytes(2, 8, 16, np.array([8 * MIB - 1, 8 * MIB, 64 * MIB - 1, 64 * MIB]))
    assert tree.tolist() == [32 * KIB, 64 * KIB, 64 * KIB, 128 * KIB]
    params = NcclParams(nvls_chunk_ns=0.0, nvls_channels=32)
    level = nccl.Level(8, 100 * GB, 500.0, True)
    wave = 32 * 8 * 128 * KIB
    s = 64 * wave  # chunks of 128 KiB from 64 waves
    got = nccl.nvls_transfer_ns(params, level, 1, 50 * GB, [s, 2 * s])
    assert got.tolist() == pytest.approx([(s + 2 * wave) / (50 * GB), (2 * s + 2 * wave) / (50 * GB)])
    got = nccl.nvls_transfer_ns(replace(params, nvls_chunk_ns=1000.0), level, 2, 50 * GB, [s])
    assert got[0] == pytest.approx((s + 3 * wave) * (1 / (50 * GB) + 1000.0 / (32 * 128 * KIB)))


def test_a_broadcast_is_a_ring_that_moves_s_through_every_port_once():
    """Broadcast/p on 8 NPUs: base_p + 7 L0 f_p + S / (eff_p B); Ring only, whatever NCCL_ALGO says."""
    lv = [nccl.Level(8, 100 * GB, 500.0, True)]
    s = 3 * MIB
    params = NcclParams(PARAMS.base_ns, PARAMS.efficiency, algos=("NVLS",), channels=4)
    got = times(params, lv, "broadcast", s)
    assert {a for a, _ in got} == {"Ring"}
    for k, proto in enumerate(("LL", "LL128", "Simple")):
        step = 500.0 * nccl.STEP_FACTORS[False]["Ring"][k]
        want = PARAMS.base_ns[k] + 7 * step + s / (PARAMS.efficiency[k] * 100 * GB)
        assert got[("Ring", proto)] == pytest.approx(want)


def test_model_o_broadcast_runs_on_nccl_dims_only(capsys):
    """`model -o broadcast` on a fit gives the NCCL-like time with busbw = algbw; per-dim dims refuse it in one line."""
    topo = "SW(8,400,600,nccl)_" + PARAMS.spec()
    assert (
        main(["model", "-t", topo, "-o", "broadcast", "-b", "64M", "-p", "baseline", "--format", "nccl"]) == 0
    )
    row = capsys.readouterr().out.strip().splitlines()[-1].split()
    want = nccl.collective_ns(parse_topology(topo), (0,), "broadcast", 64 * MIB).time_ns / 1e3
    assert row[4] == "0" and float(row[5]) == pytest.approx(want, rel=1e-3) and row[6] == row[7]
    assert main(["model", "-t", "2x2x2", "-o", "broadcast", "-b", "1M"]) == 2
    assert "nccl dims" in error_line(capsys)


def test_a_flat_ring_across_nodes_uses_every_level_by_its_share_of_the_ring_s_hops():
    """Two nodes of 8: 14 of the ring's 16 hops are NVLink, 2 NICs: busbw = eff min(B0 16/14, (net/eff) B1 8)."""
    params = NcclParams(PARAMS.base_ns, PARAMS.efficiency, algos=("Ring",), net_efficiency=0.8, channels=1)
    s = 1 << 30
    for b0, b1 in ((400.0, 60.0), (200.0, 60.0)):
        lv = [nccl.Level(8, b0, 600.0, True), nccl.Level(2, b1, 3000.0, True)]
        eff = params.efficiency[2]
        bus = eff * min(b0 * 16 / 14, 0.8 / eff * b1 * 16 / 2)
        lat = 40000 + 28 * 600 * 3.4 / 0.6 + 2 * 3000
        assert times(params, lv, "all_reduce", s)[("Ring", "Simple")] == pytest.approx(
            lat + 2 * 15 / 16 * s / bus
        )


def test_a_two_node_tree_moves_twice_a_ring_s_rate_through_the_nics():
    """Where the NICs bind, Tree's algbw is G B1 net (above the NICs' busbw), a ring's G B1 net N / (2 (N-1))."""
    params = NcclParams(
        PARAMS.base_ns, PARAMS.efficiency, net_efficiency=0.8, algos=("Ring", "Tree"), channels=1
    )
    lv = [nccl.Level(8, 1000.0, 600.0, True), nccl.Level(2, 10.0, 3000.0, True)]
    s = 1 << 30  # tree correction 1 from 512 MiB
    got = times(params, lv, "all_reduce", s)
    tree_bw = s / (got[("Tree", "Simple")] - (40000 + 2 * (7 * 600 * 4.0 / 0.6 + 3000)))
    ring_lat = 40000 + 28 * 600 * 3.4 / 0.6 + 2 * 3000
    ring_bw = s / (got[("Ring", "Simple")] - ring_lat)
    assert tree_bw == pytest.approx(8 * 10.0 * 0.8)
    assert ring_bw == pytest.approx(0.8 * 10.0 * 8 * 16 / 30)


def test_below_its_channels_shares_a_ring_takes_the_one_share_time():
    """Simple on 4 channels of 32 KiB shares: flat from 32 KiB to 128 KiB, linear from there, as NCCL fills channels."""
    lv = [nccl.Level(8, 100 * GB, 500.0, True)]
    params = NcclParams(PARAMS.base_ns, PARAMS.efficiency, algos=("Ring",), channels=4, protocols=("Simple",))
    t = {
        s: times(params, lv, "all_reduce", s)[("Ring", "Simple")]
        for s in (32 * KIB, 64 * KIB, 128 * KIB, 256 * KIB)
    }
    assert t[32 * KIB] == pytest.approx(t[64 * KIB]) == pytest.approx(t[128 * KIB])
    lat = t[32 * KIB] - 4 * 32 * KIB * 2 * 7 / 8 / (0.9 * 100 * GB)
    assert t[256 * KIB] - lat == pytest.approx(2 * (t[128 * KIB] - lat))


def test_an_all_to_all_sends_each_level_its_share_of_the_peers():
    """Two nodes of 8: 7/16 of S over NVLink, 8/16 over the NICs; the slower level sets the time."""
    params = NcclParams(PARAMS.base_ns, PARAMS.efficiency, net_efficiency=0.5, channels=1)
    lv = [nccl.Level(8, 400.0, 600.0, True), nccl.Level(2, 40.0, 3000.0, True)]
    s = 1 << 28
    (pair,) = nccl.pairs(params, lv, "all_to_all", [s])
    want = 40000 + 3600 + s * max(7 / 16 / (0.9 * 400), 8 / 16 / (0.5 * 40))
    assert float(pair.times_ns[0]) == pytest.approx(want)


def test_nccl_dims_are_all_or_none_and_not_part_of_astra_compat():
    """Mixing nccl with per-dim algorithms, a stray NCCL(...) or --compat astra-sim-1.0 is refused."""
    with pytest.raises(UsageError):
        parse_topology("SW(8,400,600,nccl)_SW(2,50,2000,ring)")
    with pytest.raises(UsageError):
        parse_topology("SW(8,400,600)_NCCL(ll=1:0.5)")
    with pytest.raises(UsageError):
        CostModel(parse_topology("SW(8,400,600,nccl)"), 4, compat="astra-sim-1.0")


@pytest.mark.parametrize(
    "item",
    [
        "ll=1000:0.6",
        "ll128=1000:0.95",
        "simple=1000:1.1",
        "use=nvls.simple@9-8",
        "use=ring.ll@1-8+ring.simple@4-16",
        "use=ring@1-2",
        "use=pat.simple@1-2",
        "ch=65",
        "nvch=2.5",
        "nvls=1000:0.5:-1",
        "ll=1000:0.5:7",
    ],
)
def test_nccl_parameters_beyond_their_physical_bounds_are_refused(item):
    """Protocols beyond their share of the wire, a reversed, overlapping or unknown use, 65 channels, ..."""
    with pytest.raises(UsageError):
        parse_topology(f"SW(8,400,600,nccl)_NCCL({item})")


def test_the_nccl_item_reads_back_to_the_same_parameters():
    """spec() of a topology with every NCCL(...) key parses back to an equal topology."""
    params = NcclParams(
        PARAMS.base_ns, (0.1, 0.5, 0.9), 3000.0, 0.6, ("Ring", "Tree"), 0.7, 0.8, 12.5, ("LL", "Simple"), True,
        (("Ring", "LL", 8, 64), ("Tree", "Simple", 1024, 1 << 20)), 250.0, 32,
    )  # fmt: skip
    topo = parse_topology("FC(8,400,800,nccl)_SW(2,46.5,2700,nccl)_" + params.spec())
    assert parse_topology(topo.spec()) == topo and topo.nccl == params


def test_the_engine_times_one_chunk_as_the_flat_call_whatever_the_policy():
    """model_collective on a 2-dim nccl topology takes the flat algorithm's time, every op and policy."""
    topo = parse_topology("SW(4,400,600,nccl)_SW(2,46.5,2700,nccl)_" + PARAMS.spec())
    for op in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all"):
        coll = Collective(op, 1 << 20, "float32", 1, (0, 1))
        want = nccl.collective_ns(topo, (0, 1), op, 4 * (1 << 20)).time_ns
        for policy in ("baseline", "themis"):
            result, _ = model_collective(topo, coll, policy)
            assert result.time_us * 1e3 == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("spec", ["SW(8,400,600,nccl)", "SW(4,400,600,nccl)_SW(2,46.5,2700,nccl)"])
def test_chunks_of_one_collective_are_one_nccl_call(spec):
    """C chunks take the call's time (its latency once): not C calls of S/C, whatever the policy."""
    topo = parse_topology(spec + "_" + PARAMS.spec())
    dims = tuple(range(len(topo.dims)))
    size = 64 * MIB
    call = nccl.collective_ns(topo, dims, "all_reduce", size)
    for chunks in (4, 64):
        part = nccl.collective_ns(topo, dims, "all_reduce", size / chunks)
        for policy in ("baseline", "themis"):
            coll = Collective("all_reduce", size // 4, "float32", chunks, dims)
            t = model_collective(topo, coll, policy)[0].time_us * 1e3
            assert t == pytest.approx(call.time_ns, rel=1e-9) and t < chunks * part.time_ns


def test_emulator_equals_model_with_the_nccl_model_on_8_ranks(tmp_path):
    """8 ranks, a 2-dim nccl topology: every op and policy reduces exactly, in the model's time."""
    cases = [
        {"op": op, "count": count, "dtype": dtype, "chunks": chunks, "policy": pol, "intra": intra}
        for op, count, dtype, chunks in [
            ("all_reduce", 100003, "float32", 1),
            ("all_reduce", 1 << 15, "int64", 4),
            ("reduce_scatter", 1 << 14, "float64", 2),
            ("all_gather", 1 << 14, "float64", 2),
        ]
        for pol, intra in [("baseline", "fifo"), ("themis", "scf")]
    ]
    topology = "SW(4,400,600,nccl)_SW(2,46.5,2700,nccl)_" + PARAMS.spec()
    rows = run_cases(8, {"topology": topology, "cases": cases}, tmp_path)
    assert len(rows) == len(cases)
    for r in rows:
        assert r["emu"]["wrong"] == 0, r["case"]
        assert r["emu"]["time_us"] == r["model"]["time_us"], r["case"]
        assert r["time_min_us"] == r["time_max_us"]


# --- the GPU table -------------------------------------------------------------------------------


def test_every_gpu_row_has_a_source_and_finds_itself_in_device_names():
    """Each row names its datasheet, has a rate and NVLS only from Hopper on an NVSwitch; device names find it."""
    for g in GPUS:
        assert len(g.source) > 30 and g.link_gbps > 0 and g.vendor in ("nvidia", "amd")
        assert not g.nvls or (g.arch in ("hopper", "blackwell") and g.fabric == "Switch")
    names = {
        "NVIDIA H100 80GB HBM3": "H100",
        "NVIDIA A100-SXM4-40GB": "A100",
        "NVIDIA A100-PCIE-40GB": "A100 PCIe",
        "NVIDIA H200": "H200",
        "NVIDIA GB200": "GB200",
        "NVIDIA B200": "B200",
        "AMD Instinct MI300X": "MI300X",
        "AMD Instinct MI355X": "MI355X",
    }
    for device, row in names.items():
        assert gpu_of(device).name == row
    assert gpu_of("NVIDIA Tesla K80") is None


# --- reading logs ------------------------------------------------------------------------------

SHIPPED = [  # path, op, NPUs, sizes, device, GPUs per node, where the NPU count comes from
    (DGX, "all_reduce", 8, 32, "NVIDIA H100 80GB HBM3", 8, "Rank lines"),
    (TWO_NODE, "all_reduce", 16, 32, "NVIDIA H100 80GB HBM3", 8, "Rank lines"),
    (TWO_NODE_RING, "all_reduce", 16, 14, "", 8, "busbw/algbw"),  # "2 nodes" in its comment
    (RS_PARTIAL, "reduce_scatter", 8, 7, "NVIDIA H100 80GB HBM3", 8, "Rank lines"),
    (MI300X, "all_reduce", 8, 31, "AMD Instinct MI300X", 8, "Rank lines"),
    (MI300X_2, "all_reduce", 16, 32, "AMD Instinct MI300X", 8, "Rank lines"),
    (A100_2, "all_reduce", 16, 31, "NVIDIA A100-SXM4-40GB", 8, "Rank lines"),
    (GB200, "all_reduce", 8, 33, "", 4, "NCCL INFO nranks"),
    (MI325X, "all_reduce", 64, 3, "", 8, "busbw/algbw"),
]


@pytest.mark.parametrize(
    "path,op,npus,rows,device,per_node,source", SHIPPED, ids=lambda v: getattr(v, "name", None)
)
def test_every_shipped_log_reads_as_posted(path, op, npus, rows, device, per_node, source):
    """Op, NPU count and its source, sizes, device name and GPUs per node, with no flag."""
    log = read_nccl_log(str(path))
    assert (log.op, log.npus, len(log.rows), log.device) == (op, npus, rows, device)
    assert (log.gpus_per_node, log.npus_source) == (per_node, source)


def test_the_npu_count_without_rank_lines_comes_from_busbw_over_algbw():
    """No Rank lines: n solves busbw/algbw = 2(n-1)/n (all-reduce) or (n-1)/n, and the log says so."""
    log = read_nccl_log(str(TWO_NODE_RING))
    r = log.rows[-1]
    assert r.busbw / r.algbw == pytest.approx(2 * 15 / 16, abs=0.01)
    assert log.npus_source == "busbw/algbw" and any("inferred" in n for n in log.notes)
    partial = read_nccl_log(str(RS_PARTIAL))
    assert partial.rows[-1].time_in_place_us is None and partial.rows[-2].time_in_place_us == 10452


def test_a_log_of_several_runs_is_read_whole_with_each_run_s_nodes():
    """MI325X: four runs of 8, 16, 32, 64 NPUs (their N-node titles), NCCL_ALGO=Ring, AMD from the log's text."""
    log = read_nccl_log(str(MI325X))
    assert [r.npus for r in log.runs] == [8, 16, 32, 64] and log is log.runs[-1]
    assert [r.npus // r.gpus_per_node for r in log.runs] == [1, 2, 4, 8]
    assert log.nccl_algo == "Ring" and log.vendor == "amd" and all(r.partial for r in log.runs)
    one = read_nccl_log(str(MI325X), table=2)
    assert one.npus == 16 and one.runs == [one]


def test_machines_come_from_the_log_and_the_gpu_table():
    """The GPU row sets the link rate and algorithms; no name leaves it fitted; beyond-NIC busbw means one NVLink domain."""
    a100 = machine_of(read_nccl_log(str(A100_2)))
    assert (a100.gpu, a100.link_gbps, a100.per_node, a100.nic_gbps) == ("A100", 300.0, 8, 25.0)
    assert "NVLS" not in a100.algos and "NVLSTree" not in a100.algos
    mi = machine_of(read_nccl_log(str(MI300X)))
    assert (mi.vendor, mi.fabric, mi.protocols, mi.rccl) == ("amd", "FullyConnected", ("LL", "Simple"), True)
    gb = machine_of(read_nccl_log(str(GB200)))
    assert gb.link_gbps == 0 and gb.link_bounds[1] == 900.0 and gb.per_node == 8  # 2 trays, one domain
    ring = machine_of(read_nccl_log(str(TWO_NODE_RING)))
    assert ring.algos == ("Ring",) and ring.per_node == 8


def _variant(tmp_path, name: str, text: str, newline: str = "\n"):
    path = tmp_path / name
    path.write_bytes(text.replace("\n", newline).encode())
    return str(path)


def _table_rows(log) -> list[tuple[int, float]]:
    return [(r.size_bytes, r.time_us) for r in log.rows]


def _rewrite_rows(path, fields):
    """The log with every table row's fields passed through `fields`."""
    out = []
    for line in path.read_text().splitlines():
        f = line.split()
        if f and f[0].isdigit() and len(f) >= 9:
            line = "  ".join(fields(f))
        out.append(line)
    return "\n".join(out) + "\n"


@pytest.mark.parametrize(
    "name,fields",
    [
        ("old-12-columns", lambda f: f[:4] + f[5:8] + ["0e+00"] + f[9:12] + ["0e+00"]),
        ("per-iteration", lambda f: f[:9] + ["1", "2", "3", "4"] + f[9:13] + ["1", "2", "3", "4"]),
        ("timestamp", lambda f: f + ["2025-01-01", "12:00:00"]),
        ("in-place-only", lambda f: f[:5] + f[5:9]),
    ],
)
def test_every_nccl_tests_row_format_reads_the_same_times(tmp_path, name, fields):
    """nccl-tests before 2.13 (no root, error values), per-iteration columns, a timestamp, one half: same times."""
    log = read_nccl_log(_variant(tmp_path, f"{name}.txt", _rewrite_rows(DGX, fields)))
    assert _table_rows(log) == _table_rows(read_nccl_log(str(DGX))) and log.npus == 8


def test_an_old_all_gather_log_without_redop_and_root_reads_and_fits(tmp_path):
    """An 11-column all_gather table (nccl-tests before 2.13) reads as all_gather over 8 NPUs (busbw 7/8 algbw)."""

    def gather(f):
        algbw = float(f[6])
        return f[:3] + [
            f[5],
            f[6],
            f"{algbw * 7 / 8:.2f}",
            "0e+00",
            f[9],
            f[10],
            f"{float(f[10]) * 7 / 8:.2f}",
            "0e+00",
        ]

    text = _rewrite_rows(DGX, gather).replace("all_reduce", "all_gather")
    text = "\n".join(line for line in text.splitlines() if "Rank" not in line) + "\n"
    log = read_nccl_log(_variant(tmp_path, "ag.txt", text))
    assert (log.op, log.npus, len(log.rows)) == ("all_gather", 8, 32)


@pytest.mark.parametrize(
    "name,edit",
    [
        (
            "tag-output",
            lambda t: "".join(f"[1,{i % 8}]<stdout>:{line}\n" for i, line in enumerate(t.splitlines())),
        ),
        (
            "slurm",
            lambda t: "".join(
                f"0: {line}\n"
                + ("3: NCCL INFO Channel 00/24 : 0 1 2\n[host:1234] warning: noise\n" if i % 5 else "")
                for i, line in enumerate(t.splitlines())
            ),
        ),
        ("crlf", lambda t: t.replace("\n", "\r\n")),
        (
            "no-header",
            lambda t: "".join(
                line + "\n"
                for line in t.splitlines()
                if not line.startswith("#  ")
                and "size" not in line
                and "(B)" not in line
                and "place" not in line
            ),
        ),
    ],
)
def test_launcher_prefixes_noise_crlf_and_a_missing_header_read_the_same_table(tmp_path, name, edit):
    """Open MPI's tag-output, Slurm's 0: prefix with noise, CRLF and no header give the same rows and NPUs."""
    plain = read_nccl_log(str(DGX))
    log = read_nccl_log(_variant(tmp_path, name, edit(DGX.read_text())))
    assert _table_rows(log) == _table_rows(plain) and log.npus == 8 and log.op == "all_reduce"


def test_a_cut_device_list_keeps_the_rank_count_of_busbw_over_algbw(tmp_path):
    """Only ranks 0-3 of 16 listed: 16 NPUs from busbw/algbw, and the device name from the lines left."""
    lines = [
        line
        for line in TWO_NODE.read_text().splitlines()
        if not any(f"Rank {k:2d} " in line for k in range(4, 16))
    ]
    log = read_nccl_log(_variant(tmp_path, "cut.txt", "\n".join(lines) + "\n"))
    assert log.npus == 16 and log.npus_source == "busbw/algbw" and log.device == "NVIDIA H100 80GB HBM3"


def test_a_single_process_g8_log_counts_its_rank_lines(tmp_path):
    """-g 8 (one process, 8 GPUs, old Rank lines without Group): 8 NPUs from the 8 Rank lines, 8 per node."""
    lines = DGX.read_text().splitlines()
    out = []
    for line in lines:
        if "Rank" in line:
            k = int(line.split()[2])
            line = f"#   Rank  {k} Pid  4242 on     node01 device  {k} [0x{k:02x}] NVIDIA H100 80GB HBM3"
        out.append(line.replace("nGpus 1", "nGpus 8"))
    log = read_nccl_log(_variant(tmp_path, "g8.txt", "\n".join(out) + "\n"))
    assert (log.npus, log.npus_source, log.gpus_per_node) == (8, "Rank lines", 8)


def test_a_truncated_last_row_is_dropped_with_a_note(tmp_path):
    """A last row cut inside its out-of-place half is ignored with a note."""
    text = DGX.read_text().rstrip("\n").splitlines()
    last = next(i for i in range(len(text) - 1, 0, -1) if text[i].split()[:1] == ["17179869184"])
    cut = text[: last + 1]
    cut[last] = " ".join(cut[last].split()[:6])
    log = read_nccl_log(_variant(tmp_path, "cut.txt", "\n".join(cut) + "\n"))
    assert log.rows[-1].size_bytes == 8 << 30 and any("cut short" in n for n in log.notes)


@pytest.mark.parametrize("size", ["\u00b32", "9" * 5000], ids=["superscript", "5000-digit"])
def test_odd_digits_in_the_size_column_give_one_line_and_exit_2(tmp_path, capsys, size):
    """A superscript digit or a 5,000-digit size is refused with one line (ASCII digits, at most 2^50 B)."""
    lines = DGX.read_text().splitlines()
    k = next(i for i, line in enumerate(lines) if line.split()[:2] == ["32", "8"])
    lines[k] = lines[k].replace("32", size, 1)
    assert main(["calibrate", _variant(tmp_path, "odd.txt", "\n".join(lines) + "\n")]) == 2
    assert "size" in error_line(capsys)


@pytest.mark.parametrize("times_kind", ["constant", "tiny"])
def test_constant_or_tiny_times_say_the_log_cannot_be_fitted(tmp_path, capsys, times_kind):
    """Times that do not grow, or that imply a 1e13 GB/s network, end in 'cannot be fitted', exit 2."""

    def edit(f):
        f[5] = "10.0" if times_kind == "constant" else f"{int(f[0]) * 1e-13 + 1e-6:.3g}"
        return f

    assert main(["calibrate", _variant(tmp_path, "bad.txt", _rewrite_rows(DGX, edit))]) == 2
    assert "cannot be fitted" in error_line(capsys)


def test_a_fit_file_is_a_topology_and_a_json_that_is_none_says_so(tmp_path, capsys):
    """read_fit reads topology, chunks and args; a JSON without 'topology' gets one line, not 'ASTRA-sim YAML'."""
    path = tmp_path / "fit.json"
    path.write_text(json.dumps({"topology": "SW(8,400,600,nccl)_" + PARAMS.spec(), "chunks": 3, "args": []}))
    assert read_fit(str(path)).chunks == 3 and parse_topology(str(path)).nccl == PARAMS
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({"rows": []}))
    assert main(["model", "-t", str(bad)]) == 2
    line = error_line(capsys)
    assert "calibrate --json" in line and "YAML" not in line


def test_a_million_npus_do_not_hang(capsys):
    """Calibrate --npus 1048576 answers within a minute (the fit times a flat algorithm, no engine run)."""
    start = time.perf_counter()
    status = main(["calibrate", str(RS_PARTIAL), "--npus", str(1 << 20)])
    capsys.readouterr()
    assert status in (0, 2) and time.perf_counter() - start < 60


def test_the_fit_solves_its_normal_equations_without_lapack():
    """The fit's own elimination solves a x = b as LAPACK does, and reports a singular a as None."""
    from themis_mpi.calibrate.optimise import _solve

    rng = np.random.default_rng(7)
    a = rng.normal(size=(9, 9)) + 9 * np.eye(9)
    b = rng.normal(size=9)
    assert np.allclose(_solve(a, b), np.linalg.solve(a, b), rtol=1e-12, atol=1e-12)
    assert _solve(np.ones((3, 3)), np.ones(3)) is None
    assert math.isfinite(PROTOCOL_CAPS[1])


# --- the fit's fast paths ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "npus", "switch", "op"),
    [
        (NcclParams(channels=5.5, net_efficiency=0.7, tree_efficiency=0.6), (8, 4), True, "all_reduce"),
        (NcclParams(), (8,), True, "all_reduce"),
        (
            NcclParams(rccl=True, protocols=("LL", "Simple"), algos=("Ring", "Tree", "MSCCL")),
            (8, 2),
            False,
            "all_reduce",
        ),
        (
            NcclParams(rccl=True, protocols=("LL", "Simple"), algos=("Ring", "MSCCL")),
            (8,),
            False,
            "all_reduce",
        ),
        (NcclParams(channels=3.0, net_efficiency=0.9), (4, 2, 2), True, "reduce_scatter"),
        (NcclParams(algos=("Tree",)), (8, 2), True, "broadcast"),
    ],
)
def test_pairs_of_many_sizes_at_once_are_each_size_alone_bit_for_bit(params, npus, switch, op):
    """`nccl.pairs` times all sizes in one array per algorithm (a fit's hot path, its size-only rows cached).

    Each size's time must be the one the size alone gets, to the last bit, whether the cached rows
    are fresh or reused (another call's sizes in the cache must not leak into this one's).
    """
    lv = [
        nccl.Level(n, (300.0 if j == 0 else 50.0) * GB, 500.0 * (j + 1), switch) for j, n in enumerate(npus)
    ]
    sizes = np.array([8.0 * 4**k for k in range(17)] + [3e9])
    nccl._BY_SIZES.clear()
    cold = nccl.pairs(params, lv, op, sizes)
    warm = nccl.pairs(params, lv, op, sizes)
    assert [(p.algorithm, p.protocol) for p in cold] == [(p.algorithm, p.protocol) for p in warm]
    for i, size in enumerate(sizes):
        alone = nccl.pairs(params, lv, op, [size])
        for a, b, c in zip(cold, warm, alone):
            assert a.times_ns[i] == b.times_ns[i] == c.times_ns[0], (a.algorithm, a.protocol, size)


def test_the_fit_s_unchecked_params_are_the_checked_ones():
    """The fit's candidates skip `NcclParams`' checks (`ncclfit._trusted`): they must equal `replace`'s."""
    from themis_mpi.calibrate.ncclfit import _trusted

    base = NcclParams(algos=("Ring", "NVLS"), nvls_channels=32, uses=(("Ring", "LL", 8, 64),))
    changes = {
        "base_ns": (700.0, 9000.0, 12000.0),
        "efficiency": (0.4, 0.9, 0.95),
        "channels": 7.25,
        "uses": (),
    }
    fast, checked = _trusted(base, **changes), replace(base, **changes)
    assert fast == checked and hash(fast) == hash(checked) and fast.spec() == checked.spec()
    assert fast is not base and base.channels == 16.0  # the original untouched
