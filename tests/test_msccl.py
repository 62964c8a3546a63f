"""MSCCL-IR: the reader, the checker, the proofs and the standalone timing (themis_mpi.msccl).

The four files of other people are read from ../shared/custom-algos (`harness.shared`); their
damaged copies are made here at run time. The fixtures in tests/data/msccl are the project's own.
"""

import dataclasses
import re
import subprocess
import sys

import pytest
from harness import DATA, ROOT, in_process, shared
from hypothesis import given
from hypothesis import strategies as hs

from themis_mpi.cli.app import main
from themis_mpi.cost import AR, CostModel, ring_both_ways
from themis_mpi.errors import UsageError
from themis_mpi.msccl.build import Builder, builtin
from themis_mpi.msccl.check import check, require
from themis_mpi.msccl.execute import prove
from themis_mpi.msccl.ir import (
    Algorithm,
    Step,
    parse_algorithm,
    read_algorithm,
    to_xml,
    write_algorithm,
)
from themis_mpi.msccl.program import Ref, programs
from themis_mpi.msccl.timing import AlphaBeta, time_programs
from themis_mpi.topology import parse_topology

SHARED_FILES = (
    "allgather_hierarchical_8gpu_collectiveapi.xml",
    "allreduce_1step_allpairs_4gpu_rccl.xml",
    "allreduce_ring_8gpu_astrasim_example.xml",
    "alltoall_8gpu_mi300_small_rccl.xml",
)
FIXTURES = DATA / "msccl"
PLACE = re.compile(r"GPU (\d+) threadblock (\d+) step (\d+)")


def shared_algo(name: str) -> Algorithm:
    return read_algorithm(str(shared("custom-algos") / name))


def replace_step(algo: Algorithm, g: int, t: int, k: int | None, step: Step | None) -> Algorithm:
    """A copy with step k of GPU g's threadblock t replaced (None: removed; k None: `step` appended)."""
    gpu = algo.gpus[g]
    tb = gpu.threadblocks[t]
    steps = list(tb.steps)
    if k is None:
        steps.append(step)
    elif step is None:
        del steps[k]
    else:
        steps[k] = step
    tbs = list(gpu.threadblocks)
    tbs[t] = dataclasses.replace(tb, steps=tuple(steps))
    gpus = list(algo.gpus)
    gpus[g] = dataclasses.replace(gpu, threadblocks=tuple(tbs))
    return dataclasses.replace(algo, gpus=tuple(gpus))


def refusal(algo: Algorithm, tmp_path) -> str:
    """The one line the damaged copy, written and read back, is refused with (by `model` too)."""
    path = tmp_path / "damaged.xml"
    write_algorithm(str(path), algo)
    with pytest.raises(UsageError) as info:
        require(read_algorithm(str(path)), str(path))
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(path))
    # the same line, exit 2, where a run takes the file: model --algorithm msccl:FILE
    model = ["model", "-t", f"SW({algo.ngpus},100,500)", "-o", algo.collective.op, "-b", "64K"]
    proc = in_process([*model, "--algorithm", f"msccl:{path}"])
    assert proc.returncode == 2 and proc.stderr == f"themis-mpi: error: {message}\n"
    return message


@pytest.mark.parametrize("name", SHARED_FILES)
def test_shared_files_read_check_and_prove(name):
    """Each shared file checks clean and computes its collective, symbolically and on data."""
    algo = shared_algo(name)
    assert check(algo) == []
    proof = prove(algo, programs(algo))
    assert proof.ok and proof.data and all(d.elements > 0 and d.wrong == 0 for d in proof.data)


@pytest.mark.parametrize("name", SHARED_FILES)
def test_shared_files_survive_writing_and_reading(name):
    """Written back out as MSCCL-IR and read again, a file is the same algorithm."""
    algo = shared_algo(name)
    assert parse_algorithm(to_xml(algo)) == algo


def test_the_ring_file_takes_the_ring_closed_form():
    """msccl-tools' ring all-reduce: 2(P-1) messages of a chunk back to back.

    On Ring(8) it uses one direction, B/2 per message; through a Switch two hops at B.
    """
    progs = require(shared_algo(SHARED_FILES[2]), "ring")
    chunk = 2**20
    for spec, hops, rate_gbps in (("Ring(8,100,500)", 1, 50), ("SW(8,100,500)", 2, 100)):
        t = time_programs(progs, chunk, AlphaBeta(parse_topology(spec))).end_ns
        assert t == pytest.approx(14 * (hops * 500 + chunk / (rate_gbps * 2**30 / 1e9)))


def remove_step(algo: Algorithm, g: int, t: int, k: int) -> Algorithm:
    """A copy without step k of GPU g's threadblock t: later steps renumbered, waits on them moved along."""
    algo = replace_step(algo, g, t, k, None)
    for u, tb in enumerate(algo.gpus[g].threadblocks):
        for j, st in enumerate(tb.steps):
            moved = dataclasses.replace(
                st, s=j, deps=st.deps - 1 if st.depid == t and st.deps > k else st.deps
            )
            algo = replace_step(algo, g, u, j, moved)
    return algo


def last_on_connection(algo: Algorithm, g: int, t: int, sending: bool) -> tuple[int, int, int]:
    """The peer's last receive (of a send of GPU g's threadblock t) or last send (of a receive)."""
    tb = algo.gpus[g].threadblocks[t]
    peer = tb.send if sending else tb.recv
    other = next(
        u for u in algo.gpus[peer].threadblocks if (u.recv if sending else u.send) == g and u.chan == tb.chan
    )
    steps = [j for j, st in enumerate(other.steps) if (st.receives if sending else st.sends)]
    return peer, other.id, steps[-1]


@pytest.mark.parametrize("name", SHARED_FILES)
def test_a_removed_step_is_named(name, tmp_path):
    """One send or receive of GPU 0 removed: the peer's step left without a partner is named."""
    algo = shared_algo(name)
    t, k, st = next((t, k, st) for t, tb in reversed(list(enumerate(algo.gpus[0].threadblocks)))
                    for k, st in enumerate(tb.steps) if st.type in ("s", "r") and not st.hasdep)  # fmt: skip
    message = refusal(remove_step(algo, 0, t, k), tmp_path)
    assert ("has no matching send" if st.sends else "has no matching receive") in message
    assert tuple(map(int, PLACE.search(message).groups())) == last_on_connection(algo, 0, t, st.sends)


def test_a_removed_step_in_the_middle_breaks_the_numbering(tmp_path):
    """A step cut out of the middle leaves the next one numbered out of place: it is named."""
    algo = shared_algo(SHARED_FILES[2])
    message = refusal(replace_step(algo, 3, 0, 5, None), tmp_path)
    assert "GPU 3 threadblock 0 step 5: is numbered s=6 at position 5" in message


@pytest.mark.parametrize("name", SHARED_FILES)
def test_an_offset_out_of_the_buffer_is_named(name, tmp_path):
    """A step whose chunks reach past its buffer's declared end is refused by name."""
    algo = shared_algo(name)
    gpu = algo.gpus[1]
    t, k, st = next((t, k, st) for t, tb in enumerate(gpu.threadblocks) for k, st in enumerate(tb.steps)
                    if st.type in ("s", "cpy", "re", "rrc"))  # fmt: skip
    moved = dataclasses.replace(st, srcoff=gpu.chunks(st.srcbuf) - st.cnt + 1)
    message = refusal(replace_step(algo, 1, t, k, moved), tmp_path)
    assert f"GPU 1 threadblock {t} step {k}: srcoff" in message and "is outside the" in message


def with_dependency(algo: Algorithm, g: int, t: int, k: int, u: int, s: int) -> Algorithm:
    """Step (t, k) of GPU g made to wait for step s of threadblock u, which is made to signal."""
    st = algo.gpus[g].threadblocks[t].steps[k]
    algo = replace_step(algo, g, t, k, dataclasses.replace(st, depid=u, deps=s))
    target = algo.gpus[g].threadblocks[u].steps[s]
    return replace_step(algo, g, u, s, dataclasses.replace(target, hasdep=True))


@pytest.mark.parametrize("name", SHARED_FILES)
def test_a_dependency_cycle_is_named(name, tmp_path):
    """Two threadblocks whose first steps wait for each other's last: the cycle is named by its steps.

    A GPU with one threadblock gets a step that waits for a later step of its own threadblock.
    """
    algo = shared_algo(name)
    tbs = [tb for tb in algo.gpus[0].threadblocks if tb.steps and tb.steps[0].type != "nop"]
    if len(tbs) == 1:
        message = refusal(with_dependency(algo, 0, tbs[0].id, 1, tbs[0].id, 3), tmp_path)
        assert "GPU 0 threadblock 0 step 1: waits for step 3 of its own threadblock" in message
        return
    a, b = tbs[0], tbs[1]
    damaged = with_dependency(algo, 0, a.id, 0, b.id, len(b.steps) - 1)
    damaged = with_dependency(damaged, 0, b.id, 0, a.id, len(a.steps) - 1)
    message = refusal(damaged, tmp_path)
    assert "dependency cycle" in message and PLACE.search(message).group(1) == "0"
    assert f"threadblock {a.id} step 0" in message and f"threadblock {b.id} step 0" in message


@pytest.mark.parametrize("name", SHARED_FILES)
def test_a_send_without_a_receive_is_named(name, tmp_path):
    """One more send at the end of a threadblock: that send is refused by name."""
    algo = shared_algo(name)
    tb = next(tb for tb in algo.gpus[2].threadblocks if tb.send >= 0)
    first = next(st for st in tb.steps if st.sends)
    extra = dataclasses.replace(first, s=len(tb.steps), depid=-1, deps=-1, hasdep=False)
    message = refusal(replace_step(algo, 2, tb.id, None, extra), tmp_path)
    assert f"GPU 2 threadblock {tb.id} step {len(tb.steps)}: send to GPU {tb.send}" in message
    assert "has no matching receive" in message


@pytest.mark.parametrize(
    ("name", "reduce", "copy"), [(SHARED_FILES[1], "re", "cpy"), (SHARED_FILES[2], "rrc", "r")]
)
def test_a_reduce_made_a_copy_computes_the_wrong_result(name, reduce, copy, tmp_path):
    """Well formed, the copy passes the checker, but the proof and the data name a wrong output."""
    algo = shared_algo(name)
    t, k = next((t, k) for t, tb in enumerate(algo.gpus[0].threadblocks) for k, st in enumerate(tb.steps)
                if st.type == reduce)  # fmt: skip
    st = algo.gpus[0].threadblocks[t].steps[k]
    damaged = replace_step(algo, 0, t, k, dataclasses.replace(st, type=copy))
    path = tmp_path / "copy.xml"
    write_algorithm(str(path), damaged)
    damaged = read_algorithm(str(path))
    assert check(damaged) == []
    proof = prove(damaged, programs(damaged))
    assert not proof.ok and sum(d.wrong for d in proof.data) > 0
    assert re.match(r"GPU 0 output chunk \d+ holds .* but the allreduce puts", proof.first())
    model = ["model", "-t", f"SW({damaged.ngpus},100,500)", "-b", "64K", "--algorithm", f"msccl:{path}"]
    assert main(model) == 2


def test_receives_first_on_every_gpu_deadlock_and_the_cycle_is_named(tmp_path):
    """The ring with each GPU's first send and receive swapped waits forever; the cycle is named."""
    algo = shared_algo(SHARED_FILES[2])
    for g in range(algo.ngpus):
        s0, s1 = algo.gpus[g].threadblocks[0].steps[:2]
        algo = replace_step(algo, g, 0, 0, dataclasses.replace(s1, s=0))
        algo = replace_step(algo, g, 0, 1, dataclasses.replace(s0, s=1))
    message = refusal(algo, tmp_path)
    assert "GPU 0 threadblock 0 step 0: waits forever (8 threadblocks stuck)" in message
    assert message.count("->") == 8


def test_a_missing_wait_is_a_race(tmp_path):
    """The all-pairs file's reductions on GPU 0 without their waits race with the receives."""
    algo = shared_algo(SHARED_FILES[1])
    for k, st in enumerate(algo.gpus[0].threadblocks[0].steps):
        algo = replace_step(algo, 0, 0, k, dataclasses.replace(st, depid=-1, deps=-1))
    message = refusal(algo, tmp_path)
    assert re.search(
        r"GPU 0 threadblock \d step \d: (reads|writes) .*, which threadblock \d step \d also", message
    )
    assert "no wait between them (a race, in place)" in message


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('<!DOCTYPE algo [<!ENTITY a "aaaa">]><algo/>', "DTD or entity declaration"),
        ("<algo", "not well-formed XML"),
        ('<algo name="x"><op/></algo>', "unexpected element <op>"),
        ('<algo coll="allreduce" ngpus="x"/>', "ngpus='x' is not an integer"),
        ('<algo coll="allsum"/>', "coll='allsum' is not one of"),
        ('<algo coll="allreduce" ngpus="2" nchunksperloop="2" nchannels="1" proto="LL" inplace="1">'
         '<gpu id="0" i_chunks="2" o_chunks="0" s_chunks="0"><tb id="0" send="1" recv="-1" chan="0">'
         '<step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1"/></tb></gpu></algo>',
         "GPU 1 is missing"),
    ],
)  # fmt: skip
def test_bad_files_get_one_line(text, fragment):
    """Malformed, hostile or incomplete text is refused with one line, before anything runs."""
    with pytest.raises(UsageError) as info:
        require(parse_algorithm(text, "bad.xml"), "bad.xml")
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_a_file_too_large_is_refused_unread(tmp_path, monkeypatch):
    """The reader refuses a file over its bound by its size, before parsing."""
    import themis_mpi.msccl.ir as ir

    path = tmp_path / "big.xml"
    path.write_text("<algo>" + " " * 2000 + "</algo>")
    monkeypatch.setattr(ir, "MAX_FILE_BYTES", 1000)
    with pytest.raises(UsageError, match="larger than"):
        ir.read_algorithm(str(path))


def test_the_cli_refuses_a_damaged_file_with_exit_2(tmp_path):
    """`themis-mpi model --algorithm msccl:FILE` on a damaged file: one line naming the step, exit 2."""
    algo = shared_algo(SHARED_FILES[2])
    st = algo.gpus[4].threadblocks[0].steps[7]
    path = tmp_path / "bad.xml"
    write_algorithm(str(path), replace_step(algo, 4, 0, 7, dataclasses.replace(st, dstoff=9)))
    proc = subprocess.run([sys.executable, "-m", "themis_mpi", "model", "-t", "SW(8,100,500)", "-b", "64K",
                           "--algorithm", f"msccl:{path}"], capture_output=True, text=True, cwd=ROOT,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert (
        "GPU 4 threadblock 0 step 7: dstoff 9 + cnt 1 is outside the input buffer of 8 chunks" in proc.stderr
    )


FIXTURE_NAMES = sorted(p.name for p in FIXTURES.glob("*.xml"))


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_fixtures_check_and_prove(name):
    """Each fixture written for the project computes its collective."""
    algo = read_algorithm(str(FIXTURES / name))
    assert check(algo) == [] and prove(algo, programs(algo)).ok


def test_fixtures_hold_every_fused_step_type_and_are_what_the_script_writes(tmp_path):
    """Between them the fixtures use rcs, rrs, rrcs, cpy, re and nop; they are the script's output."""
    types = {st.type for name in FIXTURE_NAMES for g in read_algorithm(str(FIXTURES / name)).gpus
             for tb in g.threadblocks for st in tb.steps}  # fmt: skip
    assert {"rcs", "rrs", "rrcs", "cpy", "re", "nop"} <= types
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "msccl_fixtures.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.glob("*.xml")) == FIXTURE_NAMES
    assert all((tmp_path / n).read_text() == (FIXTURES / n).read_text() for n in FIXTURE_NAMES)


def test_the_two_channel_ring_uses_both_directions():
    """The worked example on Ring(8) takes the built-in ring's time; one ring alone twice its bandwidth term."""
    topo = parse_topology("Ring(8,100,500)")
    size = 8 * 2**20
    two = read_algorithm(str(FIXTURES / "ring_2ch_allreduce_8.xml"))
    one = builtin("ring", "all_reduce", 8)
    t_two = time_programs(programs(two), size / two.nchunksperloop, AlphaBeta(topo)).end_ns
    t_one = time_programs(programs(one), size / one.nchunksperloop, AlphaBeta(topo)).end_ns
    cost = CostModel(topo, 8)
    builtin_ns = sum(cost.step_times_ns(0, AR, size // 8))
    latency_ns = 14 * 500
    assert t_two == pytest.approx(builtin_ns)
    assert t_one - latency_ns == pytest.approx(2 * (builtin_ns - latency_ns))
    both = builtin("ring", "all_reduce", 8, both_ways=True)  # the built-in ring written both ways round
    assert both.nchannels == 2
    assert time_programs(programs(both), size / both.nchunksperloop, AlphaBeta(topo)).end_ns == pytest.approx(
        builtin_ns
    )


@pytest.mark.parametrize("op", ["reduce_scatter", "all_gather", "all_reduce"])
@pytest.mark.parametrize("npus", [2, 3, 4, 8])
def test_the_ring_both_ways_round_checks_and_is_proved(op, npus):
    """The built-in ring both ways round (two channels, 2P chunks) computes the collective."""
    algo = builtin("ring", op, npus, both_ways=True)
    assert algo.nchannels == 2 and algo.nchunksperloop == 2 * npus
    assert check(algo) == [] and prove(algo, programs(algo)).ok


@pytest.mark.parametrize("algorithm", ["ring", "direct", "halving_doubling"])
@pytest.mark.parametrize("op", ["reduce_scatter", "all_gather", "all_reduce"])
@pytest.mark.parametrize("npus", [2, 3, 4, 8])
def test_exported_builtins_read_back_check_and_prove(algorithm, op, npus, tmp_path):
    """`export --msccl` of each built-in algorithm: the file reads back, checks clean, and is proved."""
    if algorithm == "halving_doubling" and npus == 3:
        with pytest.raises(UsageError, match="power-of-two"):
            builtin(algorithm, op, npus)
        return
    path = tmp_path / "a.xml"
    assert (
        main(["export", "--msccl", str(path), "--algorithm", algorithm, "-o", op, "--npus", str(npus)]) == 0
    )
    algo = read_algorithm(str(path))
    assert algo == builtin(algorithm, op, npus) and algo.ngpus == npus
    assert check(algo) == [] and prove(algo, programs(algo)).ok


def test_export_both_ways_writes_the_two_channel_ring_and_only_for_the_ring(tmp_path, capsys):
    """`export --msccl --both-ways`: the ring of Ring and FullyConnected dims; another algorithm, one line."""
    path = tmp_path / "a.xml"
    assert main(["export", "--msccl", str(path), "--npus", "4", "--both-ways"]) == 0
    assert read_algorithm(str(path)) == builtin("ring", "all_reduce", 4, both_ways=True)
    bad = tmp_path / "b.xml"
    assert main(["export", "--msccl", str(bad), "--algorithm", "direct", "--both-ways"]) == 2
    assert "--both-ways is the ring's" in capsys.readouterr().err and not bad.exists()


@pytest.mark.parametrize(
    ("algorithm", "spec"),
    [("ring", "SW(8,100,700)"), ("ring", "FC(8,100,700)"), ("direct", "FC(8,100,700)"),
     ("halving_doubling", "SW(8,100,700)")],
)  # fmt: skip
@pytest.mark.parametrize("op", ["RS", "AG", "AR"])
def test_exported_builtins_take_the_cost_models_time(algorithm, spec, op):
    """Where a built-in stage's messages never share a link, the exported file takes `cost`'s stage time."""
    names = {"RS": "reduce_scatter", "AG": "all_gather", "AR": "all_reduce"}
    topo = parse_topology(spec).with_overrides(algorithms=[algorithm])
    size = 2**20
    algo = builtin(algorithm, names[op], 8, ring_both_ways(topo.dims[0]))  # (FC's ring: both ways round)
    t = time_programs(programs(algo), size / algo.nchunksperloop, AlphaBeta(topo)).end_ns
    assert t == pytest.approx(sum(CostModel(topo, 1).step_times_ns(0, op, size)))


ATTRIBUTE = re.compile(r'(\w+)="([^"]*)"')


@given(hs.data())
def test_mutated_files_are_refused_in_one_line_or_run(data):
    """Any attribute of a fixture set to a hostile value: one UsageError line, or a checked run.

    A file the checker passes is then proved and timed without any other exception.
    """
    text = (FIXTURES / data.draw(hs.sampled_from(FIXTURE_NAMES))).read_text()
    for _ in range(data.draw(hs.integers(1, 3))):
        spans = [m.span(2) for m in ATTRIBUTE.finditer(text)]
        a, b = data.draw(hs.sampled_from(spans))
        value = data.draw(
            hs.sampled_from(["-1", "0", "1", "3", "4", "17", "x", "", "nop", "re", "s", "i", "o"])
        )
        text = text[:a] + value + text[b:]
    try:
        algo = parse_algorithm(text, "mutated.xml")
        progs = require(algo, "mutated.xml")
    except UsageError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("mutated.xml")
        return
    prove(algo, progs)
    time_programs(progs, 1024.0, AlphaBeta(parse_topology(f"SW({max(2, algo.ngpus)},100,500)")))


@pytest.mark.parametrize("coll", ["broadcast", "reduce"])
def test_a_broadcast_and_a_reduce_are_proved_and_a_wrong_root_is_caught(coll):
    """A star from (or to) GPU 0 computes a broadcast (or reduce); rooted at GPU 1 it does not."""

    def star(root: int) -> Algorithm:
        b = Builder(f"star_{coll}", coll, 4, 2)
        for g in range(4):
            if g != root:
                tx, rx = (root, g) if coll == "broadcast" else (g, root)
                b.send(tx, b.threadblock(tx, rx, -1), Ref("i", 0, 2))
                b.recv(rx, b.threadblock(rx, -1, tx), Ref("i", 0, 2), reduce=coll == "reduce")
        return b.algorithm()

    good, bad = star(0), star(1)
    assert check(good) == [] and prove(good, programs(good)).ok
    assert check(bad) == [] and not prove(bad, programs(bad)).ok
