"""Rules for Chakra execution traces: the format, the graph replay, conversion, and MPI agreement."""

import gc
import gzip
import json
from dataclasses import replace

import pytest
from harness import DATA, ROOT, cli_jobs, in_process

from themis_mpi.collectives import Collective
from themis_mpi.config import RunConfig
from themis_mpi.cost import CostModel
from themis_mpi.errors import UsageError
from themis_mpi.model import ModelTransport
from themis_mpi.run.collective import model_collective
from themis_mpi.run.training import run_graph, run_training
from themis_mpi.topology import parse_topology
from themis_mpi.workloads import chakra, convert
from themis_mpi.workloads import et as et_format
from themis_mpi.workloads.chakra import Graph, group_dims, load_graph, plan_graph
from themis_mpi.workloads.et import (
    COMM_COLL_NODE,
    COMM_RECV_NODE,
    COMM_SEND_NODE,
    COMP_NODE,
    Attr,
    EtTrace,
    Node,
)
from themis_mpi.workloads.text import parse_workload
from themis_mpi.workloads.training import TrainingSpec

ET_DIR = DATA / "astra-sim-chakra-et" / "all_reduce"
ET_FILES = sorted(ET_DIR.glob("*/*.et"))
PYTORCH = DATA / "chakra-pytorch" / "chakra.0.et.gz"
TRACES = sorted((ROOT / "traces").glob("*.txt"))
TEXTS = sorted((DATA / "astra-sim-1.0-text").glob("*.txt"))
MIB = 1 << 20
T4 = "Ring(2,100,20)_SW(2,50,700)"  # 2x2
T16 = "SW(4,100,700)_FC(4,50,700)"  # 4x4
CONFIGS = {"baseline": RunConfig(intra="fifo"), "themis": RunConfig(intra="scf")}


def model_graph(graph, topology, policy, chunks=8, dtype="float32", network=""):
    """A graph on the model under one policy (intra as the CLI's auto; `network`: the default rule)."""
    topo = parse_topology(topology) if isinstance(topology, str) else topology
    config = replace(CONFIGS[policy], network=network) if network else CONFIGS[policy]
    return run_graph(ModelTransport(topo, config), graph, policy, TrainingSpec(chunks, dtype))


def comp(node_id, micros, deps=(), cpu=False, data=()):
    """A COMP node."""
    return Node(
        node_id,
        f"c{node_id}",
        COMP_NODE,
        list(deps),
        list(data),
        duration_micros=micros,
        attrs=[Attr("is_cpu_op", "bool", cpu)],
    )


def write(tmp_path, name, nodes, attrs=()):
    """Write one ET file of these nodes; returns its path as a string."""
    path = str(tmp_path / name)
    et_format.write_et(path, EtTrace(path, "0.0.4", list(attrs), nodes))
    return path


# --- the format ----------------------------------------------------------------------------------


def test_every_shipped_astra_sim_trace_is_read_and_written_back_byte_for_byte():
    """Reader then writer gives each of ASTRA-sim's 28 all-reduce microbenchmark files back unchanged."""
    assert len(ET_FILES) == 28
    for path in ET_FILES:
        trace = et_format.read_et(str(path))
        assert et_format.et_bytes(trace) == path.read_bytes(), path


def test_astra_sim_microbenchmark_nodes_are_one_all_reduce_of_1_mib():
    """Each rank's file holds one COMM_COLL node: comm_type ALL_REDUCE, comm_size 1 MiB, id = the rank."""
    for rank in range(8):
        trace = et_format.read_et(str(ET_DIR / "8npus_1MB" / f"all_reduce.{rank}.et"))
        (node,) = trace.nodes
        assert trace.version == "0.0.4" and node.id == rank and node.type == COMM_COLL_NODE
        assert (node.attr("comm_type"), node.attr("comm_size"), node.attr("is_cpu_op")) == (0, MIB, False)


def test_the_pytorch_trace_parses_to_its_node_and_collective_counts():
    """chakra.0.et (gzip-compressed here): 3,664 nodes, 3,643 COMP and 21 COMM_COLL, 7 with a comm_type."""
    trace = et_format.read_et(str(PYTORCH))
    assert len(trace.nodes) == 3664 and trace.counts() == {"COMP": 3643, "COMM_COLL": 21}
    typed = [n for n in trace.nodes if n.has_attr("comm_type")]
    assert (
        sorted(et_format.COMM_TYPES[n.attr("comm_type")] for n in typed)
        == ["ALL_REDUCE"] * 5 + ["BROADCAST"] * 2
    )
    assert all(n.attr("involved_dim") == [True] for n in typed)
    assert et_format.et_bytes(trace) == gzip.decompress(PYTORCH.read_bytes())


def test_unknown_fields_are_skipped():
    """A node with fields the schema does not know (numbers 11 and 12) reads as the same node."""
    node = Node(7, "x", COMP_NODE, [1], [2], duration_micros=3, attrs=[Attr("a", "int64", -5)])
    record = (
        et_format.encode_node(node) + bytes([11 << 3 | 0, 0x96, 0x01]) + bytes([12 << 3 | 2, 2, 0xFF, 0xFE])
    )
    meta = et_format.encode_metadata("1", [])
    data = bytes([len(meta)]) + meta + bytes([len(record)]) + record
    assert et_format.parse_et_bytes(data).nodes == [node]


@pytest.mark.parametrize(
    "attr",
    [
        Attr("i", "int64", -(1 << 40)),
        Attr("s32", "sint32", -7),
        Attr("u", "uint64", (1 << 64) - 1),
        Attr("d", "double", 0.1),
        Attr("f", "float", 0.5),
        Attr("b", "bool", True),
        Attr("t", "string", "héllo"),
        Attr("raw", "bytes", b"\x00\xff"),
        Attr("il", "int32", [-1, 0, 1 << 20], is_list=True),
        Attr("sl", "sfixed64", [-3, 4], is_list=True),
        Attr("bl", "bool", [True, False], is_list=True),
        Attr("strs", "string", ["a", "", "c"], is_list=True),
    ],
    ids=lambda a: a.name,
)
def test_every_attribute_kind_round_trips(attr):
    """Scalars and lists of each protobuf kind are written and read back equal."""
    node = Node(1, "n", COMP_NODE, attrs=[attr])
    data = et_format.et_bytes(EtTrace("x", "v", [attr], [node]))
    back = et_format.parse_et_bytes(data)
    assert back.nodes == [node] and back.attrs == [attr]


def test_a_truncated_file_names_byte_offset_and_node(tmp_path):
    """Cutting the last node short gives one line naming the file, the byte offset and the node."""
    data = (ET_DIR / "8npus_1MB" / "all_reduce.3.et").read_bytes()
    path = tmp_path / "cut.et"
    path.write_bytes(data[:-5])
    with pytest.raises(UsageError) as err:
        et_format.read_et(str(path))
    message = str(err.value)
    assert (
        "\n" not in message
        and "cut.et: byte 9: node 0: record of 74 bytes but only 69 left" in message
        and "truncated" in message
    )


def test_a_corrupt_file_is_refused_by_the_cli_with_exit_2(tmp_path):
    """`themis-mpi train` on a corrupt .et prints one line and exits 2."""
    path = tmp_path / "bad.et"
    path.write_bytes(b"\x07\x0a\x05" + b"0.0.4" + b"\x04\x08\x01\x1f\x00")  # node with wire type 7
    proc = in_process(["train", str(path)])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "bad.et: byte 11: node 0 (id 1): field 3 has unsupported wire type 7" in proc.stderr


# --- the replay ----------------------------------------------------------------------------------


@pytest.mark.parametrize("npus,topology", [(4, T4), (8, "2x2x2"), (16, T16)])
@pytest.mark.parametrize("policy", ["baseline", "themis"])
def test_astra_sim_all_reduce_trace_takes_the_time_of_the_models_all_reduce(npus, topology, policy):
    """The N-NPU all-reduce ET (one file per rank) takes exactly the model's 1 MiB all-reduce time."""
    graph = load_graph(str(ET_DIR / f"{npus}npus_1MB" / "all_reduce"))
    row = model_graph(graph, topology, policy)
    topo = parse_topology(topology)
    coll = Collective("all_reduce", MIB // 4, "float32", 8, tuple(range(len(topo.dims))))
    want, _ = model_collective(topo, coll, policy, CONFIGS[policy])
    assert row.iteration_us == want.time_us and row.collectives == 1 and row.compute_us == 0


def test_the_pytorch_trace_replays_on_a_paper_topology_under_both_policies():
    """On 3D-SW_SW_SW_hetero: 5 all-reduces on the network, iteration = compute + exposed, both policies."""
    graph = load_graph(str(PYTORCH))
    plan = plan_graph(graph.trace(0), parse_topology("3D-SW_SW_SW_hetero"), 0, TrainingSpec())
    assert (plan.collectives, plan.missing_deps, plan.dropped_ctrl_deps) == (5, 1277, 554)
    for policy in CONFIGS:
        row = model_graph(graph, "3D-SW_SW_SW_hetero", policy)
        assert row.collectives == 5 and row.compute_us == pytest.approx(292828.0)
        assert row.iteration_us == pytest.approx(row.compute_us + row.exposed_comm_us)
        assert row.exposed_comm_us > 0 and all(0 < d.utilization < 1 for d in row.dims)


def test_gpu_nodes_run_one_at_a_time_and_a_cpu_op_overlaps_them(tmp_path):
    """Two independent GPU nodes of 5 and 7 us take 12 us; a 10 us CPU op beside them ends earlier."""
    path = write(tmp_path, "g.et", [comp(1, 5), comp(2, 7), comp(3, 10, cpu=True)])
    row = model_graph(load_graph(path), T4, "baseline")
    assert row.iteration_us == 12.0 and row.compute_us == 12.0


def test_ctrl_and_data_dependencies_both_order_nodes(tmp_path):
    """A CPU op after a GPU node (ctrl dep) and another after it (data dep) run one after the other."""
    nodes = [comp(1, 5), comp(2, 3, deps=[1], cpu=True), comp(3, 4, data=[2], cpu=True)]
    row = model_graph(load_graph(write(tmp_path, "d.et", nodes)), T4, "baseline")
    assert row.iteration_us == 12.0


def test_a_cycle_of_data_dependencies_is_refused(tmp_path):
    """Two nodes that need each other's data: one line naming the file and a node."""
    path = write(tmp_path, "cyc.et", [comp(1, 1, data=[2]), comp(2, 1, data=[1])])
    with pytest.raises(UsageError, match=r"cyc.et: node 0 \(id 1\): cycle of data dependencies"):
        model_graph(load_graph(path), T4, "baseline")


def test_an_unsupported_collective_is_refused_naming_the_node(tmp_path):
    """A GATHER node cannot run: one line naming file, node and type."""
    node = Node(4, "g", COMM_COLL_NODE, attrs=[Attr("comm_type", "int64", 3), Attr("comm_size", "int64", 8)])
    with pytest.raises(
        UsageError, match=r"node 0 \(id 4, COMM_COLL 'g'\): collective GATHER is not supported"
    ):
        model_graph(load_graph(write(tmp_path, "g.et", [node])), T4, "baseline")


def test_communicator_groups_choose_the_dims(tmp_path):
    """Group {0,1} on 2x2 is dim 0, {0,2} dim 1; {0,3} is not a sub-grid and is refused."""
    topo = parse_topology(T4)
    assert group_dims(topo, [0, 1], 0, "x") == (0,) and group_dims(topo, [0, 2], 2, "x") == (1,)
    with pytest.raises(UsageError, match="not the sub-grid"):
        group_dims(topo, [0, 3], 0, "x")
    node = Node(
        1,
        "ar",
        COMM_COLL_NODE,
        attrs=[
            Attr("comm_type", "int64", 0),
            Attr("comm_size", "int64", MIB),
            Attr("pg_name", "string", "5"),
        ],
    )
    graph = Graph("g", [EtTrace("g", "", [], [node])], {"5": (0, 2)})
    (op,) = plan_graph(graph.trace(0), topo, 0, TrainingSpec(), graph.groups).ops
    assert op.collective.dims == (1,)


def ring_shift(tmp_path, npus, nbytes, peer_of, tag=3):
    """Per-rank traces: 10 us of compute, then a send to peer_of(r) and a receive from its inverse."""
    inverse = {peer_of(r): r for r in range(npus)}
    for r in range(npus):
        nodes = [
            comp(1, 10),
            Node(
                2,
                "send",
                COMM_SEND_NODE,
                [1],
                attrs=[
                    Attr("comm_dst", "int64", peer_of(r)),
                    Attr("comm_size", "int64", nbytes),
                    Attr("comm_tag", "int64", tag),
                ],
            ),
            Node(
                3,
                "recv",
                COMM_RECV_NODE,
                [1],
                attrs=[
                    Attr("comm_src", "int64", inverse[r]),
                    Attr("comm_size", "int64", nbytes),
                    Attr("comm_tag", "int64", tag),
                ],
            ),
        ]
        write(tmp_path, f"shift.{r}.et", nodes)
    return str(tmp_path / "shift")


def test_a_point_to_point_message_takes_latency_plus_bytes_over_the_link(tmp_path):
    """Under ideal, Ring(4): a neighbour shift of 1 MiB ends at 10 us + latency + S/B; across 2x2, the sum of the dims."""
    prefix = ring_shift(tmp_path, 4, MIB, lambda r: (r + 1) % 4)
    row = model_graph(load_graph(prefix), "Ring(4,100,500)", "baseline", network="ideal")
    assert row.iteration_us * 1e3 == pytest.approx(10e3 + 500 + MIB / (100 * 2**30 / 1e9))
    cross = ring_shift(tmp_path / "..", 4, MIB, lambda r: r ^ 3)
    row = model_graph(load_graph(cross), "Ring(2,100,20)_FC(2,50,700)", "baseline", network="ideal")
    want = 10e3 + (20 + MIB / (100 * 2**30 / 1e9)) + (700 + MIB / (50 * 2**30 / 1e9))
    assert row.iteration_us * 1e3 == pytest.approx(want)
    assert CostModel(parse_topology("Ring(2,100,20)_FC(2,50,700)"), 1).p2p_ns(
        ((0, 1), (1, 1)), MIB
    ) == pytest.approx(want - 10e3)


# --- conversion --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_text_to_et_to_text_gives_the_file_back(tmp_path, path):
    """traces/*.txt -> ET -> text is byte-identical."""
    et = tmp_path / "w.et"
    et_format.write_et(
        str(et), convert.workload_to_et(parse_workload(str(path)), parse_topology("4D-Ring_SW_SW_SW"))
    )
    assert convert.et_to_workload_text(et_format.read_et(str(et))) == path.read_text()


@pytest.mark.parametrize("path", TEXTS, ids=lambda p: p.name)
def test_astra_sim_text_workloads_survive_text_to_et_to_text(tmp_path, path):
    """Each ASTRA-sim 1.0 text workload parses to the same layers after text -> ET -> text."""
    wl = parse_workload(str(path))
    back = tmp_path / "back.txt"
    back.write_text(convert.et_to_workload_text(convert.workload_to_et(wl, parse_topology("2x2x2"))))
    again = parse_workload(str(back))
    assert (again.parallelism, again.layers, again.model_parallel_group) == (
        wl.parallelism,
        wl.layers,
        wl.model_parallel_group,
    )
    assert (again.checkpoints, again.checkpoint_initiates, again.dlrm_last_bottom_layer) == (
        wl.checkpoints,
        wl.checkpoint_initiates,
        wl.dlrm_last_bottom_layer,
    )


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
@pytest.mark.parametrize("policy", ["baseline", "themis"])
def test_text_to_et_replay_takes_the_text_workloads_time(tmp_path, path, policy):
    """On 4D-Ring_SW_SW_SW, the converted graph's iteration time, exposed communication and collectives equal the text replay's."""
    wl, topo = parse_workload(str(path)), parse_topology("4D-Ring_SW_SW_SW")
    spec = TrainingSpec(chunks=4, iterations=2)
    et = tmp_path / "w.et.gz"
    et_format.write_et(str(et), convert.workload_to_et(wl, topo, iterations=2))
    graph = load_graph(str(et))
    fitted = wl.fit_topology(topo)
    text = run_training(ModelTransport(fitted, CONFIGS[policy]), wl, policy, spec)
    replay = run_graph(ModelTransport(fitted, CONFIGS[policy]), graph, policy, spec)
    assert replay.iteration_us == text.iteration_us and replay.exposed_comm_us == text.exposed_comm_us
    assert replay.collectives == text.collectives > 0 and replay.compute_us == text.compute_us


def test_the_cli_converts_both_ways_and_refuses_a_general_graph(tmp_path):
    """`convert` text -> .et -> text gives the file back; a microbenchmark ET has no layer table (exit 2)."""
    et, txt = tmp_path / "g.et", tmp_path / "g.txt"
    for args in (["convert", str(ROOT / "traces" / "gnmt.txt"), str(et)], ["convert", str(et), str(txt)]):
        proc = in_process([*args])
        assert proc.returncode == 0, proc.stderr
    assert txt.read_text() == (ROOT / "traces" / "gnmt.txt").read_text()
    proc = in_process(["convert", str(ET_FILES[0]), str(tmp_path / "x.txt")])
    assert proc.returncode == 2 and "no layer table" in proc.stderr and not (tmp_path / "x.txt").exists()


# --- MPI: the emulator agrees with the model ---------------------------------------------------


def model_rows(args, out):
    """`themis-mpi ARGS --json out` in one process (the model); the rows."""
    proc = in_process([*args, "--json", str(out)])
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


ALL_REDUCE_ETS = [(4, T4), (8, "2x2x2")]
DLRM_TOPOLOGY = "Ring(2,100,20)_SW(2,50,700)"


@pytest.fixture(scope="module")
def emulator_runs(tmp_path_factory) -> dict:
    """This section's emulator runs, one mpiexec per rank count (`harness.cli_jobs`): key -> (args, rows).

    ASTRA-sim's all-reduce ETs (``("all_reduce", npus)``), a neighbour shift and a cross-dim
    exchange on 2x2 (``p2p``) and DLRM converted to ET (``dlrm``).
    """
    tmp = tmp_path_factory.mktemp("emulator")
    args = {
        ("all_reduce", n): ["train", str(ET_DIR / f"{n}npus_1MB" / "all_reduce"), "-t", topology, "-c", "8"]
        for n, topology in ALL_REDUCE_ETS
    }
    prefix = ring_shift(tmp, 4, 3 * MIB + 5, lambda r: r ^ 3, tag=40000)
    args["p2p"] = ["train", prefix, "-t", "Ring(2,100,20)_FC(2,50,700)", "-p", "baseline"]
    et = tmp / "dlrm.et"
    wl = parse_workload(str(DATA / "astra-sim-1.0-text" / "DLRM_HybridParallel.txt"))
    et_format.write_et(str(et), convert.workload_to_et(wl, parse_topology(DLRM_TOPOLOGY), iterations=2))
    args["dlrm"] = ["train", str(et), "-t", DLRM_TOPOLOGY, "-c", "4"]
    files = {key: tmp / f"emu{i}.json" for i, key in enumerate(args)}
    ranks = {key: key[1] if key[0] == "all_reduce" else 4 for key in args}
    done = cli_jobs({k: (ranks[k], [*a, "--json", str(files[k])]) for k, a in args.items()}, tmp)
    out = {}
    for key, a in args.items():
        assert done[key].returncode == 0, done[key].stderr[-2000:]
        out[key] = (a, json.loads(files[key].read_text()))
    return out


@pytest.mark.parametrize("npus,topology", ALL_REDUCE_ETS)
def test_the_all_reduce_et_runs_under_mpiexec_with_no_wrong_element_in_the_models_time(
    tmp_path, emulator_runs, npus, topology
):
    """ASTRA-sim's all-reduce ET under mpiexec -n 4 and -n 8: wrong = 0, times equal the model's."""
    args, emu = emulator_runs[("all_reduce", npus)]
    mod = model_rows(args, tmp_path / "model.json")
    for e, m in zip(emu, mod):
        assert e["wrong"] == 0 and e["transport"] == "mpi" and m["transport"] == "model"
        assert e["iteration_us"] == m["iteration_us"] and e["collectives"] == 1


def test_point_to_point_messages_carry_real_data_in_the_models_time(tmp_path, emulator_runs):
    """A neighbour shift and a cross-dim exchange on 2x2 under mpiexec -n 4: wrong = 0, the model's time."""
    args, (emu,) = emulator_runs["p2p"]
    (mod,) = model_rows(args, tmp_path / "model.json")
    assert emu["wrong"] == 0 and emu["iteration_us"] == mod["iteration_us"] > 10


def test_a_converted_workload_runs_on_the_emulator_in_the_models_time(tmp_path, emulator_runs):
    """DLRM (all-to-all and all-reduce) converted to ET, under mpiexec -n 4: wrong = 0, the model's times."""
    args, emu = emulator_runs["dlrm"]
    mod = model_rows(args, tmp_path / "model.json")
    for e, m in zip(emu, mod):
        assert (
            e["wrong"] == 0
            and e["iteration_us"] == m["iteration_us"]
            and e["collectives"] == m["collectives"] > 0
        )


def test_a_graph_is_planned_once_per_npu_topology_and_spec(tmp_path):
    """A run asked for one NPU's plan five times (a 200,000-node graph took 52 s); the plan is kept."""
    nodes = [comp(i, 1, deps=[i - 1] if i > 1 else []) for i in range(1, 50)]
    trace = et_format.read_et(write(tmp_path, "chain.et", nodes))
    topo, spec = parse_topology("2x2"), TrainingSpec(chunks=1)
    first = plan_graph(trace, topo, 0, spec)
    assert plan_graph(trace, topo, 0, spec) is first
    assert plan_graph(trace, topo, 1, spec) is not first  # another NPU
    assert plan_graph(trace, topo, 0, TrainingSpec(chunks=2)) is not first  # another spec
    assert [op.node_id for op in first.ops] == list(range(1, 50))


def test_a_traces_plans_are_kept_for_every_npu_and_dropped_with_the_trace(tmp_path):
    """Every NPU's plan of a live trace is kept (a world of 8 asks for each twice), none once the trace is gone."""
    nodes = [comp(i, 1, deps=[i - 1] if i > 1 else []) for i in range(1, 50)]
    trace = et_format.read_et(write(tmp_path, "chain.et", nodes))
    topo, spec = parse_topology("2x2x2"), TrainingSpec(chunks=1)
    plans = [plan_graph(trace, topo, npu, spec) for npu in range(8)]
    assert all(plan_graph(trace, topo, npu, spec) is plans[npu] for npu in range(8))
    key = id(trace)
    assert len(chakra._PLANS[key]) == 8
    del trace
    gc.collect()
    assert key not in chakra._PLANS
