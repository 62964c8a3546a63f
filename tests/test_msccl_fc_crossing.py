"""All-pairs against a ring both ways round a FullyConnected dim (issue 44's FC(4) crossing).

The built-in ring on ``FC(4,...)`` uses one of each NPU's three links, so the one-shot all-pairs
all-reduce beats it at every size. docs/custom-algorithms.md works out, in closed form, where
all-pairs would cross (a) two counter-rotating rings (half the data each way round the
neighbours, as the built-in ring runs on a Ring dim) and (b) NCCL-like channels over every link;
the model's runs of fixtures written for both (`scripts/msccl_fixtures.py`) must take those
closed forms and cross where the page says.
"""

import pytest
from harness import DATA, ROOT, shared
from test_msccl_run import model_us

from themis_mpi.units import BYTES_PER_GB

TOPOLOGY = "FC(4,100,500)"
ALPHA_NS = 500.0  # one hop between any two NPUs of a FullyConnected dim
B = 100 * BYTES_PER_GB / 1e9  # the dim's bandwidth, bytes per ns: B/3 a link
FILES = DATA / "msccl"
ALL_PAIRS = f"msccl:{FILES / 'one_shot_allreduce_re_nop_4.xml'}"  # each peer's whole buffer, at once
TWO_WAYS = f"msccl:{FILES / 'ring_2ch_allreduce_4.xml'}"  # (a)
EVERY_LINK = f"msccl:{FILES / 'ring_6ch_allreduce_4.xml'}"  # (b)
# all-reduce time: (latency steps, bytes over B); all-pairs one step of the buffer over each link
CLOSED = {ALL_PAIRS: (1, 3.0), TWO_WAYS: (6, 2.25), EVERY_LINK: (6, 1.5)}


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
    "algorithm", [ALL_PAIRS, TWO_WAYS, EVERY_LINK], ids=["all-pairs", "two-ways", "every-link"]
)
def test_the_files_take_the_closed_forms(algorithm, network):
    """Each file's model time at 4 KiB .. 16 MiB is its closed form (the links never overdrawn)."""
    for size in (2**12, 2**16, 2**20, 2**24):
        assert model_us(TOPOLOGY, "all_reduce", size, algorithm, network) == pytest.approx(
            closed_us(algorithm, size), rel=1e-9
        )


@pytest.mark.parametrize("ring", [TWO_WAYS, EVERY_LINK], ids=["two-ways", "every-link"])
def test_all_pairs_crosses_the_ring_once_where_the_page_says(ring):
    """One sign change in 1 KiB .. 16 MiB (all-pairs faster below), at the page's closed-form size."""
    sizes = [2**k for k in range(10, 25)]
    diff = [
        model_us(TOPOLOGY, "all_reduce", s, ALL_PAIRS, "fair")
        - model_us(TOPOLOGY, "all_reduce", s, ring, "fair")
        for s in sizes
    ]
    changes = [i for i in range(len(sizes) - 1) if (diff[i] < 0) != (diff[i + 1] < 0)]
    assert diff[0] < 0 and len(changes) == 1
    cross = crossing_bytes(ring)
    assert sizes[changes[0]] < cross < sizes[changes[0] + 1]
    at = round(cross / 64) * 64  # (whole elements in every chunk)
    mine = model_us(TOPOLOGY, "all_reduce", at, ring, "fair")
    assert model_us(TOPOLOGY, "all_reduce", at, ALL_PAIRS, "fair") == pytest.approx(mine, rel=1e-4)
    page = (ROOT / "docs" / "custom-algorithms.md").read_text()
    assert f"= {round(cross):,} B, {cross / 1024:.1f} KiB**" in page, "the page gives the crossing"


def test_rccls_all_pairs_file_takes_the_same_closed_form():
    """RCCL's one-shot all-pairs file (../shared/custom-algos) takes what the fixture standing for it takes."""
    path = f"msccl:{shared('custom-algos') / 'allreduce_1step_allpairs_4gpu_rccl.xml'}"
    for size in (2**10, 2**13, 2**20):
        assert model_us(TOPOLOGY, "all_reduce", size, path, "fair") == pytest.approx(
            closed_us(ALL_PAIRS, size), rel=1e-9
        )
