"""All-pairs against the built-in ring, both ways round a FullyConnected dim (issue 44's FC(4) crossing).

The built-in ring runs both ways round ``FC(4,...)`` (`cost.ring_both_ways`: half of each
message to each neighbour), as the two counter-rotating rings of ``ring_2ch_allreduce_4.xml``
do, so the one-shot all-pairs all-reduce and the ring cross once, where
docs/custom-algorithms.md says; NCCL-like channels over every link cross lower. The model's runs
of the built-in ring and of the fixtures (`scripts/msccl_fixtures.py`) take those closed forms.
"""

import pytest
from harness import DATA, ROOT, shared
from test_msccl_run import emulated, model_us

from themis_mpi.api import sweep
from themis_mpi.units import BYTES_PER_GB

TOPOLOGY = "FC(4,100,500)"
ALPHA_NS = 500.0  # one hop between any two NPUs of a FullyConnected dim
B = 100 * BYTES_PER_GB / 1e9  # the dim's bandwidth, bytes per ns: B/3 a link
FILES = DATA / "msccl"
ALL_PAIRS = f"msccl:{FILES / 'one_shot_allreduce_re_nop_4.xml'}"  # each peer's whole buffer, at once
TWO_WAYS = f"msccl:{FILES / 'ring_2ch_allreduce_4.xml'}"  # (a)
EVERY_LINK = f"msccl:{FILES / 'ring_6ch_allreduce_4.xml'}"  # (b)
# all-reduce time: (latency steps, bytes over B); all-pairs one step of the buffer over each link;
# the built-in ring six steps of S/4, half of it over each of two links of B/3
CLOSED = {ALL_PAIRS: (1, 3.0), TWO_WAYS: (6, 2.25), EVERY_LINK: (6, 1.5), "ring": (6, 2.25)}


def closed_us(algorithm: str, size_bytes: float) -> float:
    """The closed form: steps x alpha + factor x S / B."""
    steps, factor = CLOSED[algorithm]
    return (steps * ALPHA_NS + factor * size_bytes / B) / 1e3


def crossing_bytes(ring: str) -> float:
    """Where all-pairs and the ring take the same time: (steps difference) alpha / (factor difference) / B."""
    (s1, f1), (s2, f2) = CLOSED[ALL_PAIRS], CLOSED[ring]
    return (s2 - s1) * ALPHA_NS * B / (f1 - f2)


@pytest.mark.parametrize("network", ["ideal", "fair"])
@pytest.mark.parametrize(
    "algorithm",
    [ALL_PAIRS, TWO_WAYS, EVERY_LINK, "ring"],
    ids=["all-pairs", "two-ways", "every-link", "built-in-ring"],
)
def test_the_files_take_the_closed_forms(algorithm, network):
    """Each file's and the built-in ring's model time at 4 KiB .. 16 MiB is its closed form."""
    for size in (2**12, 2**16, 2**20, 2**24):
        assert model_us(TOPOLOGY, "all_reduce", size, algorithm, network) == pytest.approx(
            closed_us(algorithm, size), rel=1e-9
        )


def sign_changes(topology: str, ring: str) -> tuple[list[int], list[float]]:
    """All-pairs minus the ring at 1 KiB .. 16 MiB under fair: the indexes where its sign changes, and it."""
    sizes = [2**k for k in range(10, 25)]
    diff = [
        model_us(topology, "all_reduce", s, ALL_PAIRS, "fair")
        - model_us(topology, "all_reduce", s, ring, "fair")
        for s in sizes
    ]
    return [i for i in range(len(sizes) - 1) if (diff[i] < 0) != (diff[i + 1] < 0)], diff


@pytest.mark.parametrize(
    "ring", ["ring", TWO_WAYS, EVERY_LINK], ids=["built-in-ring", "two-ways", "every-link"]
)
def test_all_pairs_crosses_the_ring_once_where_the_page_says(ring):
    """One sign change in 1 KiB .. 16 MiB (all-pairs faster below), at the page's closed-form size."""
    sizes = [2**k for k in range(10, 25)]
    changes, diff = sign_changes(TOPOLOGY, ring)
    assert diff[0] < 0 and len(changes) == 1
    cross = crossing_bytes(ring)
    assert sizes[changes[0]] < cross < sizes[changes[0] + 1]
    at = round(cross / 64) * 64  # (whole elements in every chunk)
    mine = model_us(TOPOLOGY, "all_reduce", at, ring, "fair")
    assert model_us(TOPOLOGY, "all_reduce", at, ALL_PAIRS, "fair") == pytest.approx(mine, rel=1e-4)
    page = (ROOT / "docs" / "custom-algorithms.md").read_text()
    assert f"= {round(cross):,} B, {cross / 1024:.1f} KiB**" in page, "the page gives the crossing"


def test_all_pairs_crosses_the_built_in_ring_once_on_a_switch_at_the_same_size():
    """SW(4): one sign change in 1 KiB .. 16 MiB, all-pairs faster below, at FC(4)'s crossing.

    On the Switch (two hops, one up-link of B) all-pairs takes 2 alpha + 3 S/B and the ring
    12 alpha + 1.5 S/B: its extra latency and what it saves are both twice those on FC(4).
    """
    sizes = [2**k for k in range(10, 25)]
    changes, diff = sign_changes("SW(4,100,500)", "ring")
    assert diff[0] < 0 and len(changes) == 1
    assert sizes[changes[0]] < crossing_bytes("ring") < sizes[changes[0] + 1]
    at = round(crossing_bytes("ring") / 64) * 64
    assert model_us("SW(4,100,500)", "all_reduce", at, ALL_PAIRS, "fair") == pytest.approx(
        model_us("SW(4,100,500)", "all_reduce", at, "ring", "fair"), rel=1e-4
    )


def test_rccls_all_pairs_file_takes_the_same_closed_form():
    """RCCL's one-shot all-pairs file (../shared/custom-algos) takes what the fixture standing for it takes."""
    path = f"msccl:{shared('custom-algos') / 'allreduce_1step_allpairs_4gpu_rccl.xml'}"
    for size in (2**10, 2**13, 2**20):
        assert model_us(TOPOLOGY, "all_reduce", size, path, "fair") == pytest.approx(
            closed_us(ALL_PAIRS, size), rel=1e-9
        )


@pytest.mark.parametrize("network", ["ideal", "fair"])
def test_the_emulator_runs_the_ring_both_ways_in_the_models_time(network, tmp_path):
    """Under mpiexec -n 4 on FC(4): every element right, the model's time, the closed form at one chunk."""
    size = 2**20
    proc, rows = emulated(4, TOPOLOGY, "all_reduce", size, "ring", network, tmp_path, chunks=1)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = rows
    assert row["wrong"] == 0
    assert row["time_us"] == model_us(TOPOLOGY, "all_reduce", size, "ring", network)
    assert row["time_us"] == pytest.approx(closed_us("ring", size), rel=1e-9)


def test_the_built_in_ring_drives_both_neighbour_links_and_not_the_third():
    """Under fair, NPU 0's links to the next and the previous NPU carry half the ring's bytes each."""
    (row,) = sweep(TOPOLOGY, 2**20, "baseline", 1, op="all_reduce", network="fair", algorithm=["ring"])
    carried = {link.name: link.bytes for link in row.links}
    sent = 6 * 2**20 / 4  # six steps of S/4
    assert carried["dim0.peer+1"] == carried["dim0.peer+3"] == sent / 2 and carried["dim0.peer+2"] == 0
