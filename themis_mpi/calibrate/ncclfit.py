"""The NCCL-like model (`themis_mpi.nccl`) fitted to a log over its whole size range, within bounds.

The machine (`machine.Machine`: GPU, links, nodes, NICs, algorithms) is given; the fit finds the
library's parameters, each within physical bounds (`PARAMS`): base latencies 0.1-100 us, the
shares of the links' nominal rates each protocol reaches (at most LL 1/2, LL128 120/128, Simple
1), the channel count, NVLS's latency, share and cost per chunk, and across nodes the NICs'
share, the network step latency and the trees' share; and the pair the library ran at each
fitted size (`NcclParams.uses`), which need not be the one the parameters make fastest (NCCL's
tuner uses its own constants).

Residuals are relative (log of model / measured time) on the even-indexed sizes of each run (all
sizes of a run with fewer than six), each size's time the faster of its out-of-place and in-place
runs; sizes below 64 KiB weigh less, and a soft-L1 loss keeps single outliers from steering. The
fit goes from the large sizes down: first the Simple pairs on the sizes from 64 MiB, then from
1 MiB, then all. In each stage, starts (random, and with NVLS, NVLS-Tree or Tree from each size
on) are fitted with every size on its fastest pair, then labelling the sizes (`_segments`: each
pair on one range, an algorithm's protocols in NCCL's order, a cost per range and per size off the
fastest pair) and fitting alternate until the labels hold.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from ..errors import UsageError
from ..limits import MAX_BANDWIDTH_GBPS
from ..nccl import Pair, pairs
from ..output import read_json
from ..progress import Progress, tell
from ..results import busbw_factor
from ..topology import PROTOCOL_CAPS, PROTOCOLS, NcclParams, Topology, parse_topology
from ..units import BYTES_PER_GB
from .logs import NCCL_TYPES, NcclLog
from .machine import NET_STEP_NS, Machine, machine_of
from .optimise import fit_box, soft_l1

US = 1000.0
# name: (low, high, log scale, what it is); latencies in ns, rates in GB/s of 1e9 B
PARAMS: dict[str, tuple[float, float, bool, str]] = {
    "base_LL": (0.1 * US, 100 * US, False, "LL base latency, ns"),
    "base_LL128": (0.1 * US, 100 * US, False, "LL128 base latency, ns"),
    "base_Simple": (0.1 * US, 100 * US, False, "Simple base latency, ns"),
    "eff_LL": (0.01, PROTOCOL_CAPS[0], False, "LL share of the links' nominal rate"),
    "eff_LL128": (0.01, PROTOCOL_CAPS[1], False, "LL128 share of the links' nominal rate"),
    "eff_Simple": (0.05, PROTOCOL_CAPS[2], False, "Simple share of the links' nominal rate"),
    "channels": (1.0, 64.0, True, "channels NCCL spreads a collective over"),
    "nvls_base": (0.1 * US, 100 * US, False, "NVLS base latency, ns"),
    "nvls_eff": (0.05, 1.0, False, "NVLS algbw / dim 0's nominal rate"),
    "nvls_chunk": (0.01 * US, 10 * US, False, "what an NVLS chunk costs its channel besides its bytes, ns"),
    "net_eff": (0.05, 1.0, False, "share of the NICs' nominal rate"),
    "net_step": (0.1 * US, 100 * US, False, "per-step latency across nodes, ns"),
    "tree_eff": (0.05, 1.0, False, "share of the across-node rate a tree reaches"),
    "link_gbps": (0.0, 0.0, False, "dim 0's rate each way, GB/s (1e9 B), fitted: the log names no GPU"),
}
PARAM_DOC = {name: spec[3] for name, spec in PARAMS.items()}
# Where a parameter sits when the log says little about it: NCCL's own tuner (tuning.cc: base
# latencies 6.6 / 14 / 8.4 us, LL at half the wire, LL128 at 0.92 of it, NVLS 25 us, the network's
# Simple step 14 us), NCCL's usual 16+ channels, links and NICs near their nominal rate. A weak
# pull (PRIOR_WEIGHT per e-fold), so that a parameter no size constrains ends somewhere physical.
PRIORS = {
    "base_LL": 6.6 * US,
    "base_LL128": 14 * US,
    "base_Simple": 8.4 * US,
    "eff_LL": 0.3,
    "eff_LL128": 0.8,
    "eff_Simple": 0.85,
    "channels": 16.0,
    "nvls_base": 25 * US,
    "nvls_eff": 0.6,
    "nvls_chunk": 0.5 * US,
    "net_eff": 0.85,
    "net_step": 14 * US,
    "tree_eff": 0.85,
}
PRIOR_WEIGHT = 0.005
SMALL_BYTES = 64 * 2**10  # sizes below weigh `SMALL_WEIGHT` in the fit (the bands start here)
SMALL_WEIGHT = 0.2
DELTA = 0.03  # soft-L1 scale: residuals past ~3 % count linearly
# What a fit pays for each range of sizes on one pair, and for each size where that pair is not
# the fastest (NCCL's tuner misjudging it): one size about 5 % further off.
SEGMENT_COST = 0.0005
SLOWER_COST = 0.002
STARTS = 8
RESTARTS = 2  # whole staged fits from other random starts; the cheapest wins
SCREEN_ITERS = 10  # LM iterations of a starting point before the best few go on
FINALISTS = 5
STAGES = ((64 * 2**20, ("Simple",)), (2**20, ("LL128", "Simple")), (0, PROTOCOLS))
BOUND_SHARE = 0.005  # a parameter this close to a bound (share of its range) is reported as on it


def busbw_of(op: str, npus: int) -> float:
    """nccl-tests' bus-bandwidth factor (`results.busbw_factor`)."""
    return busbw_factor(op, npus)


@dataclass
class NcclFit:
    """The fitted NCCL-like machine and how well it reproduces every size of the log.

    Attributes:
        topology: what ``-t`` takes (dims and ``NCCL(...)``), for the log's largest run.
        chunks: the chunk count the fit assumes (1: one NCCL call per collective).
        args: the further options `model` needs (none: the topology carries everything).
        fitted: the fitted parameters (`PARAMS`), by name.
        on_bounds: the fitted parameters that ended on a bound, with that bound.
        rows: per size of the largest run: measured and model time, error, algorithm, protocol.
        runs: per run (table): its label, topology, rows and `summary`.
        machine: what was taken as given (`machine.Machine.sources`).
        prediction: with a base fit, the multi-node machine predicted from it and nominal NICs.
    """

    topology: str
    chunks: int
    args: list[str]
    op: str
    dtype: str
    npus: int
    fitted: dict[str, float]
    on_bounds: dict[str, float] = field(default_factory=dict)
    rows: list[dict] = field(default_factory=list)
    runs: list[dict] = field(default_factory=list)
    machine: list[str] = field(default_factory=list)
    prediction: dict | None = None

    def to_dict(self) -> dict:
        """Plain values for JSON."""
        return asdict(self)


@dataclass
class _Run:
    log: NcclLog
    sizes: np.ndarray  # fitted sizes
    measured: np.ndarray  # their times, ns
    weights: np.ndarray


def _check_fittable(log: NcclLog) -> None:
    rows = log.rows
    times = [r.time_us for r in rows]
    sizes = [r.size_bytes for r in rows]
    if len(rows) < 2 or (len(rows) < 4 and not log.partial):
        split = (
            f"; it reads as {log.tables} tables because its sizes do not grow from row to row (a size at or "
            "below the one before starts a table): sort them, or pick one with --table"
            if log.tables > 2
            else ""
        )
        raise UsageError(f"{log.path}: {len(rows)} size(s): the log cannot be fitted (need 2 or more){split}")
    if times[-1] < 1.1 * times[0] * min(1.0, sizes[-1] / sizes[0] / 2):
        raise UsageError(
            f"{log.path}: the times do not grow with the size ({times[0]:g} us at {sizes[0]} B, "
            f"{times[-1]:g} us at {sizes[-1]} B): the log cannot be fitted"
        )
    gbps = sizes[-1] / (times[-1] * 1e-6) / BYTES_PER_GB
    if gbps > MAX_BANDWIDTH_GBPS / 10 or times[0] < 1e-3:
        raise UsageError(
            f"{log.path}: {times[-1]:g} us for {sizes[-1]} B is {gbps:.3g} GB/s: not a network; "
            "the log cannot be fitted"
        )


def _trusted(params: NcclParams, **changes) -> NcclParams:
    """`dataclasses.replace` without `NcclParams`' checks, for the fit's own candidates.

    A fit builds one per evaluation of its residuals, each value inside its `PARAMS` bounds,
    which lie inside the ranges `NcclParams` checks; its result is checked (`_Model.params`).
    """
    out = object.__new__(NcclParams)
    out.__dict__.update(params.__dict__, **changes)
    return out


class _Model:
    """The parameter vector of a fit, the machine and the runs: times, choices, costs."""

    def __init__(self, machine: Machine, runs: list[_Run], base: dict[str, float], fixed: NcclParams):
        self.machine, self.runs, self.base, self.fixed = machine, runs, base, fixed
        self._levels: dict[tuple[int, float, float], list] = {}  # most candidates keep the rates and steps

    def params(self, values: dict[str, float], uses=()) -> tuple[NcclParams, float, float]:
        """The library's parameters, dim 0's rate (GB/s of 1e9) and the network step (ns)."""
        v = {**self.base, **values}
        f = self.fixed
        params = _trusted(
            f,
            base_ns=(v.get("base_LL", f.base_ns[0]), v.get("base_LL128", f.base_ns[1]), v["base_Simple"]),
            efficiency=(
                v.get("eff_LL", f.efficiency[0]),
                v.get("eff_LL128", f.efficiency[1]),
                v["eff_Simple"],
            ),
            nvls_base_ns=v.get("nvls_base", f.nvls_base_ns),
            nvls_efficiency=v.get("nvls_eff", f.nvls_efficiency),
            nvls_chunk_ns=v.get("nvls_chunk", f.nvls_chunk_ns),
            tree_efficiency=v.get("tree_eff", f.tree_efficiency),
            net_efficiency=v.get("net_eff", f.net_efficiency),
            channels=v.get("channels", f.channels),
            uses=(),
        )
        if uses:  # the fit's result: checked as a user's would be
            params = replace(params, uses=tuple(uses))
        return params, v.get("link_gbps", self.machine.link_gbps), v.get("net_step", NET_STEP_NS)

    def topology(self, values: dict[str, float], npus: int, uses=()) -> Topology:
        """The nccl topology of a run of `npus` NPUs."""
        params, link, step = self.params(values, uses)
        return self.machine.topology(npus, params, link, step)

    def pairs(self, values: dict[str, float], run: _Run, sizes=None) -> list[Pair]:
        """Every pair's time on a run's fitted sizes (or `sizes`)."""
        params, link, step = self.params(values)
        key = (run.log.npus, link, step)
        lv = self._levels.get(key)
        if lv is None:
            if len(self._levels) > 64:
                self._levels.clear()
            lv = self._levels[key] = self.machine.levels(*key)
        return pairs(params, lv, run.log.op, run.sizes if sizes is None else sizes)


def _names(machine: Machine, runs: list[_Run], protocols, base: bool) -> list[str]:
    """The parameters a stage fits (with a base fit, only the across-node ones and latencies)."""
    ar = any(r.log.op == "all_reduce" for r in runs)
    multi = any(r.log.npus > machine.per_node for r in runs)
    nvls = ar and any(a.startswith("NVLS") for a in machine.algos)
    tree = ar and multi and any(a in ("Tree", "NVLSTree") for a in machine.algos)
    names = [f"base_{p}" for p in PROTOCOLS if p in protocols and p in machine.protocols]
    if not base:
        names += [f"eff_{p}" for p in PROTOCOLS if p in protocols and p in machine.protocols] + ["channels"]
        names += ["nvls_eff", "nvls_chunk"] if nvls else []
        names += ["link_gbps"] if not machine.link_gbps else []
    names += ["nvls_base"] if nvls else []
    names += ["net_eff", "net_step"] if multi else []
    names += ["tree_eff"] if tree else []
    return names


def param_bounds(machine: Machine, name: str) -> tuple[float, float]:
    """A parameter's bounds on this machine: `PARAMS`', or for a fitted link rate its vendor's rows."""
    lo, hi, _, _ = PARAMS[name]
    return machine.link_bounds if name == "link_gbps" else (lo, hi)


def _segments(loss: np.ndarray, penalty: float, pairs_of: list[tuple[str, int]]) -> np.ndarray:
    """Per size (rows, ascending) the pair (columns) NCCL ran, each pair on one range of sizes.

    The labels that minimise the summed loss plus `penalty` per range, as NCCL's tuner would have
    them (`nccl.uses_index`: it picks the fastest of straight lines): no pair on two ranges, and
    one algorithm's protocols in their order LL, LL128, Simple (each has a higher latency and a
    higher rate than the one before). `pairs_of` gives each column's algorithm and protocol index.
    A dynamic programme over the last pair and the pairs used so far.
    """
    n, m = loss.shape
    # per pair, the pairs (bits) that bar it once used: its algorithm's later protocols
    barred = [sum(1 << u for u, (a, r) in enumerate(pairs_of) if a == algo and r > k) for algo, k in pairs_of]
    finite = np.isfinite(loss).tolist()
    layer = {(p, 1 << p): float(loss[0, p]) + penalty for p in range(m) if finite[0][p]}
    back: list[dict] = [{}]
    for i in range(1, n):
        new: dict = {}
        prev: dict = {}
        row, ok = loss[i].tolist(), finite[i]
        for (p, used), cost in layer.items():
            moves = [(p, used, cost + row[p])] if ok[p] else []
            moves += [
                (q, used | 1 << q, cost + penalty + row[q])
                for q in range(m)
                if not used >> q & 1 and ok[q] and not used & barred[q]
            ]
            for q, u, c in moves:
                if c < new.get((q, u), math.inf):
                    new[(q, u)], prev[(q, u)] = float(c), (p, used)
        layer = new
        back.append(prev)
    key = min(layer, key=lambda k: layer[k])
    labels = [key[0]]
    for i in range(n - 1, 0, -1):
        key = back[i][key]
        labels.append(key[0])
    return np.array(labels[::-1])


def _uses(found: list[Pair], labels: np.ndarray, sizes: np.ndarray) -> tuple:
    """The `NcclParams.uses` of per-size labels: each pair with its first and last size."""
    out: list[tuple[str, str, int, int]] = []
    for k, size in zip(labels, sizes):
        pair = found[int(k)]
        if out and out[-1][:2] == (pair.algorithm, pair.protocol):
            out[-1] = (*out[-1][:3], int(size))
        else:
            out.append((pair.algorithm, pair.protocol, int(size), int(size)))
    return tuple(out)


def _fit_stage(model: _Model, names: list[str], protocols, lo_bytes: float, values, rng, seeds):
    """One stage: multi-start bounded LM on the sizes from `lo_bytes`, the pairs relabelled in turn.

    Each start is fitted with every size on its fastest pair, then fits and `_segments` labellings
    alternate until the labels hold. Returns the values, each run's labels and the cost.
    """
    machine = model.machine
    scale = [PARAMS[n][2] for n in names]
    bounds = [param_bounds(machine, n) for n in names]
    lo = np.array([math.log(a) if s else a for (a, _), s in zip(bounds, scale)])
    hi = np.array([math.log(b) if s else b for (_, b), s in zip(bounds, scale)])
    runs = [(r, r.sizes >= lo_bytes) for r in model.runs]
    runs = [(r, keep) for r, keep in runs if keep.any()]

    def values_of(x) -> dict[str, float]:
        out = dict(values)
        out.update({n: math.exp(v) if s else float(v) for n, v, s in zip(names, x, scale)})
        return out

    def x_of(v: dict[str, float]) -> np.ndarray:
        return np.clip(np.array([math.log(v[n]) if s else v[n] for n, s in zip(names, scale)]), lo, hi)

    def found_of(x) -> list[list[Pair]]:
        v = values_of(x)
        return [model.pairs(v, run, run.sizes[keep]) for run, keep in runs]

    def times(x) -> list[np.ndarray]:
        """Per run, every pair's time at its sizes (inf for a protocol this stage leaves out)."""
        return [
            np.array([p.times_ns if p.protocol in protocols else np.full(len(p.times_ns), np.inf) for p in f])
            for f in found_of(x)
        ]

    def losses(x) -> list[np.ndarray]:
        """Per run, each size's (rows) loss on each pair (columns), plus `SLOWER_COST` off the fastest."""
        out = []
        for t, (run, keep) in zip(times(x), runs):
            loss = soft_l1(np.log(np.minimum(t, 1e30) / run.measured[keep]) * run.weights[keep], DELTA)
            out.append((loss + np.where(t > t.min(axis=0), SLOWER_COST, 0.0)).T)
        return out

    def residual(x, labels) -> np.ndarray:
        """Log errors of each size on its labelled pair (with no labels its fastest), and the priors."""
        out = []
        for k, (t, (run, keep)) in enumerate(zip(times(x), runs)):
            chosen = t.min(axis=0) if labels is None else t[labels[k], np.arange(t.shape[1])]
            out.append(np.log(np.minimum(chosen, 1e30) / run.measured[keep]) * run.weights[keep])
        v = values_of(x)
        out.append(np.array([PRIOR_WEIGHT * math.log(v[n] / PRIORS[n]) for n in names if n in PRIORS]))
        return np.concatenate(out)

    def lm(x, labels, iters):
        y, cost = fit_box(lambda z: residual(z, labels), x, lo, hi, DELTA, iters)
        now = fastest(y)
        slower = 0 if labels is None else sum(int((lab != f).sum()) for lab, f in zip(labels, now))
        return y, cost + SEGMENT_COST * sum(
            len(_runs_of(lab)) for lab in labels or now
        ) + SLOWER_COST * slower

    def orders(x) -> list[list[tuple[str, int]]]:
        """Per run, each pair's algorithm and protocol index (`_segments`)."""
        return [[(p.algorithm, PROTOCOLS.index(p.protocol)) for p in f] for f in found_of(x)]

    def fastest(x):
        return [np.argmin(t, axis=0) for t in times(x)]

    def relabel(x, labels, iters):
        cost = math.inf
        for _ in range(6):
            new = [_segments(loss, SEGMENT_COST, order) for loss, order in zip(losses(x), orders(x))]
            if all(np.array_equal(a, b) for a, b in zip(new, labels)) and math.isfinite(cost):
                break
            labels = new
            x, cost = lm(x, labels, iters)
        return x, cost, labels

    starts = [x_of(values)] if all(n in values for n in names) else []
    guesses = []
    for _ in range(STARTS):
        guess = dict(values)
        for n, s in zip(names, scale):
            if n not in values:
                a, b = param_bounds(machine, n)
                guess[n] = (
                    math.exp(rng.uniform(math.log(a), math.log(b))) if s or a > 0 else rng.uniform(a, b)
                )
        guesses.append(guess)
    starts += [x_of(g) for g in guesses] + [x_of({**guesses[0], **seed}) for seed in seeds]
    screened = []
    for x0 in starts:  # each size on its fastest pair, whichever that becomes
        y, cost = lm(x0, None, SCREEN_ITERS)
        screened.append((y, cost, fastest(y)))
    for x0, _, _ in sorted(screened, key=lambda t: t[1])[:2]:  # each algorithm from each size on
        for labels in _starts_of(found_of(x0), times(x0), protocols):
            screened.append((*lm(x0, labels, SCREEN_ITERS), labels))
    finalists = sorted(screened, key=lambda t: t[1])[:FINALISTS]
    x, _, labels = min((relabel(x, lab, 30) for x, _, lab in finalists), key=lambda t: t[1])
    x, cost = lm(x, labels, 150)
    return values_of(x), labels, cost


def _starts_of(found: list[list[Pair]], times: list[np.ndarray], protocols) -> list[list[np.ndarray]]:
    """Labellings that switch to NVLS, NVLS-Tree or Tree at some size (the fastest other pair below).

    `found` and `times` hold each run's pairs and their times (`_fit_stage`). These are the
    algorithms NCCL switches to at large sizes: each size is tried as the switch, as NCCL's tuner
    may switch where the model's parameters do not yet say so.
    """
    out = []
    for name in ("NVLS", "NVLSTree", "Tree"):
        for protocol in protocols:
            per_run = []
            for pairs_here, t in zip(found, times):
                names = [(p.algorithm, p.protocol) for p in pairs_here]
                col = names.index((name, protocol)) if (name, protocol) in names else None
                others = np.where(np.array([a != name for a, _ in names])[:, None], t, np.inf)
                per_run.append((col, np.argmin(others if np.isfinite(others).any() else t, axis=0)))
            if all(col is None for col, _ in per_run):
                continue
            for start in range(max(len(below) for _, below in per_run)):
                labels = []
                for col, below in per_run:
                    lab = below.copy()
                    if col is not None:
                        lab[start:] = col
                    labels.append(lab)
                out.append(labels)
    return out


def _runs_of(labels) -> list[int]:
    """The pair of each range of equal labels, in order."""
    return [int(k) for i, k in enumerate(labels) if i == 0 or labels[i - 1] != k]


def _seeds(machine: Machine, runs: list[_Run], lo_bytes: float) -> list[dict]:
    """Starting values for NVLS's and the trees' parameters, from the algbw of the largest sizes."""
    if not any(a in machine.algos for a in ("NVLS", "NVLSTree", "Tree")):
        return []
    big = [(s, t) for r in runs for s, t in zip(r.sizes, r.measured) if s >= lo_bytes]
    algbw = max(s / t for s, t in big) if big else 1.0  # bytes per ns
    eff = min(max(algbw / (machine.link_gbps or 450.0), 0.06), 0.99)
    return [
        {"nvls_eff": eff, "nvls_base": 10 * US, "nvls_chunk": 0.5 * US, "tree_eff": t} for t in (0.5, 0.9)
    ]


def _staged(model: _Model, runs: list[_Run], over_base: bool, rng) -> tuple[dict, list, float]:
    """The stages from the large sizes down (module doc): the values, each run's labels, the cost."""
    machine = model.machine
    values: dict[str, float] = {}
    labels: list = []
    cost = math.inf
    biggest = max(r.sizes.max() for r in runs)
    stages = STAGES if biggest >= 256 * 2**20 else STAGES[-1:]
    mid_protocols = ("LL128", "Simple") if "LL128" in machine.protocols else PROTOCOLS
    seeded = False
    for lo_bytes, protocols in stages:
        protocols = mid_protocols if protocols == ("LL128", "Simple") else protocols
        if sum(int((r.sizes >= lo_bytes).sum()) for r in runs) < 2:
            continue
        names = _names(machine, runs, protocols, over_base)
        seeds = [] if seeded else _seeds(machine, runs, lo_bytes)
        seeded = True
        values, labels, cost = _fit_stage(model, names, protocols, lo_bytes, values, rng, seeds)
    return values, labels, cost


def fit_nccl(
    log: NcclLog,
    base: Topology | None = None,
    algos=None,
    holdout: bool = True,
    link_gbps: float | None = None,
    nic_gbps: float | None = None,
    gpus_per_node: int | None = None,
    seed: int = 1,
    progress: Progress | None = None,
) -> NcclFit:
    """Fit the NCCL-like model to every run of the log (module doc).

    Args:
        log: the log as read (`logs.read_nccl_log`); all its runs are fitted together.
        base: a single-node fit: its dim 0 and protocol shares are kept, and only the latencies
            and the across-node parameters are fitted.
        algos: the algorithms the runs allowed (``NCCL_ALGO``), if the log does not say.
        holdout: fit the even-indexed sizes only, so that the odd ones judge the fit.
        link_gbps: dim 0's rate each way, GB/s of 1e9 B, where the log and the table do not say.
        nic_gbps: the NIC per GPU, GB/s of 1e9 B (default: the GPU's platform).
        gpus_per_node: GPUs per node, where the log does not say.
        seed: the seed of the random starting points (the fit is deterministic for one seed).
        progress: told each whole staged fit done (of `RESTARTS`).
    """
    runs_logs = log.runs or [log]
    for run_log in runs_logs:
        _check_fittable(run_log)
    if base is not None:
        machine, fixed, base_values = _over_base(log, base, algos, nic_gbps)
    else:
        machine = machine_of(log, link_gbps, nic_gbps, gpus_per_node, algos)
        fixed, base_values = (
            NcclParams(
                algos=machine.algos,
                protocols=machine.protocols,
                rccl=machine.rccl,
                nvls_channels=machine.nvls_channels,
            ),
            {},
        )
    runs = []
    for r in runs_logs:
        keep = [i for i in range(len(r.rows)) if not holdout or r.partial or i % 2 == 0]
        sizes = np.array([r.rows[i].size_bytes for i in keep], dtype=float)
        measured = np.array([_best_time_us(r.rows[i]) * US for i in keep])
        runs.append(_Run(r, sizes, measured, np.where(sizes < SMALL_BYTES, SMALL_WEIGHT, 1.0)))
    model = _Model(machine, runs, base_values, fixed)
    for run in runs:
        lv = machine.levels(run.log.npus, machine.link_gbps or 1.0, NET_STEP_NS)
        if not pairs(fixed, lv, run.log.op, run.sizes):
            raise UsageError(
                f"{'+'.join(machine.algos)} cannot run {run.log.op} on {run.log.npus} GPUs of "
                f"{machine.per_node} per node (NCCL runs Tree and NVLSTree only across nodes); "
                "allow Ring with --nccl-algo, or fit a multi-node log"
            )
    tries = []
    for k in range(RESTARTS):
        tries.append(_staged(model, runs, base is not None, np.random.default_rng(seed + k)))
        tell(progress, k + 1, RESTARTS)
    values, labels, _ = min(tries, key=lambda t: t[2])
    values = {k: float(f"{v:.5g}") for k, v in values.items()}
    on_bounds = {}
    for name, value in values.items():
        a, b = param_bounds(machine, name)
        for bound in (a, b):
            if abs(value - bound) <= BOUND_SHARE * (b - a) and b > a:
                on_bounds[name] = bound
    tops = []
    for run, lab in zip(runs, labels):
        found = model.pairs(values, run)
        tops.append(parse_topology(model.topology(values, run.log.npus, _uses(found, lab, run.sizes)).spec()))
    main = max(range(len(runs)), key=lambda k: runs[k].log.npus)
    out_runs: list[dict] = []
    for run, topo in zip(runs, tops):
        rows = nccl_rows(run.log, topo, {int(s) for s in run.sizes})
        out_runs.append(
            {"label": run.log.label, "topology": topo.spec(), "rows": rows, "summary": summary(rows)}
        )
    result = NcclFit(
        tops[main].spec(),
        1,
        [],
        runs[main].log.op,
        NCCL_TYPES[runs[main].log.rows[0].type][1],
        runs[main].log.npus,
        values,
        on_bounds,
        out_runs[main]["rows"],
        out_runs,
        machine.sources,
    )
    if base is not None:
        result.prediction = predict(base, log, nic_gbps)
    return result


def _best_time_us(row) -> float:
    """The time a fit takes for a size: the faster of its out-of-place and in-place runs.

    nccl-tests runs them back to back on the same buffers' sizes; a hiccup of the machine only
    ever adds time, so the faster of the two is the better estimate of what the algorithm takes.
    """
    return min(row.time_us, row.time_in_place_us or math.inf)


def _over_base(log: NcclLog, base: Topology, algos, nic_gbps) -> tuple[Machine, NcclParams, dict]:
    """The machine and the fixed parameters of a fit over a single-node fit."""
    d0 = base.dims[0]
    if log.npus % d0.npus or log.npus == d0.npus:
        raise UsageError(
            f"{log.path}: {log.npus} NPUs is not a multiple (> 1) of the base's {d0.npus} per node"
        )
    assert base.nccl is not None
    machine = machine_of(log, d0.bandwidth_gbps * BYTES_PER_GB / 1e9, nic_gbps, d0.npus, algos)
    fixed = replace(base.nccl, algos=machine.algos, uses=())
    return replace(machine, fabric=d0.kind), fixed, {"eff_Simple": base.nccl.efficiency[2]}


def predict(base: Topology, log: NcclLog, nic_gbps: float | None = None) -> dict:
    """A multi-node log predicted from a single-node fit, the NICs' nominal rate and NCCL's step latency.

    Nothing of the multi-node log is fitted: its nodes and NIC rate (the log's GPU's platform, or
    `nic_gbps`) only; the single-node `uses` are dropped (the tuner decides anew on more nodes).
    """
    machine, fixed, _ = _over_base(log, base, None, nic_gbps)
    params = replace(fixed, net_efficiency=1.0, tree_efficiency=1.0)
    topo = parse_topology(machine.topology(log.npus, params, machine.link_gbps, NET_STEP_NS).spec())
    return {"topology": topo.spec(), "rows": nccl_rows(log, topo, set())}


def nccl_rows(log: NcclLog, topo: Topology, fitted: set[int]) -> list[dict]:
    """Measured vs model per size, with the algorithm and protocol the model picks."""
    from ..nccl import collective_ns

    factor = busbw_of(log.op, log.npus)
    out = []
    for r in log.rows:
        choice = collective_ns(topo, range(len(topo.dims)), log.op, r.size_bytes)
        model_us = choice.time_ns / US
        out.append(
            {
                "size_bytes": r.size_bytes,
                "fitted": r.size_bytes in fitted,
                "measured_us": r.time_us,
                "in_place_us": r.time_in_place_us,
                "model_us": model_us,
                "time_error_pct": 100 * (model_us - r.time_us) / r.time_us,
                "measured_busbw": factor * r.size_bytes / r.time_us / 1e3,
                "model_busbw": factor * r.size_bytes / model_us / 1e3,
                "algorithm": choice.algorithm,
                "protocol": choice.protocol,
            }
        )
    return out


def summary(rows: list[dict]) -> dict[str, float]:
    """The figures of |time error| % issue 47 judges a fit by.

    On the held-out sizes (all sizes if none is held out) from 64 KiB: the median, the 90th
    percentile, the worst, and the worst from 64 MiB; and the worst of all sizes.
    """
    judged = [r for r in rows if not r["fitted"]] or rows
    mid = [abs(r["time_error_pct"]) for r in judged if r["size_bytes"] >= SMALL_BYTES]
    big = [abs(r["time_error_pct"]) for r in judged if r["size_bytes"] >= 64 * 2**20]
    nan = math.nan
    return {
        "median_pct": float(np.median(mid)) if mid else nan,
        "p90_pct": float(np.percentile(mid, 90)) if mid else nan,
        "worst_from_64KiB_pct": max(mid) if mid else nan,
        "worst_from_64MiB_pct": max(big) if big else nan,
        "worst_all_pct": max(abs(r["time_error_pct"]) for r in rows),
        "held_out": float(len(judged) < len(rows)),
    }


def read_base(text: str) -> Topology:
    """``--base``: a single-node fit, as its topology string or the file `calibrate --json` wrote."""
    if text.endswith(".json") or (os.path.isfile(text) and "(" not in text):
        try:
            doc = read_json(text)
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read --base {text}: {str(exc)[:100]}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("topology"), str):
            raise UsageError(f"--base {text}: not a calibrate --json file (no 'topology')")
        text = doc["topology"]
    base = parse_topology(text)
    if len(base.dims) != 1 or not base.flat:
        raise UsageError("--base must be a single-node NCCL-like fit: one nccl dim and NCCL(...)")
    return base
