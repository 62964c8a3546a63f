"""The linked ranks on the model (`run.linked`): messages in lock step, in this one thread."""

import threading

import pytest

from themis_mpi.config import RunConfig
from themis_mpi.errors import UsageError
from themis_mpi.model import ModelTransport
from themis_mpi.run.training import run_graph
from themis_mpi.topology import parse_topology
from themis_mpi.workloads.chakra import load_graph
from themis_mpi.workloads.et import COMM_RECV_NODE, COMM_SEND_NODE, COMP_NODE, Attr, EtTrace, Node, write_et
from themis_mpi.workloads.training import TrainingSpec

LATENCY_NS, GBPS = 500.0, 100.0  # SW(2,100,500): a switch of two NPUs
N_BYTES = 1_000_000


def comp(node_id, micros, deps=()):
    return Node(node_id, f"c{node_id}", COMP_NODE, list(deps), duration_micros=micros,
                attrs=[Attr("is_cpu_op", "bool", False)])  # fmt: skip


def message(node_id, kind, peer, deps=(), n_bytes=N_BYTES):
    side = "comm_dst" if kind == COMM_SEND_NODE else "comm_src"
    attrs = [Attr(side, "int64", peer), Attr("comm_size", "int64", n_bytes), Attr("comm_tag", "int64", 1)]
    return Node(node_id, f"m{node_id}", kind, list(deps), attrs=attrs)


def run_pair(tmp_path, nodes_of, progress=None):
    """Two ranks' graphs (`nodes_of(rank)`) on the model of SW(2,...); the row."""
    for r in (0, 1):
        write_et(str(tmp_path / f"g.{r}.et"), EtTrace("g", "0.0.4", [], nodes_of(r)))
    topo = parse_topology(f"SW(2,{GBPS:g},{LATENCY_NS:g})")
    return run_graph(ModelTransport(topo, RunConfig(network="ideal")), load_graph(str(tmp_path / "g")),
                     "baseline", TrainingSpec(4, "float32", 1), None, progress)  # fmt: skip


def test_a_message_ends_at_the_later_issue_plus_its_cost(tmp_path):
    """Rank 0 computes 3 us then sends; rank 1 receives at once, then computes 2 us.

    The message ends at max(send issue, receive issue) + cost, a switch's cost being two hops'
    latency plus the bytes over the port: the iteration is 3 us + that + 2 us.
    """

    def nodes_of(r):
        if r == 0:
            return [comp(1, 3), message(2, COMM_SEND_NODE, 1, [1])]
        return [message(1, COMM_RECV_NODE, 0), comp(2, 2, [1])]

    cost_ns = 2 * LATENCY_NS + N_BYTES / (GBPS * 2**30 / 1e9)  # (1 GB = 2^30 B)
    row = run_pair(tmp_path, nodes_of)
    assert row.iteration_us * 1e3 == pytest.approx(3000 + cost_ns + 2000, rel=1e-9)


def test_the_ranks_run_and_tell_their_progress_in_this_one_thread(tmp_path):
    """No thread is started: every progress call comes from the caller's thread."""

    def nodes_of(r):
        return [message(1, COMM_SEND_NODE if r == 0 else COMM_RECV_NODE, 1 - r), comp(2, 1, [1])]

    callers, before = set(), threading.active_count()

    def progress(done, total):
        callers.add(threading.get_ident())
        assert threading.active_count() == before

    run_pair(tmp_path, nodes_of, progress)
    assert callers == {threading.get_ident()}


def test_ranks_that_each_receive_first_are_refused_in_one_line(tmp_path):
    """Every rank waits for a message nobody sends yet: the deadlock, named once."""

    def nodes_of(r):
        return [message(1, COMM_RECV_NODE, 1 - r), message(2, COMM_SEND_NODE, 1 - r, [1])]

    with pytest.raises(
        UsageError, match=r"^the graph deadlocks: ranks 0, 1 each wait for a message nobody sends yet$"
    ):
        run_pair(tmp_path, nodes_of)
