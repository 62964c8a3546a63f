"""A topology-aware all-gather synthesizer in the spirit of TACOS: greedy link-chunk matching over time.

TACOS (Won et al., MICRO 2024; astra-sim/tacos) grows an all-gather on a time-expanded network:
whenever links are free, every (destination, missing chunk) is matched to a free in-link whose
source holds the chunk, in random order. What we chose (docs/custom-algorithms.md says why):

- **The network** is `timing.AlphaBeta`'s: a Ring dim two directed links of B/2 per NPU (to
  the next and the previous NPU; two links to the one other NPU of a Ring of 2), a
  FullyConnected dim one link of B/(P-1) per peer, a Switch dim a link to every peer that holds
  the sender's up-link and the receiver's down-link (so one NPU sends and receives one message
  at a time per Switch dim). A chunk on a link takes ``latency * hops + chunk / rate``; a link
  carries one chunk at a time. The file this module writes is timed by `timing.time_programs`
  with that same network, so the time it reports is the written file's.
- **Matching**: at every instant a link becomes free, each destination (most chunks missing
  first) gets a maximum matching between its free in-links and the chunks their sources hold
  and it neither has nor is receiving, found by augmenting paths with the chunks taken rarest
  first (fewest NPUs holding or receiving them). A maximum matching fills every in-link that
  can be filled (TACOS's random order may leave one idle); rarest-first keeps every chunk
  spreading, which is what ends an all-gather early. Deterministic, no seed.
- **Reduce-scatter by reversal**: every transfer of the all-gather is run backwards in time
  (``T - end`` to ``T - start``) from its receiver to its sender, which reduces what it receives
  into its copy before sending it on; the links are the reverse ones, as fast, so the time is
  the same. **All-reduce by composition**: that reduce-scatter, then the all-gather.

The steps become MSCCL-IR through `build.Builder` (waits derived from the data): one threadblock
per (peer, channel), steps in time order (receives before sends at the same instant), in place.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError
from ..topology import Topology
from .build import Builder
from .ir import INPUT, OUTPUT, Algorithm
from .program import Ref
from .timing import AlphaBeta

OPS = {"all_gather": "allgather", "reduce_scatter": "reduce_scatter", "all_reduce": "allreduce"}
MAX_SYNTH_NPUS = 256  # a 4x4x4x4 torus: about 25 s to synthesize, write, check, prove and time
MAX_SYNTH_CHUNKS = 2**16  # NPUs x chunks per NPU


@dataclass(frozen=True)
class Transfer:
    """One chunk over one link: (src, dst, chan) from start_ns to end_ns."""

    start_ns: float
    end_ns: float
    src: int
    dst: int
    chan: int
    chunk: int


@dataclass(frozen=True)
class Synthesis:
    """A synthesized all-gather: its transfers and its time.

    Attributes:
        topology: the network.
        chunks_per_npu: chunks each NPU starts with (K); chunk ``g*K + k`` is NPU g's k-th.
        chunk_bytes: bytes of one chunk.
        transfers: every transfer, in start order.
        time_ns: the all-gather's end (the last arrival).
    """

    topology: Topology
    chunks_per_npu: int
    chunk_bytes: float
    transfers: tuple[Transfer, ...]
    time_ns: float


def synthesis_links(topology: Topology) -> list[tuple[int, int, int]]:
    """Every directed (src, dst, chan) link of the synthesis network (module doc)."""
    net = AlphaBeta(topology)
    links = []
    for a in range(topology.npus):
        coords = net.coords(a)
        for d, dim in enumerate(topology.dims):
            p, stride = dim.npus, net.strides[d]
            if p == 1:
                continue

            def peer(k: int) -> int:
                return a + ((coords[d] + k) % p - coords[d]) * stride  # noqa: B023

            if dim.kind == "Ring":
                links += [(a, peer(1), 0), (a, peer(-1), 1 if p == 2 else 0)]
            else:
                links += [(a, peer(k), 0) for k in range(1, p)]
    return links


def _match(links: list[int], candidates: list[int], options: dict[int, set[int]]) -> dict[int, int]:
    """A maximum matching link -> chunk, chunks tried in the order given (augmenting paths)."""
    owner: dict[int, int] = {}  # link -> chunk

    def augment(chunk: int, seen: set[int]) -> bool:
        for link in links:
            if chunk in options[link] and link not in seen:
                seen.add(link)
                if link not in owner or augment(owner[link], seen):
                    owner[link] = chunk
                    return True
        return False

    for chunk in candidates:
        augment(chunk, set())
    return owner


def synthesize_all_gather(topology: Topology, size_bytes: int, chunks_per_npu: int = 1) -> Synthesis:
    """A greedy all-gather of `size_bytes` (the whole output, nccl-tests' size) on the topology."""
    n, k = topology.npus, chunks_per_npu
    if not 2 <= n <= MAX_SYNTH_NPUS:
        raise UsageError(f"synthesis takes 2 to {MAX_SYNTH_NPUS} NPUs, got {n}")
    if not 1 <= k or n * k > MAX_SYNTH_CHUNKS:
        raise UsageError(
            f"chunks per NPU must be at least 1 and NPUs x chunks at most {MAX_SYNTH_CHUNKS}, got {k}"
        )
    net = AlphaBeta(topology)
    chunk_bytes = size_bytes / (n * k)
    links = synthesis_links(topology)
    routes = [net.route(s, d, c) for s, d, c in links]
    link_ns = [net.message_ns(s, d, c, chunk_bytes) for s, d, c in links]
    into: list[list[int]] = [[] for _ in range(n)]
    for i, (_, d, _) in enumerate(links):
        into[d].append(i)
    have = [set(range(g * k, (g + 1) * k)) for g in range(n)]
    coming: list[set[int]] = [set() for _ in range(n)]
    holders = [1] * (n * k)
    busy_until: dict = {}
    arrivals: list[tuple[float, int, int]] = []  # (time, npu, chunk)
    transfers: list[Transfer] = []
    now = 0.0
    while True:
        arrivals.sort()
        while arrivals and arrivals[0][0] <= now:
            _, g, c = arrivals.pop(0)
            coming[g].discard(c)
            have[g].add(c)
        if all(len(h) == n * k for h in have):
            break
        for dst in sorted(range(n), key=lambda g: (-(n * k - len(have[g]) - len(coming[g])), g)):
            free = [i for i in into[dst] if all(busy_until.get(r, 0.0) <= now for r in routes[i])]
            options = {i: have[links[i][0]] - have[dst] - coming[dst] for i in free}
            wanted = sorted(set().union(*options.values()), key=lambda c: (holders[c], c)) if options else []
            for i, c in sorted(_match(free, wanted, options).items()):
                if not all(busy_until.get(r, 0.0) <= now for r in routes[i]):
                    continue  # a Switch port taken by another destination's match just now
                end = now + link_ns[i]
                for r in routes[i]:
                    busy_until[r] = end
                src, _, chan = links[i]
                transfers.append(Transfer(now, end, src, dst, chan, c))
                coming[dst].add(c)
                holders[c] += 1
                arrivals.append((end, dst, c))
        later = [t for t in busy_until.values() if t > now] + [t for t, _, _ in arrivals if t > now]
        if not later:
            raise UsageError(f"the topology {topology.label()} does not connect its NPUs")
        now = min(later)
    return Synthesis(topology, k, chunk_bytes, tuple(transfers), max(t.end_ns for t in transfers))


def to_algorithm(synth: Synthesis, op: str = "all_gather") -> Algorithm:
    """The synthesized all-gather (or its reduce-scatter, or both as an all-reduce) as MSCCL-IR."""
    if op not in OPS:
        raise UsageError(f"cannot synthesize {op!r}; use one of {', '.join(OPS)}")
    n, k, total = synth.topology.npus, synth.chunks_per_npu, synth.time_ns
    b = Builder(f"tacos_like_{op}_{n}", OPS[op], n, n * k)
    per_gpu: list[list[tuple[float, int, str, int, int, int]]] = [[] for _ in range(n)]

    def add(t: Transfer, shift: float, reverse: bool, kind: str) -> None:
        src, dst, start, end = (
            (t.dst, t.src, total - t.end_ns, total - t.start_ns)
            if reverse
            else (t.src, t.dst, t.start_ns, t.end_ns)
        )
        per_gpu[src].append((shift + start, 1, "send" + kind, dst, t.chan, t.chunk))
        per_gpu[dst].append((shift + end, 0, "recv" + kind, src, t.chan, t.chunk))

    if op in ("reduce_scatter", "all_reduce"):
        for t in synth.transfers:
            add(t, 0.0, True, "+")
    if op in ("all_gather", "all_reduce"):
        for t in synth.transfers:
            add(t, total if op == "all_reduce" else 0.0, False, "")
    buffer = OUTPUT if op == "all_gather" else INPUT
    net = AlphaBeta(synth.topology)
    for g, items in enumerate(per_gpu):
        last_on: dict = {}  # a link of this GPU's sends -> the last send over it (threadblock, step)
        for _, _, kind, peer, chan, chunk in sorted(items):
            tb = b.threadblock(g, peer, peer, chan)
            ref = Ref(buffer, chunk, 1)
            if kind.startswith("send"):
                route = net.route(g, peer, chan)
                step = b.send(g, tb, ref, after=[last_on[link] for link in route if link in last_on])
                last_on.update(dict.fromkeys(route, (tb, step)))
            else:
                b.recv(g, tb, ref, reduce=kind.endswith("+"))
    return b.algorithm()
