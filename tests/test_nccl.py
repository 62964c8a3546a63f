"""Rules for the NCCL-like model (`themis_mpi.nccl`) and for calibrating it on real nccl-tests logs."""

import json
import math
import time

import numpy as np
import pytest
from harness import DATA, run_cases

from themis_mpi import nccl
from themis_mpi.calibrate import fit_nccl, read_base, read_nccl_log, summary
from themis_mpi.cli import main
from themis_mpi.collectives import Collective
from themis_mpi.cost import CostModel
from themis_mpi.errors import UsageError
from themis_mpi.run.collective import model_collective
from themis_mpi.topology import NcclParams, parse_topology
from themis_mpi.units import BYTES_PER_GB

LOGS = DATA / "nccl-tests"
DGX = LOGS / "h100x8_nvls_dgxc.txt"
TWO_NODE = LOGS / "h100x16_2node_ib_issue309_qoofyk.txt"
TWO_NODE_RING = LOGS / "h100x16_2node_ib_ring_issue309_gjaion.txt"
RS_PARTIAL = LOGS / "h100x8_reduce_scatter_ring_issue1047_PARTIAL.txt"
MIB, KIB = 1 << 20, 1 << 10
PARAMS = NcclParams((5000.0, 9000.0, 40000.0), (0.1, 0.5, 1.0), 100000.0, 0.6)


def error_line(capsys) -> str:
    """The one stderr line of a refused command."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("themis-mpi: error:"), err
    return err[0]


# --- the model ---------------------------------------------------------------------------------


def test_one_level_ring_time_is_base_plus_steps_plus_bytes_over_efficient_bandwidth():
    """Ring/p on 8 NPUs: base_p + 14 L + 2 (7/8) S / (eff_p B), for every protocol."""
    topo = parse_topology("SW(8,100,500,nccl)_" + PARAMS.spec().replace("NCCL(", "NCCL(algos=ring,"))
    lv = nccl.levels(topo, (0,))
    b = 100 * BYTES_PER_GB / 1e9
    s = 3 * MIB
    for t, algo, proto in nccl.choices(topo.nccl, lv, "all_reduce", s):
        p = ("LL", "LL128", "Simple").index(proto)
        assert algo == "Ring"
        assert t == pytest.approx(PARAMS.base_ns[p] + 14 * 500 + 2 * 7 / 8 * s / (PARAMS.efficiency[p] * b))


def test_the_fastest_pair_is_chosen_per_size_ll_small_nvls_large():
    """On one switch, LL wins at 8 B and NVLS at 1 GiB; the choice is the least of all pairs."""
    topo = parse_topology("SW(8,400,600,nccl)_" + PARAMS.spec())
    for size, want in ((8, ("Ring", "LL")), (1 << 30, ("NVLS", "Simple"))):
        t, algo, proto = nccl.collective_ns(topo, (0,), "all_reduce", size)
        assert (algo, proto) == want
        assert t == min(c[0] for c in nccl.choices(topo.nccl, nccl.levels(topo, (0,)), "all_reduce", size))


def test_a_flat_ring_across_nodes_is_limited_by_the_node_s_nics_together():
    """Two nodes of 8: the ring's bus bandwidth is min(B0, 8 B1) and 2 of its 30 steps cross nodes."""
    params = NcclParams(PARAMS.base_ns, PARAMS.efficiency, 1e5, 0.6, ("Ring",))
    lv = [nccl.Level(8, 400.0, 600.0, True), nccl.Level(2, 40.0, 3000.0, True)]
    s = 1 << 30
    t, _, _ = min(c for c in nccl.choices(params, lv, "all_reduce", s) if c[2] == "Simple")
    assert t == pytest.approx(40000 + 28 * 600 + 2 * 3000 + 2 * 15 / 16 * s / min(400.0, 8 * 40.0))


def test_nccl_dims_are_all_or_none_and_not_part_of_astra_compat():
    """Mixing nccl with per-dim algorithms, a stray NCCL(...) or --compat astra-sim-1.0 is refused."""
    with pytest.raises(UsageError):
        parse_topology("SW(8,400,600,nccl)_SW(2,50,2000,ring)")
    with pytest.raises(UsageError):
        parse_topology("SW(8,400,600)_NCCL(ll=1:0.5)")
    with pytest.raises(UsageError):
        CostModel(parse_topology("SW(8,400,600,nccl)"), 4, compat="astra-sim-1.0")


def test_the_nccl_item_reads_back_to_the_same_parameters():
    """spec() of a topology with NCCL(...) parses back to an equal topology."""
    topo = parse_topology("SW(8,400,600,nccl)_SW(2,46.5,2700,nccl)_" + PARAMS.spec())
    assert parse_topology(topo.spec()) == topo and topo.nccl == PARAMS


def test_the_engine_spreads_the_flat_time_over_the_chunk_s_steps():
    """model_collective on a 2-dim nccl topology takes the flat algorithm's time, whatever the policy."""
    topo = parse_topology("SW(4,400,600,nccl)_SW(2,46.5,2700,nccl)_" + PARAMS.spec())
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        coll = Collective(op, 1 << 20, "float32", 1, (0, 1))
        want, _, _ = nccl.collective_ns(topo, (0, 1), op, 4 * (1 << 20))
        for policy in ("baseline", "themis"):
            result, _ = model_collective(topo, coll, policy)
            assert result.time_us * 1e3 == pytest.approx(want, rel=1e-12)


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


# --- reading logs ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path,op,npus,rows",
    [
        (DGX, "all_reduce", 8, 32),
        (TWO_NODE, "all_reduce", 16, 32),
        (TWO_NODE_RING, "all_reduce", 16, 14),
        (RS_PARTIAL, "reduce_scatter", 8, 7),
    ],
    ids=lambda v: getattr(v, "name", str(v)),
)
def test_every_shipped_log_reads_with_its_npu_count(path, op, npus, rows):
    """The four real logs read as they are: op, NPU count (from Rank lines or busbw/algbw) and sizes."""
    log = read_nccl_log(str(path))
    assert (log.op, log.npus, len(log.rows)) == (op, npus, rows)


def test_the_npu_count_without_rank_lines_comes_from_busbw_over_algbw():
    """No Rank lines: n solves busbw/algbw = 2(n-1)/n (all-reduce) or (n-1)/n, and the log says so."""
    log = read_nccl_log(str(TWO_NODE_RING))
    r = log.rows[-1]
    assert r.busbw / r.algbw == pytest.approx(2 * 15 / 16, abs=0.01)
    assert log.npus_source == "busbw/algbw" and any("inferred" in n for n in log.notes)
    partial = read_nccl_log(str(RS_PARTIAL))
    assert partial.rows[-1].time_in_place_us is None and partial.rows[-2].time_in_place_us == 10452


def _variant(tmp_path, name: str, text: str, newline: str = "\n"):
    path = tmp_path / name
    path.write_bytes(text.replace("\n", newline).encode())
    return str(path)


def _table_rows(log) -> list[tuple[int, float]]:
    return [(r.size_bytes, r.time_us) for r in log.rows]


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


def test_a_log_without_rank_lines_infers_8_npus(tmp_path):
    """The DGX log with its Rank lines removed: 8 NPUs from busbw/algbw, and a note saying so."""
    text = "".join(line + "\n" for line in DGX.read_text().splitlines() if "Rank" not in line)
    log = read_nccl_log(_variant(tmp_path, "noranks.txt", text))
    assert log.npus == 8 and log.npus_source == "busbw/algbw"


def test_a_single_process_g8_log_counts_its_rank_lines(tmp_path):
    """-g 8 (one process, 8 GPUs, old Rank lines without Group): 8 NPUs from the 8 Rank lines."""
    lines = DGX.read_text().splitlines()
    out = []
    for line in lines:
        if "Rank" in line:
            k = int(line.split()[2])
            line = f"#   Rank  {k} Pid  4242 on     node01 device  {k} [0x{k:02x}] NVIDIA H100 80GB HBM3"
        out.append(line.replace("nGpus 1", "nGpus 8"))
    log = read_nccl_log(_variant(tmp_path, "g8.txt", "\n".join(out) + "\n"))
    assert log.npus == 8 and log.npus_source == "Rank lines"


def test_all_gather_and_reduce_scatter_logs_infer_n_from_n_minus_1_over_n(tmp_path):
    """An all_gather table (redop none, busbw = 7/8 algbw) reads as all_gather over 8 NPUs."""
    out = ["# all_gather_perf -b 8 -e 16G -f 2 -g 1"]
    for line in DGX.read_text().splitlines():
        f = line.split()
        if f and f[0].isdigit():
            algbw = float(f[6])
            f[3], f[7], f[10] = "none", f"{algbw * 7 / 8:.2f}", f"{float(f[10]) * 7 / 8:.2f}"
            line = "  ".join(f)
        elif "Rank" in line:
            continue
        out.append(line.replace("all_reduce", "all_gather"))
    log = read_nccl_log(_variant(tmp_path, "ag.txt", "\n".join(out) + "\n"))
    assert (log.op, log.npus) == ("all_gather", 8)
    assert read_nccl_log(str(RS_PARTIAL)).op == "reduce_scatter"


def test_several_tables_are_listed_and_one_is_picked_with_table(tmp_path, capsys):
    """Two tables in one file: calibrate lists them in one line; --table 2 reads the second."""
    path = _variant(tmp_path, "two.txt", DGX.read_text() + TWO_NODE_RING.read_text())
    assert main(["calibrate", path]) == 2
    assert "2 tables" in error_line(capsys)
    log = read_nccl_log(path, table=2)
    assert _table_rows(log) == _table_rows(read_nccl_log(str(TWO_NODE_RING)))
    for k in ("0", "3"):
        assert main(["calibrate", path, "--table", k]) == 2
        assert "--table" in error_line(capsys)


def test_a_truncated_last_row_is_dropped_with_a_note_and_in_place_only_columns_are_read(tmp_path):
    """A last row cut inside its out-of-place half is ignored with a note; a table of in-place columns only reads."""
    text = DGX.read_text().rstrip("\n").splitlines()
    last = next(i for i in range(len(text) - 1, 0, -1) if text[i].split()[:1] == ["17179869184"])
    cut = text[: last + 1]
    cut[last] = " ".join(cut[last].split()[:6])
    log = read_nccl_log(_variant(tmp_path, "cut.txt", "\n".join(cut) + "\n"))
    assert log.rows[-1].size_bytes == 8 << 30 and any("cut short" in n for n in log.notes)
    only = []
    for line in text:
        f = line.split()
        if f and f[0].isdigit():
            line = "  ".join(f[:5] + f[9:13])
        only.append(
            line.replace("out-of-place", "in-place").replace(
                "in-place                       in-place", "in-place"
            )
        )
    inplace = read_nccl_log(_variant(tmp_path, "inplace.txt", "\n".join(only) + "\n"))
    assert inplace.rows[2].time_us == 13.52 and any("in-place" in n for n in inplace.notes)


@pytest.mark.parametrize("size", ["\u00b32", "9" * 5000], ids=["superscript", "5000-digit"])
def test_odd_digits_in_the_size_column_give_one_line_and_exit_2(tmp_path, capsys, size):
    """A superscript digit or a 5,000-digit size is refused with one line (ASCII digits, at most 2^50 B)."""
    lines = DGX.read_text().splitlines()
    k = next(i for i, line in enumerate(lines) if line.split()[:2] == ["32", "8"])
    lines[k] = lines[k].replace("32", size, 1)
    assert main(["calibrate", _variant(tmp_path, "odd.txt", "\n".join(lines) + "\n")]) == 2
    assert "size" in error_line(capsys)


@pytest.mark.parametrize("times", ["constant", "tiny"])
def test_constant_or_tiny_times_say_the_log_cannot_be_fitted(tmp_path, capsys, times):
    """Times that do not grow, or that imply a 1e13 GB/s network, end in 'cannot be fitted', exit 2."""
    out = []
    for line in DGX.read_text().splitlines():
        f = line.split()
        if f and f[0].isdigit():
            f[5] = "10.0" if times == "constant" else f"{int(f[0]) * 1e-13 + 1e-6:.3g}"
            line = "  ".join(f)
        out.append(line)
    assert main(["calibrate", _variant(tmp_path, "bad.txt", "\n".join(out) + "\n")]) == 2
    assert "cannot be fitted" in error_line(capsys)


def test_a_million_npus_do_not_hang(tmp_path, capsys):
    """Calibrate --npus 1048576 answers within seconds (the fit is closed form, no engine run)."""
    start = time.perf_counter()
    status = main(["calibrate", str(DGX), "--npus", str(1 << 20)])
    capsys.readouterr()
    assert status in (0, 2) and time.perf_counter() - start < 60


# --- the fit -----------------------------------------------------------------------------------


def test_the_single_node_fit_meets_the_bounds_on_held_out_sizes():
    """DGX H100: <= 5 % from 64 MiB, <= 15 % from 64 KiB; only even-indexed sizes were fitted."""
    log = read_nccl_log(str(DGX))
    result = fit_nccl(log)
    assert [r["fitted"] for r in result.rows] == [i % 2 == 0 for i in range(32)]
    s = summary(result.rows)
    assert s["all_worst_from_64MiB_pct"] <= 5 and s["all_worst_from_64KiB_pct"] <= 15
    assert len(result.fitted) == 7


def test_the_32_byte_outlier_does_not_drive_the_fit():
    """The 68 us row at 32 B (5x its neighbours) stays far off while 8 B and 128 B fit within 20 %."""
    rows = {r["size_bytes"]: r for r in fit_nccl(read_nccl_log(str(DGX))).rows}
    assert rows[32]["time_error_pct"] < -50
    assert abs(rows[8]["time_error_pct"]) < 20 and abs(rows[128]["time_error_pct"]) < 20


def test_the_small_sizes_run_ll_and_the_large_ones_simple():
    """The fit's choice: LL at 8 B (a few us), Simple (Ring or NVLS) from 64 MiB."""
    rows = fit_nccl(read_nccl_log(str(DGX))).rows
    assert rows[0]["protocol"] == "LL" and rows[0]["model_us"] < 20
    assert all(r["protocol"] == "Simple" for r in rows if r["size_bytes"] >= 64 * MIB)


@pytest.fixture(scope="module")
def base_fit(tmp_path_factory):
    path = tmp_path_factory.mktemp("fit") / "dgx.json"
    assert main(["calibrate", str(DGX), "--json", str(path)]) == 0
    return path


@pytest.mark.parametrize("log,algo", [(TWO_NODE, None), (TWO_NODE_RING, "Ring")], ids=["default", "ring"])
def test_the_two_node_fits_meet_the_bounds_and_report_the_prediction(base_fit, log, algo):
    """Dim 1 fitted on each 2-node log over the DGX fit: same bounds; the nominal-NIC prediction has every size."""
    result = fit_nccl(read_nccl_log(str(log)), read_base(str(base_fit)), algos=(algo,) if algo else None)
    s = summary(result.rows)
    assert s["all_worst_from_64MiB_pct"] <= 5 and s["all_worst_from_64KiB_pct"] <= 15
    assert result.prediction is not None and len(result.prediction["rows"]) == len(result.rows)
    assert "SW(2,46.5661,2700,nccl)" in result.prediction["topology"]


@pytest.mark.parametrize(
    "log,extra", [(DGX, []), (TWO_NODE_RING, ["--nccl-algo", "Ring"])], ids=["1node", "2node"]
)
def test_the_model_command_calibrate_describes_reproduces_every_row(tmp_path, capsys, base_fit, log, extra):
    """Model -t TOPOLOGY -c CHUNKS ARGS -b S -o OP -d float32 -p baseline gives calibrate's time at every size."""
    out = tmp_path / "fit.json"
    base = ["--base", str(base_fit)] if log != DGX else []
    assert main(["calibrate", str(log), *base, *extra, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc) >= {"topology", "chunks", "args", "rows"}
    capsys.readouterr()
    for row in doc["rows"]:
        args = ["model", "-t", doc["topology"], "-c", str(doc["chunks"]), *doc["args"]]
        args += ["-b", str(row["size_bytes"]), "-o", doc["op"], "-d", "float32", "-p", "baseline"]
        assert main([*args, "--json", str(tmp_path / "m.json")]) == 0
        (model,) = json.loads((tmp_path / "m.json").read_text())
        assert model["time_us"] == pytest.approx(row["model_us"], rel=1e-9), row["size_bytes"]
    capsys.readouterr()


def test_a_multi_node_log_needs_a_whole_number_of_base_nodes(tmp_path, capsys):
    """--base with 8 NPUs per node on a 12-NPU log is refused with one line."""
    assert main(["calibrate", str(TWO_NODE), "--npus", "12", "--base", "SW(8,400,600,nccl)"]) == 2
    assert "multiple" in error_line(capsys)
    assert math.isfinite(PARAMS.nvls_base_ns)


def test_the_fit_solves_its_normal_equations_without_lapack():
    """The fit's own elimination solves a x = b as LAPACK does, and reports a singular a as None."""
    from themis_mpi.calibrate.optimise import _solve

    rng = np.random.default_rng(7)
    a = rng.normal(size=(9, 9)) + 9 * np.eye(9)
    b = rng.normal(size=9)
    assert np.allclose(_solve(a, b), np.linalg.solve(a, b), rtol=1e-12, atol=1e-12)
    assert _solve(np.ones((3, 3)), np.ones(3)) is None
