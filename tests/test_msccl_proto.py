"""A custom algorithm's reductions under the endpoint model and its protocol on nccl dims (issue 44).

Under the endpoint model (``--hbm-gbps``) a reducing step pays what the endpoint model adds to a built-in reduce-scatter step of the same
bytes beyond its transfer (`msccl.timing.reduction_ns`); copies pay nothing, so an all-reduce's
copying half matches the built-in's only while its memory traffic hides under the transfer
(``COPY_MEM * b / M <= b / B``), which these tests assert of the H they take.

On nccl dims the file's ``proto`` prices its steps as the NCCL-like model prices one step of its
ring (`nccl.custom_topology`); these tests time the file with `themis-mpi model`.
"""

import dataclasses
import json

import pytest
from harness import DATA, cli_jobs, in_process

from themis_mpi import nccl
from themis_mpi.cost import COPY_MEM, REDUCE_MEM
from themis_mpi.errors import UsageError
from themis_mpi.msccl.build import builtin
from themis_mpi.msccl.ir import write_algorithm
from themis_mpi.topology import PROTOCOLS, parse_topology
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


@pytest.mark.parametrize("dims", ["one", "two", "nccl"])
def test_the_emulator_takes_the_models_time_under_the_endpoint_model(dims, tmp_path):
    """On 8 ranks: #wrong 0 and the model's time (--hbm-gbps: every NPU's file, a dim's; nccl dims)."""
    extra = hbm(300)
    if dims == "one":
        topo, algo = f"SW(8,{B_GBPS},500)", f"msccl:{exported(tmp_path, 'all_reduce', 8)}"
    elif dims == "two":
        topo = f"SW(4,{B_GBPS},500)_SW(2,{B_GBPS},500)"
        algo = f"msccl:{exported(tmp_path, 'reduce_scatter', 4)}+{exported(tmp_path, 'all_gather', 4)},ring"
    else:
        topo, algo, extra = (
            "SW(8,100,500,nccl)_NCCL(ll=6600:0.45,simple=8400:0.95)",
            f"msccl:{exported(tmp_path, 'all_reduce', 8)}",
            [],
        )
    out = tmp_path / "run.json"
    args = ["run", "-t", topo, "-b", "96K", "-c", "2", "-p", "baseline", "--network", "ideal"]
    proc = cli_jobs({0: (8, [*args, "--algorithm", algo, *extra, "--json", str(out)])}, tmp_path)[0]
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = json.loads(out.read_text())
    model = in_process(["model", *args[1:], "--algorithm", algo, *extra, "--json", str(tmp_path / "m.json")])
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


def protocol_us(tmp_path, topology: str, proto: str, size_bytes: int) -> float:
    """The exported ring all-reduce with `proto`, as `themis-mpi model` times it on the topology."""
    path = tmp_path / f"ring_{proto}.xml"
    npus = parse_topology(topology).npus
    write_algorithm(str(path), dataclasses.replace(builtin("ring", "all_reduce", npus), proto=proto))
    out = tmp_path / "rows.json"
    args = ["model", "-t", topology, "-b", str(size_bytes), "-c", "1", "-p", "baseline"]
    proc = in_process([*args, "--algorithm", f"msccl:{path}", "--json", str(out)])
    if proc.returncode == 2:
        raise UsageError(proc.stderr.removeprefix("themis-mpi: error: ").strip())
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(out.read_text())
    return row["time_us"]


@pytest.mark.parametrize("proto", PROTOCOLS)
def test_the_exported_ring_takes_the_nccl_rings_time_for_its_protocol(proto, tmp_path):
    """SW(8) nccl, 64 MiB (all channels busy): the NCCL-like model's ring of that protocol, to 1e-9."""
    spec = "SW(8,100,500,nccl)_NCCL(ll=6600:0.45,ll128=14000:0.9,simple=8400:0.95)"
    topo = parse_topology(spec)
    found = nccl.pairs(topo.nccl, nccl.levels(topo, [0]), nccl.ALL_REDUCE, [SIZE])
    (ring,) = [p for p in found if (p.algorithm, p.protocol) == ("Ring", proto)]
    assert protocol_us(tmp_path, spec, proto, SIZE) == pytest.approx(ring.times_ns[0] / 1e3, rel=1e-9)


def test_ll_is_slower_per_byte_than_simple_by_the_models_factor(tmp_path):
    """Per byte (the time of 2 S less that of S), LL over Simple is eff_Simple / eff_LL of the topology."""
    spec = "FC(4,100,500,nccl)_SW(2,50,2000,nccl)_NCCL(ll=6600:0.4,simple=8400:0.9)"
    per_byte = {
        p: protocol_us(tmp_path, spec, p, 2 * SIZE) - protocol_us(tmp_path, spec, p, SIZE)
        for p in ("LL", "Simple")
    }
    eff = parse_topology(spec).nccl.efficiency
    assert per_byte["LL"] / per_byte["Simple"] == pytest.approx(eff[2] / eff[0], rel=1e-9)


def test_a_protocol_the_topology_has_not_is_one_line(tmp_path):
    """A file of LL128 on nccl dims without LL128 (RCCL's gfx94x): one line naming both."""
    with pytest.raises(UsageError) as refused:
        protocol_us(tmp_path, "SW(8,100,500,nccl)_NCCL(protos=ll+simple)", "LL128", SIZE)
    assert str(refused.value) == "protocol LL128 is not one of the topology's NCCL protocols (LL+Simple)"


def test_a_custom_file_on_nccl_dims_is_printed_as_a_topology_that_reads_back(tmp_path):
    """The header's topology (the file in the dim's field, beside NCCL(...)) parses back equal, same time."""
    spec = "SW(8,100,500,nccl)_NCCL(ll=6600:0.45,simple=8400:0.95)"
    path = tmp_path / "ring.xml"
    write_algorithm(str(path), builtin("ring", "all_reduce", 8))
    topo = parse_topology(spec).with_overrides(algorithms=[f"msccl:{path}"])
    assert topo.flat and parse_topology(topo.spec()) == topo
    times = []
    for args in (["-t", spec, "--algorithm", f"msccl:{path}"], ["-t", topo.spec()]):
        out = tmp_path / "rows.json"
        proc = in_process(["model", *args, "-b", "64M", "-c", "1", "-p", "baseline", "--json", str(out)])
        assert proc.returncode == 0, proc.stderr
        times.append(json.loads(out.read_text())[0]["time_us"])
    assert times[0] == times[1]
