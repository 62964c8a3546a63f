"""Calibration of real machines (issue 47): fits of every shipped log, predictions, -t FIT.json, Themis.

Each fit takes seconds, so these tests are `slow`; the per-log tables of the issue's bounds are
`reference` tables (one test per log, every failing size printed). Logs live in
tests/data/nccl-tests (copied from ../shared/hardware-logs with their sources).
"""

import json
import math
import sys

import harness
import numpy as np
import pytest
from harness import DATA, ROOT

from themis_mpi import api, nccl
from themis_mpi.calibrate import busbw_of, fit_nccl, machine_of, per_dim, predict, read_nccl_log
from themis_mpi.calibrate.ncclfit import PARAMS
from themis_mpi.cli import main
from themis_mpi.collectives import Collective
from themis_mpi.config import RunConfig
from themis_mpi.run.collective import model_collective
from themis_mpi.topology import NcclParams, parse_topology

pytestmark = pytest.mark.slow
sys.path.insert(0, str(ROOT / "scripts"))
from study_hardware import NCCL_PREDICTIONS  # noqa: E402

LOGS = DATA / "nccl-tests"
NAMES = sorted(p.name for p in LOGS.glob("*.txt"))
# The issue's bounds on the held-out sizes from 64 KiB (median, 90th percentile, worst) and from 64 MiB
BOUNDS = {"median_pct": 3.0, "p90_pct": 10.0, "worst_from_64KiB_pct": 15.0, "worst_from_64MiB_pct": 5.0}
PARTIAL_PCT = 5.0
# Logs whose fit misses a bound today, and why (strict: a log that starts to pass must leave this list).
SHORT = {
    "h100x16_2node_ib_issue309_qoofyk.txt": "1 MiB -18 %: the log's LL128 tree takes 72-76 us from 1 to 2 MiB "
    "(latency-bound) where the LL128 tree fitted through 2 and 8 MiB falls to 59 us; 1 MiB is held out between "
    "LL's range (to 512 KiB, whose out-of-place 77.7 us is 10 % above its in-place 70.3) and LL128's; NCCL's "
    "tree LL128 chunking (enqueue.cc calcCollChunking, nstepsLL128 = 2.8) gives 32 KiB chunks at both 1 and "
    "2 MiB on 8 or more channels, so no chunk threshold separates them either",
    "h100x16_2node_ib_ring_issue309_gjaion.txt": "128 MiB -5.7 %: the ring's time per byte from 64 to 128 MiB is "
    "30 % above its slope from 256 MiB up (both columns: 795.8 and 795.7 us); its chunk (S / 24 channels / 16 "
    "ranks) stays below NCCL's 512 KiB step at both sizes, so no NCCL threshold lies between them",
    "a100x16_2node_oci_roce.txt": "median 4.2 %, 64 MiB +6.2 % and 1 GiB -5.5 %: the log's 16-512 MiB are "
    "ring-like (busbw 111-166 GB/s, under the NICs) and its 1 GiB jump (219) the tree; NCCL's tuner (tuning.cc) "
    "rates a 2-node tree at 0.5 x 0.92 of its graph's bus bandwidth (LL128: x 120/128, capped per channel) "
    "against the ring's 16/30 (LL128 x 0.92), times treeCorrectionFactor (0.5-0.9 below 512 MiB): on equal graph bandwidths "
    "it runs the ring there; the fit labels 256 KiB-256 MiB LL128 tree (0.9 at 64 MiB, 1 at 128 MiB) instead, and which "
    "pair wins at a held-out size needs the graphs' bandwidths NCCL compares, which the log does not print",
    "gb200x8_2tray_mnnvl_NOHEADER.txt": "64 MiB -12 %: NCCL's tuner rates NVLS at 25 us (tuning.cc hwLatencies) "
    "against Ring Simple's 8.4 + 14 x 3.4 = 56 us, and runs NVLS from 128 MiB, so it rates NVLS faster at every "
    "size and runs it from where Ring LL stops: 16-64 MiB are NVLS with 32 KiB chunks (32 channels x 8 heads), "
    "at 3.3-3.5 us/MiB where a cost linear in the chunk count, fitted on the 64 and 128 KiB chunks (2.4 and "
    "2.15 us/MiB), gives 3.0. The fit puts 16-32 MiB on Ring Simple instead and 64 MiB, held out, on NVLS "
    "(231 us against 265); p90 12.4 %",
    "mi300x16_2node_roce_rccl.txt": "1 MiB -32 %: RCCL's MI300 tuner (tuning.cc tuning_model_5, the LL rows "
    "alike in RCCL 2.21.5 and later) rates tree LL above ring LL at 1 and 2 MiB whatever the graph's bandwidth "
    "(ring LL's correction 0.4 against tree LL's 1.0, at twice the latency), so RCCL runs tree LL at 1 MiB, as "
    "the log's 109 us from 512 KiB (4.8 GB/s) says; but the model's tree LL, fitted through 8 B-512 KiB, gives "
    "278 us there. Choosing by that tuner (tried, with search.cc's 7 x 48 GB/s xGMI bus bandwidth) leaves "
    "1 MiB at -33 % and moves 256 MiB onto tree Simple (+47 %): 2.21.5's tables switch to ring Simple at "
    "512 MiB, a later RCCL's at 128 MiB, the log's 2.22.3 at 256 MiB; 64 MiB +6.8 %",
}
MIB = 1 << 20
_FITS: dict = {}


@pytest.fixture(scope="module", autouse=True)
def fits_at_once(request):
    """The fits of the logs the selected per-log tests check, computed first, two at a time.

    (`harness.fit_nccl_at_once`: the same fits, on both cores; `fitted` then finds them.)
    """
    selected = [item for item in request.session.items if item.module is request.module]
    names = {getattr(item, "callspec", None) and item.callspec.params.get("name") for item in selected}
    harness.fit_nccl_at_once([read_nccl_log(str(LOGS / n)) for n in NAMES if n in names])


def fitted(name: str):
    """The log and its fit, computed once per test session (`harness.fit_nccl`, shared with the studies)."""
    if name not in _FITS:
        log = read_nccl_log(str(LOGS / name))
        _FITS[name] = (log, harness.fit_nccl(log))
    return _FITS[name]


def misses(run: dict) -> list[str]:
    """Every size and figure of one run that breaks the issue's bounds, as printable lines."""
    s, rows = run["summary"], run["rows"]
    if not s["held_out"]:  # a partial run: fitted on all its sizes, each within 5 %
        return [
            f"{r['size_bytes']} B: {r['time_error_pct']:+.1f} %"
            for r in rows
            if abs(r["time_error_pct"]) > PARTIAL_PCT
        ]
    out = [f"{k} {s[k]:.1f} > {bound}" for k, bound in BOUNDS.items() if not s[k] <= bound]
    judged = [r for r in rows if not r["fitted"] and r["size_bytes"] >= 64 << 10]
    limit = {True: BOUNDS["worst_from_64MiB_pct"], False: BOUNDS["worst_from_64KiB_pct"]}
    out += [
        f"{r['size_bytes']} B: {r['time_error_pct']:+.1f} % ({r['algorithm']}/{r['protocol']})"
        for r in judged
        if abs(r["time_error_pct"]) > limit[r["size_bytes"] >= 64 * MIB]
    ]
    return out


@pytest.mark.reference
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=SHORT[n])) if n in SHORT else n
        for n in NAMES
    ],
)
def test_each_log_fits_within_the_issue_s_bounds_on_its_held_out_sizes(name):
    """Fitted on the even-indexed sizes, judged on the odd ones from 64 KiB (partial runs: all sizes, 5 %)."""
    _, fit = fitted(name)
    failing = [f"{run['label']}: {m}" for run in fit.runs for m in misses(run)]
    assert not failing, "\n".join(failing)


@pytest.mark.parametrize("name", NAMES)
def test_no_fitted_parameter_leaves_its_bounds_or_uses_an_algorithm_the_hardware_lacks(name):
    """Every fitted value in its bounds (a value on one is reported), every chosen pair one the machine has."""
    log, fit = fitted(name)
    machine = machine_of(log)
    for key, value in fit.fitted.items():
        lo, hi = machine.link_bounds if key == "link_gbps" else PARAMS[key][:2]
        assert lo * (1 - 1e-4) <= value <= hi * (1 + 1e-4), (key, value)
        assert (key in fit.on_bounds) == (min(value - lo, hi - value) <= 0.005 * (hi - lo)), key
    for run in fit.runs:
        for r in run["rows"]:
            assert r["algorithm"] in machine.algos and r["protocol"] in machine.protocols, r
    if machine.rccl or machine.gpu in ("A100",):
        assert "NVLS" not in fit.topology.lower() or "algos=" in fit.topology


def _synthetic_log(tmp_path, topo, sizes, name: str, op: str = "all_reduce") -> str:
    """An nccl-tests table of `topo`'s NCCL-like times of `op`, with Rank lines naming an H100."""
    npus = topo.npus
    lines = [f"# ./build/{op}_perf -b {sizes[0]} -e {sizes[-1]}"]
    lines += [f"#  Rank {k:2d} Group  0 Pid {100 + k} on node{k // 8} device {k % 8} [0x0{k % 8}] NVIDIA H100 80GB HBM3"
              for k in range(npus)]  # fmt: skip
    redop, root = ("sum", -1) if op == "all_reduce" else ("none", 0)
    for s in sizes:
        t_us = nccl.collective_ns(topo, range(len(topo.dims)), op, s).time_ns / 1e3
        algbw = s / t_us / 1e3
        busbw = algbw * busbw_of(op, npus)
        lines.append(f"{s:>12} {s // 4:>12} float {redop} {root} {t_us:.6g} {algbw:.2f} {busbw:.2f} 0 "
                     f"{t_us:.6g} {algbw:.2f} {busbw:.2f} 0")  # fmt: skip
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


SYNTHETIC = {  # nodes: (parameters, dims, NCCL_ALGO, the parameters the log identifies)
    1: (
        NcclParams(
            (5000.0, 9000.0, 5000.0), (0.2, 0.7, 0.9), 95000.0, 0.55, channels=16
        ),  # each pair 2+ sizes
        "SW(8,419.095,600,nccl)",
        "",
        {"eff_LL": 0.2, "eff_LL128": 0.7, "eff_Simple": 0.9, "nvls_eff": 0.55, "base_LL": 5000.0},
    ),
    2: (
        NcclParams(
            (5000.0, 12000.0, 20000.0), (0.3, 0.5, 0.9), algos=("Ring",), channels=16, net_efficiency=0.8
        ),
        "SW(8,419.095,600,nccl)_SW(2,46.5661,10000,nccl)",
        "NCCL_ALGO=Ring\n",
        {"net_eff": 0.8},
    ),
}


@pytest.mark.parametrize("nodes", [1, 2])
def test_a_synthetic_log_of_known_parameters_is_recovered_within_5_percent(tmp_path, nodes):
    """A log made from known parameters is fitted back: every size within 3 %, the parameters within 5 %.

    The parameters the log identifies: on one node each protocol's share and NVLS's, on two nodes
    under NCCL_ALGO=Ring the NICs' share and the network step.
    """
    params, dims, env, want = SYNTHETIC[nodes]
    truth = parse_topology(f"{dims}_{params.spec()}")
    sizes = sorted(
        {4 * round(2 ** (k / 2)) for k in range(2, 64)}
    )  # -f 1.41: every regime has 3+ fitted sizes
    path = _synthetic_log(tmp_path, truth, sizes, f"synthetic{nodes}.txt")
    with open(path, "a") as f:
        f.write(env)
    fit = fit_nccl(read_nccl_log(path))
    for r in fit.rows:
        assert abs(r["time_error_pct"]) < 3.0, r
    for key, value in want.items():
        assert fit.fitted[key] == pytest.approx(value, rel=0.05), key
    assert all(PARAMS[k][0] <= v <= PARAMS[k][1] for k, v in fit.fitted.items()), fit.fitted
    for got, dim in zip(parse_topology(fit.topology).dims, truth.dims):
        assert (got.kind, got.npus, got.bandwidth_gbps) == (dim.kind, dim.npus, dim.bandwidth_gbps)
        assert got.latency_ns == pytest.approx(dim.latency_ns, rel=0.05)


@pytest.mark.parametrize("name", ["h100x8_nvls_dgxc.txt", "h100x16_2node_ib_ring_issue309_gjaion.txt"])
def test_the_model_command_calibrate_prints_and_t_fit_json_give_calibrate_s_times(tmp_path, capsys, name):
    """`model -t TOPOLOGY -c CHUNKS ARGS -b S` and `model -t FIT.json -b S` (no -c) give every row's time."""
    out = tmp_path / "fit.json"
    assert main(["calibrate", str(LOGS / name), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc) >= {"topology", "chunks", "args", "rows", "fitted", "runs"} and doc["chunks"] == 1
    capsys.readouterr()
    for row in doc["rows"][::3]:
        for topology, chunks in ((doc["topology"], ["-c", str(doc["chunks"]), *doc["args"]]), (str(out), [])):
            args = [
                "model",
                "-t",
                topology,
                *chunks,
                "-b",
                str(row["size_bytes"]),
                "-o",
                doc["op"],
                "-d",
                "float32",
            ]
            assert main([*args, "-p", "baseline", "--json", str(tmp_path / "m.json")]) == 0
            (model,) = json.loads((tmp_path / "m.json").read_text())
            assert model["time_us"] == pytest.approx(row["model_us"], rel=1e-9) and model["chunks"] == 1
    capsys.readouterr()


@pytest.mark.parametrize("name", ["h100x8_nvls_dgxc.txt", "h100x16_2node_ib_ring_issue309_gjaion.txt"])
def test_a_calibrated_machine_in_64_chunks_at_64_mib_is_within_10_percent_of_the_log(tmp_path, name):
    """-c 64 on a fit is one NCCL call in 64 chunks (its latency once): within 10 % of the measured 64 MiB."""
    log, fit = fitted(name)
    measured = next(r.time_us for r in log.rows if r.size_bytes == 64 * MIB)
    (result,) = api.sweep(fit.topology, "64M", "baseline", 64, dtype="float32")
    assert abs(result.time_us - measured) / measured < 0.10
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(fit.to_dict()))
    (again,) = api.sweep(str(path), "64M", "baseline", dtype="float32")  # the fit's 1 chunk: the same call
    assert again.chunks == 1 and again.time_us == pytest.approx(result.time_us, rel=1e-9)


def test_api_calibrate_is_calibrate():
    """api.calibrate gives the CLI's fit of a log."""
    log, fit = fitted("h100x8_reduce_scatter_ring_issue1047_PARTIAL.txt")
    assert (
        api.calibrate(str(LOGS / "h100x8_reduce_scatter_ring_issue1047_PARTIAL.txt")).topology == fit.topology
    )


PAIRS = (
    NCCL_PREDICTIONS  # one node -> more nodes, from different clusters of one product (MI325X: one cluster)
)
SHORT_PREDICTIONS = {
    (
        "mi300x8_1node_rccl.txt",
        "mi300x16_2node_roce_rccl.txt",
        None,
    ): "256 MiB -12 %: the predicted ring Simple slope from 256 MiB (5.43 us/MiB) is the log's (5.40-5.49); "
    "the miss is its intercept: the log's ring line meets zero at 280-330 us (its floor is 218 us from 8 B to "
    "4 KiB; one node: 14 us), the prediction's at 118 us (NCCL's nominal 14 us network step). RCCL's tuner "
    "rates that ring at 17 + 26 x 6 + 4 x 320 = 1453 us (tuning_model_5's 320 us network step), a rating and "
    "not a time; nothing in either library gives a 2-node floor of 218 us",
}


def prediction(one: str, more: str, table):
    """A multi-node log predicted from the one-node fit and the NIC's nominal rate only."""
    if one == more:  # the one-node run of a log of several
        base_log = read_nccl_log(str(LOGS / one), table=1)
        base = harness.fit_nccl(base_log)
    else:
        base = fitted(one)[1]
    return predict(parse_topology(base.topology), read_nccl_log(str(LOGS / more), table=table))


@pytest.mark.reference
@pytest.mark.parametrize(
    "one,more,table",
    [
        pytest.param(*p, marks=pytest.mark.xfail(strict=True, reason=SHORT_PREDICTIONS[p]))
        if p in SHORT_PREDICTIONS
        else p
        for p in PAIRS
    ],
    ids=lambda v: str(v),
)
def test_more_nodes_are_predicted_within_10_percent_from_256_mib(one, more, table):
    """The one-node fit plus the NIC's nominal rate predict each size from 256 MiB within 10 %."""
    p = prediction(one, more, table)
    failing = [
        f"{r['size_bytes']} B: {r['time_error_pct']:+.1f} % ({r['algorithm']})"
        for r in p["rows"]
        if r["size_bytes"] >= 256 * MIB and abs(r["time_error_pct"]) > 10
    ]
    assert not failing, "\n".join(failing)


def test_a_per_dim_view_agrees_with_its_fit_at_one_chunk():
    """On the 2-node fit, the view's one-chunk baseline and Themis take the flat time; its dims keep the fit's ratio."""
    _, fit = fitted("h100x16_2node_ib_issue309_qoofyk.txt")
    flat = parse_topology(fit.topology)
    params = flat.nccl
    for size in (64 * MIB, 1 << 30):
        view = per_dim(flat, size)
        want = nccl.collective_ns(flat, (0, 1), "all_reduce", size).time_ns / 1e3
        for policy, intra in (("baseline", "fifo"), ("themis", "scf")):
            coll = Collective("all_reduce", size // 4, "float32", 1, (0, 1))
            got = model_collective(view, coll, policy, RunConfig(intra=intra, network="ideal"))[0].time_us
            assert got == pytest.approx(want, rel=1e-6)  # (the view is the cost model's: `per_dim`)
        ratio = view.dims[0].bandwidth_gbps / view.dims[1].bandwidth_gbps
        fit_ratio = (
            params.efficiency[2]
            * flat.dims[0].bandwidth_gbps
            / (params.net_efficiency * flat.dims[1].bandwidth_gbps)
        )
        assert ratio == pytest.approx(fit_ratio)


def test_the_issue_s_10_ms_case_is_themis_moving_a_whole_chunk_onto_the_slow_dim():
    """1 GiB in 4 chunks on dims 11.7x apart: Themis's fourth chunk starts on dim 1 and carries all of itself there.

    The tracker's loads (docs/design.md#themis) after three baseline chunks leave dim 1 less loaded,
    so chunk 3 reduce-scatters its whole 256 MiB over the 2-NPU dim (128 MiB each way of RS and
    AG) where a baseline chunk sends 32 MiB: 352 MiB on dim 1 instead of 128, and dim 1 alone
    then needs longer than the baseline's whole collective.
    """
    topo = parse_topology("SW(8,419.095,600,ring)_SW(2,35.778,2047.4,ring)")
    coll = Collective("all_reduce", (1 << 30) // 4, "float32", 4, (0, 1))
    base, _ = model_collective(topo, coll, "baseline", RunConfig(intra="fifo"))
    themis, engine = model_collective(topo, coll, "themis", RunConfig(intra="scf"))
    orders = engine.collectives[0].orders.tolist()
    assert orders == [[0, 1], [0, 1], [0, 1], [1, 0]]
    chunk = (1 << 30) // 4
    baseline_dim1 = 4 * (chunk // 8)  # each chunk's AR on dim 1: an RS and an AG of half its 32 MiB
    assert base.dims[1].bytes == baseline_dim1
    assert themis.dims[1].bytes == 3 * (chunk // 8) + chunk  # chunk 3: RS and AG of half of 256 MiB
    dim1_us = themis.dims[1].bytes / (35.778 * 2**30) * 1e6
    assert themis.time_us > dim1_us > base.time_us


def test_the_themis_study_quick_rows_are_the_shipped_rows(tmp_path, monkeypatch, capsys):
    """scripts/study_calibrated.py --quick gives docs/hardware/themis.json's rows for its logs.

    Run in this process (its `main`, as the command runs it) with the session's fits of the logs
    (`harness.fit_nccl`): the fits are the command's own, computed once for the suite.
    """
    study = harness.script("study_calibrated")
    monkeypatch.setattr(study, "fit_nccl", harness.fit_nccl)
    assert study.main(["--quick", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    new = json.loads((tmp_path / "themis.json").read_text())
    shipped = json.loads((ROOT / "docs" / "hardware" / "themis.json").read_text())
    assert new and all(row in shipped for row in new)
    assert all(
        math.isclose(r["baseline"], r["themis"]) for r in new if r["part"] == "flat" or r.get("chunks") == 1
    )
    assert np.isfinite([r["baseline"] for r in new]).all()


def test_an_all_gather_log_is_fitted_and_model_o_all_gather_gives_its_times(tmp_path, capsys):
    """An all_gather table (DGX's times, busbw 7/8 algbw): calibrate fits it, `model -o all_gather -b SIZE` agrees."""
    out = []
    for line in (LOGS / "h100x8_nvls_dgxc.txt").read_text().splitlines():
        f = line.split()
        if f and f[0].isdigit() and len(f) == 13:
            f[3], f[7], f[11] = "none", f"{float(f[6]) * 7 / 8:.2f}", f"{float(f[10]) * 7 / 8:.2f}"
            line = "  ".join(f)
        out.append(line.replace("all_reduce", "all_gather"))
    log = tmp_path / "ag.txt"
    log.write_text("\n".join(out) + "\n")
    fit_path = tmp_path / "ag.json"
    assert main(["calibrate", str(log), "--json", str(fit_path)]) == 0
    doc = json.loads(fit_path.read_text())
    assert doc["op"] == "all_gather" and all(r["algorithm"] == "Ring" for r in doc["rows"])
    for row in doc["rows"][10::6]:
        args = [
            "model",
            "-t",
            str(fit_path),
            "-o",
            "all_gather",
            "-b",
            str(row["size_bytes"]),
            "-d",
            "float32",
        ]
        assert main([*args, "-p", "baseline", "--json", str(tmp_path / "m.json")]) == 0
        (model,) = json.loads((tmp_path / "m.json").read_text())
        assert model["time_us"] == pytest.approx(row["model_us"], rel=1e-9)
    capsys.readouterr()


def test_a_broadcast_log_is_fitted_back_and_model_o_broadcast_gives_its_times(tmp_path, capsys):
    """A broadcast_perf table of known parameters (busbw = algbw): fitted within 3 %, each protocol's share within 5 %.

    Broadcast exposes NCCL's ring (its only algorithm for it): every protocol's base latency and
    share of the links; `model -t FIT.json -o broadcast -b SIZE` reproduces calibrate's rows.
    """
    truth = parse_topology(
        "SW(8,419.095,600,nccl)_"
        + NcclParams((5000.0, 9000.0, 12000.0), (0.25, 0.7, 0.8), channels=16).spec()
    )
    sizes = sorted({4 * round(2 ** (k / 2)) for k in range(2, 64)})
    log = read_nccl_log(_synthetic_log(tmp_path, truth, sizes, "bcast.txt", "broadcast"))
    assert (log.op, log.npus, log.op_source) == ("broadcast", 8, "header")
    out = tmp_path / "bcast.json"
    assert main(["calibrate", log.path, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["op"] == "broadcast" and all(r["algorithm"] == "Ring" for r in doc["rows"])
    assert all(abs(r["time_error_pct"]) < 3.0 for r in doc["rows"])
    for key, value in {"eff_LL": 0.25, "eff_LL128": 0.7, "eff_Simple": 0.8}.items():
        assert doc["fitted"][key] == pytest.approx(value, rel=0.05), key
    for row in doc["rows"][20::9]:
        args = ["model", "-t", str(out), "-o", "broadcast", "-b", str(row["size_bytes"]), "-d", "float32"]
        assert main([*args, "-p", "baseline", "--json", str(tmp_path / "m.json")]) == 0
        (model,) = json.loads((tmp_path / "m.json").read_text())
        assert model["time_us"] == pytest.approx(row["model_us"], rel=1e-9)
    capsys.readouterr()


def test_a_multi_node_log_over_a_one_node_fit_fits_only_the_network(tmp_path, capsys):
    """--base node.json: dim 0 and the protocol shares are the base's; the NICs' parameters are fitted."""
    base = tmp_path / "node.json"
    assert main(["calibrate", str(LOGS / "h100x8_nvls_dgxc.txt"), "--json", str(base)]) == 0
    two = tmp_path / "two.json"
    log = str(LOGS / "h100x16_2node_ib_ring_issue309_gjaion.txt")
    assert main(["calibrate", log, "--base", str(base), "--json", str(two)]) == 0
    node, doc = json.loads(base.read_text()), json.loads(two.read_text())
    assert doc["topology"].startswith(node["topology"].split("_NCCL")[0] + "_SW(2,")
    assert {"net_eff", "net_step"} <= set(doc["fitted"]) and "eff_Simple" not in doc["fitted"]
    assert doc["prediction"] and len(doc["prediction"]["rows"]) == len(doc["rows"])
    capsys.readouterr()
