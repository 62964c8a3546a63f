"""The NCCL-like model (`themis_mpi.nccl`) fitted to a log over its whole size range."""

from __future__ import annotations

import itertools
import json
import math
import os
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from ..errors import UsageError
from ..limits import MAX_BANDWIDTH_GBPS, MIN_BANDWIDTH_GBPS
from ..nccl import best, levels
from ..topology import NCCL_ALGOS, Dim, NcclParams, Topology, parse_topology
from ..units import BYTES_PER_GB
from .logs import NCCL_TYPES, NcclLog, NcclRow
from .optimise import _lm, _nelder_mead

# --- the NCCL-like fit --------------------------------------------------------------------------

NVLINK_STEP_NS = 600.0  # NCCL's NVLink hop latency of LL (tuning.cc hwLatencies): dim 0's step, not fitted
NIC_STEP_NS = 2700.0  # NCCL's network hop latency of Ring LL: the nominal across-node step
NIC_GBPS = 400e9 / 8 / BYTES_PER_GB  # one 400 Gb/s NIC per GPU, in GB/s of 2^30 B
NVLINK4_GBPS = 450e9 / BYTES_PER_GB  # H100 NVLink 4: 450e9 B/s per direction (419.1 GB/s of 2^30 B)
ROBUST_PCTS = (3.0, 1000.0)  # soft-L1 scales: a robust pass, then least squares without the outliers
# Errors past 10 % from 64 KiB, and past 4 % from 64 MiB, cost extra (hinge residuals of this weight).
BANDS = ((64 * 2**10, 10.0), (64 * 2**20, 4.0))
HINGE_WEIGHT = 10.0
OUTLIER_PCT = 30.0  # a fitted size this far off after the robust pass is left out of the wider one
_POSITIVE = ("B0", "B1", "L1", "base_LL", "base_LL128", "base_Simple", "nvls_base")
_SHARE = ("eff_LL", "eff_LL128", "eff_tree")
PARAM_DOC = {
    "B0": "dim 0 bandwidth per NPU, GB/s (2^30 B)",
    "B1": "dim 1 bandwidth per NPU, GB/s (2^30 B)",
    "L1": "dim 1 per-step latency, ns",
    "base_LL": "LL base latency, ns",
    "base_LL128": "LL128 base latency, ns",
    "base_Simple": "Simple base latency, ns",
    "eff_LL": "LL share of the bandwidth",
    "eff_LL128": "LL128 share of the bandwidth",
    "nvls_base": "NVLS base latency, ns",
    "nvls_eff": "NVLS algbw / dim 0 bandwidth",
    "eff_tree": "share of the across-node bandwidth a tree reaches",
}


def busbw_of(op: str, npus: int) -> float:
    """nccl-tests' bus-bandwidth factor: 2(n-1)/n for all-reduce, (n-1)/n otherwise."""
    return 2.0 * (npus - 1) / npus if op == "all_reduce" else (npus - 1) / npus


@dataclass
class NcclFit:
    """The fitted NCCL-like machine and how well it reproduces every size of the log.

    Attributes:
        topology: what ``-t`` takes (dims and ``NCCL(...)``).
        args: the further options `model` needs (none: the topology carries everything).
        fitted: the names of the fitted parameters (`PARAM_DOC`), with their values.
        rows: per size: measured and model time, error, the predicted algorithm and protocol.
        prediction: for a multi-node log with a base fit, the base plus the NIC's nominal rate.
    """

    topology: str
    chunks: int
    args: list[str]
    op: str
    dtype: str
    npus: int
    fitted: dict[str, float]
    rows: list[dict] = field(default_factory=list)
    prediction: dict | None = None

    def to_dict(self) -> dict:
        """Plain values for JSON."""
        return asdict(self)


def _machine(values: dict[str, float], npus: int, base: Topology | None, kind: str, algos) -> Topology:
    """The topology of a parameter set: one dim, or the base's dim 0 plus a dim across nodes."""
    ref = base.nccl if base is not None and base.nccl is not None else NcclParams()
    params = NcclParams(
        (
            values.get("base_LL", ref.base_ns[0]),
            values.get("base_LL128", ref.base_ns[1]),
            values.get("base_Simple", ref.base_ns[2]),
        ),
        (values.get("eff_LL", ref.efficiency[0]), values.get("eff_LL128", ref.efficiency[1]), 1.0),
        values.get("nvls_base", ref.nvls_base_ns),
        values.get("nvls_eff", ref.nvls_efficiency),
        tuple(algos),
        values.get("eff_tree", ref.tree_efficiency),
    )
    if base is None:
        dims: tuple[Dim, ...] = (Dim(kind, npus, values["B0"], NVLINK_STEP_NS, "nccl"),)
    else:
        d0 = base.dims[0]
        dims = (d0, Dim("Switch", npus // d0.npus, values["B1"], values["L1"], "nccl"))
    return Topology(dims, "", nccl=params)


def _rounded(values: dict[str, float]) -> dict[str, float]:
    return {k: float(f"{v:.5g}") for k, v in values.items()}


def _encode(names, values) -> np.ndarray:
    """Unconstrained coordinates: logs of positive values, logits of shares.

    LL is kept the low-latency, low-bandwidth protocol: ``eff_LL`` is coded as a share of
    ``eff_LL128`` and ``base_LL128`` as ``base_LL`` plus a positive amount.
    """
    values = dict(values)
    if "eff_LL" in names:
        values["eff_LL"] = min(max(values["eff_LL"] / values["eff_LL128"], 1e-6), 1 - 1e-6)
    if "base_LL128" in names and "base_LL" in names:
        values["base_LL128"] = max(values["base_LL128"] - values["base_LL"], 1.0)
    out = []
    for n in names:
        v = values[n]
        if n in _SHARE:
            out.append(math.log(v / (1 - v)))
        elif n == "nvls_eff":
            out.append(math.log(v / (2 - v)))
        else:
            out.append(math.log(v))
    return np.array(out)


def _decode(names, u) -> dict[str, float]:
    out = {}
    for n, x in zip(names, u):
        x = float(np.clip(x, -40, 40))
        if n in _SHARE:
            out[n] = min(max(1 / (1 + math.exp(-x)), 0.011), 1.0)
        elif n == "nvls_eff":
            out[n] = min(max(2 / (1 + math.exp(-x)), 0.011), 2.0)
        else:
            out[n] = math.exp(min(x, 18.0))  # at most 6.6e7 (ns, GB/s)
    if "eff_LL" in out:
        out["eff_LL"] = max(out["eff_LL"] * out["eff_LL128"], 0.011)
    if "base_LL128" in out and "base_LL" in out:
        out["base_LL128"] += out["base_LL"]
    return out


def _times_ns(topo: Topology, op: str, sizes) -> list[tuple[float, str, str]]:
    lv = levels(topo, range(len(topo.dims)))
    params = topo.nccl
    assert params is not None
    return [best(params, lv, op, s) for s in sizes]


def _check_fittable(log: NcclLog, rows: list[NcclRow]) -> None:
    times = [r.time_us for r in rows]
    sizes = [r.size_bytes for r in rows]
    if len(rows) < 4:
        raise UsageError(f"{log.path}: {len(rows)} sizes: the log cannot be fitted (need 4 or more)")
    if times[-1] < 1.5 * times[0] or sizes[-1] < 16 * sizes[0]:
        raise UsageError(
            f"{log.path}: the times do not grow with the size ({times[0]:g} us at {sizes[0]} B, "
            f"{times[-1]:g} us "
            f"at {sizes[-1]} B): the log cannot be fitted"
        )
    gbps = sizes[-1] / (times[-1] * 1e-6) / BYTES_PER_GB
    if gbps > MAX_BANDWIDTH_GBPS / 10 or times[0] < 1e-3:
        raise UsageError(
            f"{log.path}: {times[-1]:g} us for {sizes[-1]} B is {gbps:.3g} GB/s: not a network; "
            "the log cannot be fitted"
        )


def fit_nccl(
    log: NcclLog,
    base: Topology | None = None,
    kind: str = "Switch",
    algos=None,
    holdout: bool = True,
    link_gbps: float = NVLINK4_GBPS,
) -> NcclFit:
    """Fit the NCCL-like model (`nccl`) to the log's out-of-place times over the whole size range.

    Without `base`, one dim of ``log.npus`` NPUs at the link's nominal rate `link_gbps` (GB/s of
    2^30 B; one node's bandwidth is not identifiable where NVLS carries the large sizes): each
    protocol's base latency, LL and LL128's efficiencies, and NVLS's base latency and efficiency
    (when NVLS can run): 7 parameters. With `base` (a single-node fit), dim 0 is the base's and
    the fit finds dim 1's bandwidth and step latency, the base latencies, LL and LL128's
    efficiencies, NVLS's base latency and the tree's share of dim 1 (9 parameters; 7 for Ring).
    Residuals are relative (log of model / measured): a robust soft-L1 pass finds the outliers
    (single sizes off by more than `OUTLIER_PCT`), a least-squares pass without them, with
    hinge terms past `BANDS`, gives the fit; a Nelder-Mead pass polishes it. With `holdout`,
    only the even-indexed sizes are fitted; the odd ones judge the fit.
    """
    algos = tuple(algos or NCCL_ALGOS)
    rows = log.rows
    _check_fittable(log, rows)
    fitted_rows = [r for i, r in enumerate(rows) if i % 2 == 0] if holdout else list(rows)
    sizes = [r.size_bytes for r in fitted_rows]
    measured = np.array([r.time_us * 1e3 for r in fitted_rows])
    nvls = log.op == "all_reduce" and kind == "Switch" and any(a in algos for a in ("NVLS", "NVLSTree"))
    t_min_ns = min(r.time_us for r in rows) * 1e3
    big = rows[-1]
    if base is None:
        names = ["base_LL", "base_LL128", "base_Simple", "eff_LL", "eff_LL128"]
        start = {"B0": link_gbps, "eff_LL": 0.3, "eff_LL128": 0.8}
        if nvls:
            names += ["nvls_base", "nvls_eff"]
            start.update(nvls_eff=0.6)
    else:
        if log.npus % base.dims[0].npus or log.npus == base.dims[0].npus:
            raise UsageError(
                f"{log.path}: {log.npus} NPUs is not a multiple (> 1) of the base's "
                f"{base.dims[0].npus} per node"
            )
        nodes = log.npus // base.dims[0].npus
        b1 = (
            busbw_of(log.op, log.npus)
            * big.size_bytes
            / (big.time_us * 1e-6)
            / BYTES_PER_GB
            / base.dims[0].npus
        )
        names = ["B1", "L1", "base_LL", "base_LL128", "base_Simple", "eff_LL", "eff_LL128"]
        tree = log.op == "all_reduce" and any(a in algos for a in ("Tree", "NVLSTree"))
        names += (["nvls_base"] if nvls else []) + (["eff_tree"] if tree else [])
        assert base.nccl is not None
        start = {"B1": b1, "L1": NIC_STEP_NS, "eff_LL128": base.nccl.efficiency[1], "eff_tree": 0.7}
        del nodes
    fixed = {"B0": link_gbps} if base is None else {}
    best_u, best_cost = None, math.inf
    keep = np.ones(len(sizes), dtype=bool)
    best_keep = keep.copy()

    bands = [(np.array([s >= lo for s in sizes]) & keep, math.log1p(pct / 100)) for lo, pct in BANDS]
    hinge = [False]

    def residual(u):
        topo = _machine({**fixed, **_decode(names, u)}, log.npus, base, kind, algos)
        model = np.array([t for t, _, _ in _times_ns(topo, log.op, sizes)])
        r = np.log(model / measured)
        if not hinge[0]:
            return r[keep]
        over = [HINGE_WEIGHT * np.maximum(np.abs(r[band & keep]) - edge, 0.0) for band, edge in bands]
        return np.concatenate([r[keep], *over])

    for scale, eff, tree_eff, bw in itertools.product(
        (0.25, 0.6, 1.0, 1.5), (0.05, 0.3), (0.5, 0.9), (0.8, 1.1)
    ):
        if tree_eff != 0.5 and "eff_tree" not in names:
            continue
        if True:
            values = dict(start)
            values["eff_tree"] = tree_eff
            if "eff_LL" in names:
                values["eff_LL"] = eff
            for n in ("base_LL", "base_LL128", "base_Simple", "nvls_base"):
                values.setdefault(n, scale * t_min_ns * {"base_LL": 0.5, "base_LL128": 1.0}.get(n, 2.0))
            for n in ("B0", "B1"):
                if n in values:
                    values[n] = start[n] * bw
            keep[:], hinge[0] = True, False
            u, _ = _lm(residual, _encode(names, values), ROBUST_PCTS[0] / 100)
            keep[:] = np.abs(residual(u)) < math.log1p(OUTLIER_PCT / 100)
            hinge[0] = True
            u, c = _lm(residual, u, ROBUST_PCTS[1] / 100)
            c += 1e3 * int(np.sum(~keep))  # fewer outliers first
            if c < best_cost:
                best_u, best_cost, best_keep = u, c, keep.copy()
    assert best_u is not None
    hinge[0] = True
    keep[:] = best_keep
    best_u = _nelder_mead(lambda u: float(np.sum(residual(u) ** 2)), best_u)
    values = _rounded(_decode(names, best_u))
    for n in ("B0", "B1"):
        if n in values and not MIN_BANDWIDTH_GBPS <= values[n] <= MAX_BANDWIDTH_GBPS:
            raise UsageError(f"{log.path}: the fit needs {values[n]:.3g} GB/s: the log cannot be fitted")
    topo = parse_topology(_machine({**fixed, **values}, log.npus, base, kind, algos).spec())
    result = NcclFit(topo.spec(), 1, [], log.op, NCCL_TYPES[rows[0].type][1], log.npus, values)
    result.rows = nccl_rows(log, topo, {r.size_bytes for r in fitted_rows})
    if base is not None:
        nominal = base.with_dims(
            (base.dims[0], Dim("Switch", log.npus // base.dims[0].npus, NIC_GBPS, NIC_STEP_NS, "nccl"))
        )
        nominal = Topology(nominal.dims, "", nccl=replace(base.nccl, algos=algos) if base.nccl else None)
        result.prediction = {"topology": nominal.spec(), "rows": nccl_rows(log, nominal, set())}
    return result


def nccl_rows(log: NcclLog, topo: Topology, fitted: set[int]) -> list[dict]:
    """Measured vs model per size, with the algorithm and protocol the model picks."""
    factor = busbw_of(log.op, log.npus)
    itemsize = NCCL_TYPES[log.rows[0].type][0]
    del itemsize
    out = []
    for r, (t_ns, algo, proto) in zip(log.rows, _times_ns(topo, log.op, [r.size_bytes for r in log.rows])):
        model_us = t_ns / 1e3
        out.append(
            {
                "size_bytes": r.size_bytes,
                "fitted": r.size_bytes in fitted,
                "measured_us": r.time_us,
                "model_us": model_us,
                "time_error_pct": 100 * (model_us - r.time_us) / r.time_us,
                "measured_busbw": factor * r.size_bytes / r.time_us / 1e3,
                "model_busbw": factor * r.size_bytes / model_us / 1e3,
                "algorithm": algo,
                "protocol": proto,
            }
        )
    return out


def summary(rows: list[dict]) -> dict[str, float]:
    """Worst |error| from 64 MiB and from 64 KiB, median |error| below 64 KiB, on all and held-out rows."""
    out: dict[str, float] = {}
    for label, subset in (("all", rows), ("held_out", [r for r in rows if not r["fitted"]])):
        big = [abs(r["time_error_pct"]) for r in subset if r["size_bytes"] >= 64 * 2**20]
        mid = [abs(r["time_error_pct"]) for r in subset if r["size_bytes"] >= 64 * 2**10]
        small = [abs(r["time_error_pct"]) for r in subset if r["size_bytes"] < 64 * 2**10]
        out[f"{label}_worst_from_64MiB_pct"] = max(big) if big else math.nan
        out[f"{label}_worst_from_64KiB_pct"] = max(mid) if mid else math.nan
        out[f"{label}_median_below_64KiB_pct"] = float(np.median(small)) if small else math.nan
    return out


def parse_algos(text: str | None) -> tuple[str, ...] | None:
    """``--nccl-algo Ring,Tree`` (NCCL_ALGO's names, any case) as `NCCL_ALGOS` names; None for all."""
    if text is None:
        return None
    names = {a.lower(): a for a in NCCL_ALGOS} | {"nvls_tree": "NVLSTree", "nvlstree": "NVLSTree"}
    out = []
    for item in filter(None, (t.strip().lower() for t in text.split(","))):
        if item not in names:
            raise UsageError(f"unknown --nccl-algo {item!r}; use {', '.join(NCCL_ALGOS)} (comma-separated)")
        out.append(names[item])
    if not out:
        raise UsageError("--nccl-algo needs at least one algorithm")
    return tuple(dict.fromkeys(out))


def read_base(text: str) -> Topology:
    """``--base``: a single-node fit, as its topology string or the file `calibrate --json` wrote."""
    if text.endswith(".json") or (os.path.isfile(text) and "(" not in text):
        try:
            with open(text) as f:
                doc = json.load(f)
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read --base {text}: {exc}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("topology"), str):
            raise UsageError(f"--base {text}: not a calibrate --json file (no 'topology')")
        text = doc["topology"]
    base = parse_topology(text)
    if len(base.dims) != 1 or not base.flat:
        raise UsageError("--base must be a single-node NCCL-like fit: one nccl dim and NCCL(...)")
    return base
