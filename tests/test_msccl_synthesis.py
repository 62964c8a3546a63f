"""The TACOS-like synthesizer (themis_mpi.msccl.synthesis): its targets, its proofs, its bound.

TACOS's own times are in the reference page of ../shared/custom-algos; the two tori and their
figures are restated here from that page (a target, not this code's output).
"""

import pytest
from harness import shared

import themis_mpi
from themis_mpi.cli.app import main
from themis_mpi.msccl.check import check
from themis_mpi.msccl.execute import prove
from themis_mpi.msccl.ir import read_algorithm
from themis_mpi.msccl.program import programs
from themis_mpi.msccl.synthesis import synthesize_all_gather, to_algorithm
from themis_mpi.msccl.timing import AlphaBeta, time_programs
from themis_mpi.results import ideal_time_us
from themis_mpi.topology import parse_topology

TORUS_2D = "Ring(4,100,500)_Ring(4,100,500)"
TORUS_3D = "Ring(4,100,500)_Ring(4,100,500)_Ring(4,100,500)"
TACOS_US = {(TORUS_2D, 1): 393.12, (TORUS_2D, 4): 320.50, (TORUS_3D, 1): 220.34}  # TACOS's runs
SIZE = 64 * 2**20


def written_time_us(algo, topo, chunk_bytes) -> float:
    return time_programs(programs(algo), chunk_bytes, AlphaBeta(topo)).end_ns / 1e3


def test_the_targets_are_tacos_own_page():
    """The figures above are the ones TACOS's reference page in ../shared/custom-algos holds."""
    pages = [p.read_text() for p in shared("custom-algos").iterdir() if p.suffix == ".md"]
    assert all(any(f"{us:.2f} us" in page for page in pages) for us in TACOS_US.values())


@pytest.mark.parametrize(("spec", "chunks"), list(TACOS_US))
def test_all_gather_reaches_tacos_on_the_tori(spec, chunks, tmp_path):
    """`synthesize all_gather`: the written file, read back and timed, is within 5 % of TACOS or faster."""
    path = tmp_path / "ag.xml"
    args = ["synthesize", "all_gather", "-t", spec, "-b", str(SIZE), "--chunks-per-npu", str(chunks)]
    assert main([*args, "--out", str(path)]) == 0
    topo = parse_topology(spec)
    algo = read_algorithm(str(path))
    t_us = written_time_us(algo, topo, SIZE / algo.nchunksperloop)
    assert t_us <= 1.05 * TACOS_US[(spec, chunks)]
    assert t_us >= ideal_time_us("all_gather", SIZE, topo, range(len(topo.dims)))  # nothing beats physics


@pytest.mark.parametrize("spec", [TORUS_2D, TORUS_3D])
def test_the_file_keeps_the_synthesized_schedule(spec):
    """On point-to-point links the written file's time is the synthesizer's own, to the ns."""
    topo = parse_topology(spec)
    synth = synthesize_all_gather(topo, SIZE)
    assert written_time_us(to_algorithm(synth), topo, synth.chunk_bytes) == pytest.approx(synth.time_ns / 1e3)


@pytest.mark.parametrize(("spec", "npus"), [(TORUS_2D, 16), (TORUS_3D, 64)])
def test_the_synthesized_all_gather_is_proved(spec, npus):
    """The all-gather files on 16 and 64 NPUs check clean and compute an all-gather, for any size."""
    algo = to_algorithm(synthesize_all_gather(parse_topology(spec), SIZE))
    assert algo.ngpus == npus and algo.coll == "allgather"
    assert check(algo) == [] and prove(algo, programs(algo)).ok


@pytest.mark.parametrize("op", ["reduce_scatter", "all_reduce"])
def test_reversal_and_composition_are_proved_and_keep_the_time(op):
    """The reduce-scatter (reversed) and all-reduce (both) compute theirs in 1x and 2x the all-gather's time."""
    topo = parse_topology(TORUS_2D)
    synth = synthesize_all_gather(topo, SIZE)
    algo = to_algorithm(synth, op)
    assert check(algo) == [] and prove(algo, programs(algo)).ok
    factor = 2 if op == "all_reduce" else 1
    assert written_time_us(algo, topo, synth.chunk_bytes) == pytest.approx(factor * synth.time_ns / 1e3)


@pytest.mark.parametrize(
    "spec", ["SW(8,100,700)", "FC(4,100,500)_SW(4,50,1000)", "Ring(2,100,20)_Ring(3,50,700)"]
)
def test_other_topologies_are_proved_and_bounded(spec):
    """Switch, FullyConnected and mixed dims: proved, and no faster than the bandwidth bound."""
    topo = parse_topology(spec)
    synth = synthesize_all_gather(topo, 2**20)
    algo = to_algorithm(synth)
    assert check(algo) == [] and prove(algo, programs(algo)).ok
    t_us = written_time_us(algo, topo, synth.chunk_bytes)
    assert t_us >= ideal_time_us("all_gather", 2**20, topo, range(len(topo.dims)))
    assert t_us == pytest.approx(synth.time_ns / 1e3)  # the all-gather keeps its plan on a Switch too


def test_faster_than_the_hierarchical_all_gather_on_the_2d_torus():
    """The synthesized all-gather beats the model's hierarchical baseline at any of its chunk counts."""
    topo = parse_topology(TORUS_2D)
    synth = synthesize_all_gather(topo, SIZE)
    rows = themis_mpi.sweep(TORUS_2D, size=SIZE, policy="baseline", chunks=[1, 4, 16, 64], op="all_gather")
    assert written_time_us(to_algorithm(synth), topo, synth.chunk_bytes) < min(r.time_us for r in rows)
