"""A custom algorithm's reductions under the endpoint model (``--hbm-gbps``, issue 44).

A reducing step pays what the endpoint model adds to a built-in reduce-scatter step of the same
bytes beyond its transfer (`msccl.timing.reduction_ns`); copies pay nothing, so an all-reduce's
copying half matches the built-in's only while its memory traffic hides under the transfer
(``COPY_MEM * b / M <= b / B``), which these tests assert of the H they take.
"""

import json

import pytest
from harness import DATA, cli, in_process

from themis_mpi.cost import COPY_MEM, REDUCE_MEM
from themis_mpi.msccl.build import builtin
from themis_mpi.msccl.ir import write_algorithm
from themis_mpi.units import BYTES_PER_GB

FIXTURES = DATA / "msccl"
B_GBPS, SIZE = 100, 64 * 2**20


def model_us(tmp_path, topology, op, algorithm, *extra, chunks=1) -> float:
    """`themis-mpi model` of one collective (baseline, ideal: the endpoint model's rule): its one row's time."""
    out = tmp_path / "rows.json"
    args = ["model", "-t", topology, "-o", op, "-b", str(SIZE), "-c", str(chunks), "-p", "baseline"]
    proc = in_process([*args, "--network", "ideal", "--algorithm", algorithm, "--json", str(out), *extra])
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(out.read_text())
    return row["time_us"]


def exported(tmp_path, op: str, npus: int) -> str:
    """The built-in ring of `op` on `npus` GPUs as an MSCCL-IR file (`msccl.build.builtin`)."""
    path = tmp_path / f"ring_{op}_{npus}.xml"
    write_algorithm(str(path), builtin("ring", op, npus))
    return str(path)


def hbm(gbps: float) -> list[str]:
    """The endpoint model on, with this HBM bandwidth."""
    return ["--hbm-gbps", str(gbps)]


@pytest.mark.parametrize(("op", "hbm_gbps"), [("reduce_scatter", 150), ("all_reduce", 300)])
def test_the_exported_ring_takes_the_built_in_rings_time_on_a_switch(op, hbm_gbps, tmp_path):
    """SW(8), one dim (M = H): equal to 1e-9, and the reductions bind (the time grows).

    A reduce-scatter has no copies, so any H; the all-reduce's copies hide at H = 3 B.
    """
    assert op == "reduce_scatter" or COPY_MEM / hbm_gbps <= 1 / B_GBPS < REDUCE_MEM / hbm_gbps
    topo, mine = f"SW(8,{B_GBPS},500)", f"msccl:{exported(tmp_path, op, 8)}"
    ring = model_us(tmp_path, topo, op, "ring", *hbm(hbm_gbps))
    assert model_us(tmp_path, topo, op, mine, *hbm(hbm_gbps)) == pytest.approx(ring, rel=1e-9)
    assert ring > model_us(tmp_path, topo, op, "ring") * 1.2


def test_the_exported_ring_pays_the_built_in_rings_reductions_on_a_ring(tmp_path):
    """Ring(8): the file uses one direction (its own time), but the endpoint model adds what it adds to the built-in."""
    topo, mine = f"Ring(8,{B_GBPS},500)", f"msccl:{exported(tmp_path, 'all_reduce', 8)}"
    grown = [model_us(tmp_path, topo, "all_reduce", a, *hbm(300)) - model_us(tmp_path, topo, "all_reduce", a)
             for a in (mine, "ring")]  # fmt: skip
    assert grown[0] == pytest.approx(grown[1], rel=1e-9) and grown[1] > 0


def test_a_dims_files_pay_the_built_in_rings_reductions(tmp_path):
    """SW(4)_SW(2), dim 0 by exported RS + AG files: the built-in ring's time; M_0 = H B_0 / sum B = H / 2."""
    files = f"msccl:{exported(tmp_path, 'reduce_scatter', 4)}+{exported(tmp_path, 'all_gather', 4)},ring"
    topo, hbm_gbps = f"SW(4,{B_GBPS},500)_SW(2,{B_GBPS},500)", 600
    assert COPY_MEM / (hbm_gbps / 2) <= 1 / B_GBPS < REDUCE_MEM / (hbm_gbps / 2)
    ring = model_us(tmp_path, topo, "all_reduce", "ring,ring", *hbm(hbm_gbps), chunks=4)
    assert model_us(tmp_path, topo, "all_reduce", files, *hbm(hbm_gbps), chunks=4) == pytest.approx(
        ring, rel=1e-9
    )
    assert ring > model_us(tmp_path, topo, "all_reduce", "ring,ring", chunks=4)


def test_a_reduce_scatters_time_grows_by_its_reductions_in_closed_form(tmp_path):
    """The rrs ring on FC(4), one chunk: three reductions in a chain, each ``5 b / M - 3 b / B``."""
    topo, algo = f"FC(4,{B_GBPS},500)", f"msccl:{FIXTURES / 'ring_reducescatter_rrs_4.xml'}"
    hbm_gbps, b = 100, SIZE / 4  # the file's 4 chunks; a message crosses one link of B / 3
    transfer_ns = b * 3 / (B_GBPS * BYTES_PER_GB / 1e9)
    memory_ns = REDUCE_MEM * b / (hbm_gbps * BYTES_PER_GB / 1e9)
    grown_us = model_us(tmp_path, topo, "reduce_scatter", algo, *hbm(hbm_gbps)) - model_us(
        tmp_path, topo, "reduce_scatter", algo
    )
    assert grown_us == pytest.approx(3 * (memory_ns - transfer_ns) / 1e3, rel=1e-9)


def test_the_emulator_takes_the_models_time_under_the_endpoint_model(tmp_path):
    """Under mpiexec -n 8 with --hbm-gbps: #wrong 0, the model's time to the ns."""
    topo, algo = f"SW(8,{B_GBPS},500)", f"msccl:{exported(tmp_path, 'all_reduce', 8)}"
    out = tmp_path / "run.json"
    args = ["run", "-t", topo, "-b", "96K", "-c", "2", "-p", "baseline", "--network", "ideal"]
    proc = cli(8, [*args, "--algorithm", algo, *hbm(300), "--json", str(out)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = json.loads(out.read_text())
    model = in_process(
        ["model", *args[1:], "--algorithm", algo, *hbm(300), "--json", str(tmp_path / "m.json")]
    )
    assert model.returncode == 0, model.stderr
    assert row["wrong"] == 0 and row["time_us"] == json.loads((tmp_path / "m.json").read_text())[0]["time_us"]


@pytest.mark.parametrize(
    ("topology", "extra", "fragment"),
    [
        ("SW(4,100,500)_SW(2,100,500)", [], "runs on one dim"),
        ("SW(8,100,500)", ["--ace"], "do not take --ace"),
    ],
    ids=["two-dims", "ace"],
)
def test_what_the_endpoint_model_cannot_price_is_one_line(topology, extra, fragment, tmp_path):
    """A whole-collective file over two dims, or ACE: one line, exit 2."""
    args = [
        "model",
        "-t",
        topology,
        "-b",
        "64K",
        "--algorithm",
        f"msccl:{exported(tmp_path, 'all_reduce', 8)}",
    ]
    proc = in_process([*args, *hbm(300), *extra])
    assert proc.returncode == 2 and fragment in proc.stderr and proc.stderr.count("\n") == 1
