"""The machine a log ran on, before any fit: GPU, links, nodes, NICs, the algorithms the library has.

Each fact comes from the first source that has it: a flag, the log (device names, host names,
device indices, NCCL INFO lines, ``NCCL_ALGO``), the GPU table (`hardware`), then a default. The
link rate of a GPU the log does not name is fitted within the bounds of its vendor's rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import UsageError
from ..nccl import Level
from ..topology import ALL_ALGOS, NCCL_ALGOS, PROTOCOLS, Dim, NcclParams, Topology
from ..units import BYTES_PER_GB
from .hardware import GPUS, gpu_of, vendor_rows
from .logs import NcclLog

NVLINK_STEP_NS = 600.0  # NCCL's NVLink step latency of LL (tuning.cc hwLatencies): dim 0's, not fitted
XGMI_STEP_NS = 800.0  # RCCL's xGMI step latency of LL (tuning.cc, tuning models 0 and 5)
NET_STEP_NS = 14000.0  # NCCL's network step latency of Ring Simple: the nominal step across nodes
DEFAULT_NIC_GBITS = 400.0
DEFAULT_NODE = 8
# NCCL's NVLS channels (nvls.cc NVLS_NCHANNELS_SM90 / _SM100): Blackwell and later run 32
NVLS_CHANNELS = {"blackwell": 32}
DEFAULT_NVLS_CHANNELS = 16


def parse_algos(text: str | None) -> tuple[str, ...] | None:
    """``--nccl-algo Ring,Tree`` or a log's ``NCCL_ALGO`` (any case, ``^X`` leaves X out); None for all."""
    if not text:
        return None
    names = {a.lower(): a for a in ALL_ALGOS} | {"nvls_tree": "NVLSTree", "nvlstree": "NVLSTree"}
    text = text.split(";")[0].rpartition(":")[2]  # NCCL_ALGO="ring;allreduce:tree": the first list
    items = [t.strip().lower() for t in text.split(",") if t.strip()]
    drop = items and items[0].startswith("^")
    out = []
    for item in items:
        item = item.lstrip("^")
        if item in ("collnet", "collnetdirect", "collnetchain", "pat"):
            continue
        if item not in names:
            raise UsageError(
                f"unknown NCCL algorithm {item!r}; use {', '.join(NCCL_ALGOS)} (comma-separated)"
            )
        out.append(names[item])
    if drop:
        return tuple(a for a in ALL_ALGOS if a not in out)
    if not out:
        raise UsageError("--nccl-algo needs at least one algorithm")
    return tuple(dict.fromkeys(out))


@dataclass(frozen=True)
class Machine:
    """What calibrate takes as given about the machine of a log.

    Attributes:
        vendor: nvidia or amd: NCCL's or RCCL's algorithms, protocols and step latencies.
        gpu: the GPU table's row name ("" if the log names no GPU calibrate knows).
        fabric: dim 0's kind: Switch (NVSwitch) or FullyConnected (a full mesh).
        per_node: NPUs of one dim-0 group: a node, or a multi-node NVLink domain.
        link_gbps: dim 0's nominal rate per GPU and direction, GB/s of 1e9 B (0: fitted).
        link_bounds: the fitted rate's bounds (the vendor's rows) when `link_gbps` is 0.
        nic_gbps: the NIC per GPU, GB/s of 1e9 B.
        algos: the algorithms the library may run.
        protocols: the protocols it has.
        sources: one line per fact: what it is and where it came from.
        nvls_channels: NCCL's NVLS channels on this GPU generation (16, Blackwell 32).
    """

    vendor: str
    gpu: str
    fabric: str
    per_node: int
    link_gbps: float
    link_bounds: tuple[float, float]
    nic_gbps: float
    algos: tuple[str, ...]
    protocols: tuple[str, ...]
    sources: list[str] = field(default_factory=list)
    nvls_channels: int = DEFAULT_NVLS_CHANNELS

    @property
    def rccl(self) -> bool:
        """RCCL (AMD) rather than NCCL."""
        return self.vendor == "amd"

    def _dims(self, npus: int, link_gbps: float, step_ns: float) -> list[tuple[str, int, float, float]]:
        """(kind, NPUs, GB/s of 2^30 B, per-step ns) of dim 0 and of the Switch of nodes above it."""
        kind = self.fabric if self.per_node > 2 else "Switch"
        dims = [(kind, min(npus, self.per_node), link_gbps * 1e9 / BYTES_PER_GB, self.step_ns)]
        if npus > self.per_node:
            dims.append(("Switch", npus // self.per_node, self.nic_gbps * 1e9 / BYTES_PER_GB, step_ns))
        return dims

    def topology(self, npus: int, params: NcclParams, link_gbps: float, step_ns: float) -> Topology:
        """The nccl topology of `npus` NPUs: dim 0 of `per_node`, a Switch of the nodes above it."""
        dims = tuple(Dim(k, n, gbps, ns, "nccl") for k, n, gbps, ns in self._dims(npus, link_gbps, step_ns))
        return Topology(dims, "", nccl=params)

    def levels(self, npus: int, link_gbps: float, step_ns: float) -> list[Level]:
        """The same machine as `nccl.levels` sees it (the fit's fast path: no topology built)."""
        return [
            Level(n, gbps * BYTES_PER_GB / 1e9, ns, k == "Switch")
            for k, n, gbps, ns in self._dims(npus, link_gbps, step_ns)
            if n > 1
        ]

    @property
    def step_ns(self) -> float:
        """Dim 0's per-step latency: the LL step of NCCL's NVLink or RCCL's xGMI table."""
        return XGMI_STEP_NS if self.rccl else NVLINK_STEP_NS


def machine_of(
    log: NcclLog,
    link_gbps: float | None = None,
    nic_gbps: float | None = None,
    gpus_per_node: int | None = None,
    algos: tuple[str, ...] | None = None,
) -> Machine:
    """The machine of a log (module doc); flags win over the log, the log over the table."""
    sources = []
    row = gpu_of(log.device) if log.device else None
    vendor = row.vendor if row else (log.vendor or "nvidia")
    if row:
        sources.append(f"GPU {row.name} (from the device name {log.device!r}): {row.source}")
    elif log.device:
        sources.append(
            f"GPU {log.device!r} is not in the table: its link rate is fitted within {vendor} bounds"
        )
    else:
        sources.append(
            f"the log names no GPU: {vendor} ({'from the log text' if log.vendor else 'assumed'}), "
            "link rate fitted within that vendor's bounds"
        )
    bounds_rows = vendor_rows(vendor) or GPUS
    bounds = (min(g.link_gbps for g in bounds_rows), max(g.link_gbps for g in bounds_rows))
    if link_gbps:
        link, bounds = link_gbps, (link_gbps, link_gbps)
        sources.append(f"link {link:g} GB/s each way (--link-gbps)")
    elif row:
        link, bounds = row.link_gbps, (row.link_gbps, row.link_gbps)
        sources.append(f"link {link:g} GB/s each way (the GPU table)")
    else:
        link = 0.0
    nic = nic_gbps or (row.nic_gbits / 8 if row else DEFAULT_NIC_GBITS / 8)
    how = "--nic-gbps" if nic_gbps else ("the platform's NIC" if row else "assumed")
    sources.append(f"NIC {nic * 8:g} Gb/s per GPU ({how})")
    fabric = row.fabric if row else ("FullyConnected" if vendor == "amd" else "Switch")
    all_npus = max(r.npus for r in log.runs or [log])
    if gpus_per_node:
        per, how = gpus_per_node, "--gpus-per-node"
    elif log.gpus_per_node:
        per, how = log.gpus_per_node, f"the log's {log.node_source}"
    else:
        per = row.node if row else DEFAULT_NODE
        per, how = min(per, all_npus), "the platform" if row else "assumed"
    if per < 1 or any(r.npus % per and r.npus > per for r in log.runs or [log]):
        raise UsageError(f"{log.path}: {per} GPUs per node does not divide the log's NPU counts")
    if all_npus > per and vendor == "nvidia":
        peak = max(row.busbw for run in log.runs or [log] for row in run.rows)
        nic_bound = 2 * (all_npus - 1) / all_npus * per * nic  # a tree's best busbw through the NICs
        if row and row.domain > row.node:
            per, how = min(all_npus, row.domain), f"{row.name}'s NVLink domain spans its trays"
        elif row is None and peak > nic_bound:
            per, how = all_npus, f"one NVLink domain: busbw {peak:g} GB/s is beyond what the NICs carry"
    sources.append(f"{per} GPUs per dim-0 group ({how})")
    protocols: tuple[str, ...] = ("LL", "Simple") if vendor == "amd" else PROTOCOLS
    if log.nccl_proto:
        wanted = {p.lower() for p in log.nccl_proto.replace("^", "").split(",")}
        keep = [p for p in protocols if (p.lower() in wanted) != log.nccl_proto.startswith("^")]
        protocols = tuple(p for p in protocols if p in keep or p == "Simple")
        sources.append(f"protocols {'+'.join(protocols)} (NCCL_PROTO={log.nccl_proto} in the log)")
    nvls = row.nvls if row else vendor == "nvidia"
    have = tuple(a for a in NCCL_ALGOS if nvls and fabric == "Switch" or not a.startswith("NVLS"))
    have += ("MSCCL",) if vendor == "amd" else ()
    if algos is None and log.nccl_algo:
        algos = parse_algos(log.nccl_algo)
        sources.append(f"algorithms {'+'.join(algos or ())} (NCCL_ALGO={log.nccl_algo} in the log)")
    chosen = tuple(a for a in (algos or have) if a in have) or ("Ring",)
    if not nvls:
        sources.append("no NVLS (NVLink SHARP needs Hopper or later and NVSwitch)")
    arch, arch_how = _generation(log, row) if vendor == "nvidia" else ("", "")
    nvls_channels = NVLS_CHANNELS.get(arch, DEFAULT_NVLS_CHANNELS)
    if any(a.startswith("NVLS") for a in chosen):
        sources.append(f"{nvls_channels} NVLS channels (NCCL's on {arch}: {arch_how})")
    return Machine(
        vendor,
        row.name if row else "",
        fabric,
        per,
        link,
        bounds,
        nic,
        chosen,
        protocols,
        sources,
        nvls_channels,
    )


def _generation(log: NcclLog, row) -> tuple[str, str]:
    """An NVIDIA log's GPU generation and why: the GPU's row, else the log's peak rate.

    A log that names no GPU gets the first NVLink generation whose links carry its peak algbw (an
    all-reduce moves S into and out of each GPU: algbw stays below the link rate).
    """
    if row:
        return row.arch, f"the GPU is {row.name}"
    peak = max(r.size_bytes / r.time_us / 1e3 for run in log.runs or [log] for r in run.rows)
    for gpu in sorted((g for g in GPUS if g.nvls), key=lambda g: g.link_gbps):
        if gpu.link_gbps >= peak:
            return gpu.arch, f"algbw {peak:.4g} GB/s needs {gpu.name}-class links"
    return "blackwell", f"algbw {peak:.4g} GB/s is beyond every NVLink generation's links"
