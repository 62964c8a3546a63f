"""NPUs that provably see the same events, each class simulated once (`Classes`, `npu_classes`).

A straggler (a late NPU, a slow NPU's compute, a scaled link) breaks the symmetry that lets one
NPU's view time a run, but most NPUs still behave alike. Colour refinement finds which: NPUs
start coloured by what sets them apart (their delay, their program's kind, their links' scales)
and are split, round after round, by the colours of the NPUs they send to and receive from at
each step of each stage pattern the run uses (the step's peers at distances on one dim,
`routes.StepPlanner.stage_peers`), until no class splits. The result is an equitable partition:
two NPUs of one class see, at every step, the same number of peers of each class with the same
shares. By induction over the run's events, NPUs of one class then start and end every stage at
the same times (they start alike, and every step ends from the ends of peers alike), so one
representative per class (its lowest rank) stands for all.

On every NPU's links (`world.World`) a representative's transfer crosses its own links and its
receivers' down-links; the class of those receivers holds ``|B|`` links that ``|A|`` senders load
alike, so on the representative's link of that class its transfer counts ``|A| / |B|`` times
its share summed over that class (`Classes.step`): the load every such link carries in the run
of every NPU. That is exact for a rule where a transfer's share on a link is what it takes of the
link at its rate, fluid max-min sharing (`FLUID`: ``fair``); under a rule that queues messages
one by one (``store-forward``) or any other, every NPU runs. A stage pattern the classes were not
refined by stops the run (`Unproven`), which starts again refined by it (`world.by_classes`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import RunConfig
from ..topology import Topology
from .fair import Fair
from .links import Step, one_transfer
from .rules import rule_class

FLUID: tuple[type, ...] = (Fair,)  # rules where a share counts as that many transfers (module doc)
Pattern = tuple[int, tuple[tuple[tuple[int, float], ...], ...]]  # (dim, per step (distance, share)s)


class Unproven(Exception):
    """A stage pattern the classes were not refined by: the run stops, to run again refined by it."""

    def __init__(self, pattern: Pattern):
        super().__init__(f"a stage pattern on dim {pattern[0]} the classes were not refined by")
        self.pattern = pattern


def fluid(rule: str) -> bool:
    """Whether a rule's transfers may stand for several (`FLUID`): classes run on its links.

    The rule's own class, not a subclass: `packet` builds on `fair`'s machinery, but its
    per-sender order of packets is no fluid share.
    """
    return rule_class(rule) in FLUID


@dataclass(frozen=True)
class Classes:
    """NPUs in classes that see the same events (module doc).

    Attributes:
        of: every rank's class.
        reps: each class's representative, its lowest rank (ascending: rank 0 first).
        sizes: each class's NPUs.
        patterns: the stage patterns the classes are refined by.
    """

    of: np.ndarray
    reps: tuple[int, ...]
    sizes: np.ndarray
    patterns: frozenset[Pattern]

    @property
    def count(self) -> int:
        """How many classes (NPUs simulated)."""
        return len(self.reps)

    def rep(self, rank: int) -> int:
        """The representative of a rank's class."""
        return self.reps[self.of[rank]]

    def step(self, rank: int, step: Step, per_npu: int, capacity: list[float]) -> Step:
        """A representative's step on representatives' links, its shares weighed by class sizes (module doc).

        Link ``j * per_npu + x`` (NPU j's link x) becomes its representative's link x; a share
        there counts ``|A| / |B|`` times, A the sender's class and B that NPU's.
        """
        a = self.sizes[self.of[rank]]
        hops = []
        for hop in step.hops:
            usage: dict[int, float] = {}
            for link, share in hop:
                j, x = divmod(link, per_npu)
                b = self.of[j]
                q = self.reps[b] * per_npu + x
                usage[q] = usage.get(q, 0.0) + share * float(a / self.sizes[b])
            hops.append(tuple(usage.items()))
        return one_transfer(step.bytes, tuple(hops), step.delay_ns, capacity)

    def recvs(self, ranks: Iterable[int]) -> tuple[int, ...]:
        """The representatives of the NPUs a step receives from."""
        return tuple(sorted({self.rep(r) for r in ranks}))

    def consumers(self, ranks: Iterable[int]) -> int:
        """How many representatives take a transfer sent to these NPUs: their classes."""
        return len({int(self.of[r]) for r in ranks})


def pattern_key(dim: int, peers: tuple[tuple[tuple[int, float], ...], ...]) -> Pattern:
    """A stage's pattern: its dim and its distinct steps' peers (order and repeats do not split NPUs)."""
    return dim, tuple(sorted(set(peers)))


def npu_classes(
    topology: Topology, config: RunConfig, kinds: Mapping[int, Any], patterns: Iterable[Pattern]
) -> Classes:
    """The coarsest classes of NPUs alike in their start and in their peers' classes (module doc).

    Args:
        topology: the network.
        config: the run settings: late NPUs and scaled links set NPUs apart.
        kinds: what else sets an NPU's program apart (e.g. its compute factor), by rank.
        patterns: the stage patterns to refine by.
    """
    n = topology.npus
    keys: dict[int, list] = defaultdict(list)
    for r, delay_ns in config.npu_delay_ns:
        keys[r].append(("late", float(delay_ns)))
    for r, kind in kinds.items():
        keys[r].append(("kind", repr(kind)))
    for d, r, f in config.link_scale:
        keys[r].append(("link", d, float(f)))
    colour = np.zeros(n, np.int64)
    distinct: dict[tuple, int] = {}
    for r, key in sorted(keys.items()):
        colour[r] = distinct.setdefault(tuple(sorted(key)), len(distinct) + 1)
    patterns = frozenset(patterns)
    tables = [t for d, steps in sorted(patterns) for step in steps for t in _tables(topology, d, step)]
    count = len(np.unique(colour))
    while True:
        columns = [colour[:, None]] + [np.sort(colour[t], axis=1) for t in tables]
        _, colour = np.unique(np.concatenate(columns, axis=1), axis=0, return_inverse=True)
        colour = colour.ravel()
        new = int(colour.max()) + 1
        if new == count:
            break
        count = new
    _, first = np.unique(colour, return_index=True)
    order = np.argsort(first)  # classes by their lowest rank
    renumber = np.empty_like(order)
    renumber[order] = np.arange(len(order))
    of = renumber[colour]
    return Classes(of, tuple(int(r) for r in first[order]), np.bincount(of), patterns)


def _tables(topology: Topology, d: int, step: tuple[tuple[int, float], ...]) -> list[np.ndarray]:
    """A step's neighbour tables: per share, every NPU's peers ahead, and (a table each) behind."""
    dim, n = topology.dims[d], topology.npus
    stride = int(np.prod(topology.shape[:d], dtype=np.int64))
    ranks = np.arange(n)
    c = (ranks // stride) % dim.npus
    by_share: dict[float, list[int]] = defaultdict(list)
    for k, w in step:
        by_share[w].append(k)
    out = []
    for _, ks in sorted(by_share.items()):
        for sign in (1, -1):
            out.append(np.stack([ranks + ((c + sign * k) % dim.npus - c) * stride for k in ks], axis=1))
    return out
