"""Network topology: an ordered list of dimensions, each Ring, FullyConnected or Switch.

Three ways in (see `parse_topology`): a preset name, an inline string such as
``SW(16,200,700)_SW(8,100,700)_SW(8,50,1700)`` (``KIND(npus,GB/s,ns[,algorithm])`` joined by
``_``), or an ASTRA-sim 2.x network YAML file (keys topology, npus_count, bandwidth, latency).

Bandwidth is per NPU for all links of a dim together, in GB/s with 1 GB = 2^30 bytes (ASTRA-sim's
convention). Latency is per hop, in ns.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, replace

from .errors import UsageError, shown
from .limits import (
    MAX_BANDWIDTH_GBPS,
    MAX_DIM_NPUS,
    MAX_DIMS,
    MAX_LATENCY_NS,
    MAX_MTU_BYTES,
    MAX_NPUS,
    MIN_BANDWIDTH_GBPS,
    MIN_INA_EFFICIENCY,
    in_range,
)
from .units import BYTES_PER_GB

KINDS = ("Ring", "FullyConnected", "Switch")
KIND_ALIASES = {
    "ring": "Ring",
    "fc": "FullyConnected",
    "fullyconnected": "FullyConnected",
    "sw": "Switch",
    "switch": "Switch",
}
SHORT_KIND = {"Ring": "Ring", "FullyConnected": "FC", "Switch": "SW"}
ALGORITHMS = (
    "ring",
    "direct",
    "halving_doubling",
    "ina",
    "nccl",
)  # inline and CLI also accept "hd", "ina:EFF"
ALGORITHM_ALIASES = {"hd": "halving_doubling", "halving-doubling": "halving_doubling"}
# a custom algorithm (docs/custom-algorithms.md): an MSCCL-IR file, or a directory of them picked by size
CUSTOM_PREFIXES = ("msccl:", "msccl-auto:")
HOPS = {"Ring": 1, "FullyConnected": 1, "Switch": 2}


def is_power_of_two(n: int) -> bool:
    """True for 1, 2, 4, 8, ..."""
    return n >= 1 and (n & (n - 1)) == 0


def is_custom(algorithm: str) -> bool:
    """Whether an algorithm's name is a custom one (``msccl:FILE``, ``msccl-auto:DIR``)."""
    return algorithm.startswith(CUSTOM_PREFIXES)


def check_custom(spec: str) -> None:
    """Refuse a custom algorithm's name without a path, or with characters the inline form splits at."""
    prefix, _, path = spec.partition(":")
    if f"{prefix}:" not in CUSTOM_PREFIXES or not path.strip():
        raise UsageError(f"custom algorithm {spec!r}: write msccl:FILE.xml or msccl-auto:DIR")
    if any(c in path for c in "(),"):
        raise UsageError(f"custom algorithm {spec!r}: a path with '(', ')' or ',' cannot be named here")


def default_algorithm(kind: str, npus: int) -> str:
    """The per-kind default (docs/design.md#dim-kinds): ring, direct, hd (direct if not 2^k)."""
    if kind == "Ring":
        return "ring"
    if kind == "FullyConnected":
        return "direct"
    return "halving_doubling" if is_power_of_two(npus) else "direct"


@dataclass(frozen=True)
class Dim:
    """One network dimension.

    Attributes:
        kind: Ring, FullyConnected or Switch.
        npus: NPUs along this dim.
        bandwidth_gbps: per-NPU bandwidth of all links of this dim together, GB/s (2^30 B).
        latency_ns: per-hop latency.
        algorithm: ring, direct, halving_doubling, ina (in-network aggregation, Switch dims
            only; ``ina:EFF`` also sets `efficiency`) or nccl (the NCCL-like model of `nccl`, which
            times a collective as one flat algorithm over all its dims); defaults by kind.
        efficiency: share of the bandwidth an in-switch reduction reaches (ina only; 1 otherwise).
        custom: a custom algorithm for the dim's stages, ``msccl:FILE`` or ``msccl-auto:DIR``
            ("" for none; `is_custom`); `algorithm` is then the built-in one it falls back to.
            Given as `algorithm`, it moves here and `algorithm` takes the kind's default.
    """

    kind: str
    npus: int
    bandwidth_gbps: float
    latency_ns: float
    algorithm: str = ""
    efficiency: float = 1.0
    custom: str = ""

    def __post_init__(self):
        if is_custom(self.algorithm):
            object.__setattr__(self, "custom", self.algorithm)
            object.__setattr__(self, "algorithm", "")
        if self.custom:
            check_custom(self.custom)
        if self.kind not in KINDS:
            raise UsageError(f"unknown dim kind {self.kind!r}; use one of {', '.join(KINDS)}")
        if not isinstance(self.npus, int) or not 1 <= self.npus <= MAX_DIM_NPUS:
            raise UsageError(f"dim npus must be an integer between 1 and {MAX_DIM_NPUS}, got {self.npus!r}")
        in_range("dim bandwidth", self.bandwidth_gbps, MIN_BANDWIDTH_GBPS, MAX_BANDWIDTH_GBPS, "GB/s")
        in_range("dim latency", self.latency_ns, 0, MAX_LATENCY_NS, "ns")
        algorithm = self.algorithm or default_algorithm(self.kind, self.npus)
        algorithm = ALGORITHM_ALIASES.get(algorithm, algorithm)
        efficiency = self.efficiency
        if algorithm.startswith("ina:"):
            algorithm, text = "ina", algorithm[4:]
            try:
                efficiency = float(text)
            except ValueError:
                raise UsageError(f"bad ina efficiency {text!r}: use ina:EFF with 0 < EFF <= 1") from None
        if algorithm != "ina":
            efficiency = 1.0  # the efficiency factor applies to in-switch reductions only
        in_range("ina efficiency", efficiency, MIN_INA_EFFICIENCY, 1.0)
        if algorithm == "ina" and self.kind != "Switch":
            raise UsageError(f"ina (in-network aggregation) needs a Switch dim, got a {self.kind} dim")
        if algorithm not in ALGORITHMS:
            raise UsageError(f"unknown algorithm {algorithm!r}; use one of {', '.join(ALGORITHMS)}")
        if algorithm == "halving_doubling" and not is_power_of_two(self.npus):
            raise UsageError(
                f"halving_doubling needs a power-of-two dim, got {self.npus} NPUs on a {self.kind} dim"
            )
        object.__setattr__(self, "algorithm", algorithm)
        object.__setattr__(self, "efficiency", float(efficiency))

    @property
    def algorithm_label(self) -> str:
        """The algorithm as the inline syntax writes it: ``hd``, ``ina:0.9``, ``ring``, ``msccl:F``..."""
        if self.custom:
            return self.custom
        if self.algorithm == "halving_doubling":
            return "hd"
        if self.algorithm == "ina" and self.efficiency != 1.0:
            return f"ina:{self.efficiency:g}"
        return self.algorithm

    @property
    def hops(self) -> int:
        """Hops per message: 1 on Ring and FullyConnected links, 2 through a Switch."""
        return HOPS[self.kind]

    @property
    def bandwidth_bytes_per_ns(self) -> float:
        """Per-NPU bandwidth in bytes per ns (GB/s with 1 GB = 2^30 B)."""
        return self.bandwidth_gbps * BYTES_PER_GB / 1e9

    def spec(self) -> str:
        """The inline form of this dim, e.g. ``SW(8,100,700,hd)``."""
        return (
            f"{SHORT_KIND[self.kind]}({self.npus},{self.bandwidth_gbps:g},{self.latency_ns:g},"
            f"{self.algorithm_label})"
        )


PROTOCOLS = ("LL", "LL128", "Simple")
NCCL_ALGOS = ("Ring", "Tree", "NVLS", "NVLSTree")  # NCCL's; the default
ALL_ALGOS = (*NCCL_ALGOS, "MSCCL")  # and RCCL's one-shot (`nccl`)
# The most of the wire a protocol can carry: LL sends 4 B of data per 8 B (a flag per word), LL128
# 120 B per 128 B line; Simple all of it.
PROTOCOL_CAPS = (0.5, 120 / 128, 1.0)
MAX_CHANNELS = 64  # NCCL's MAXCHANNELS


@dataclass(frozen=True)
class NcclParams:
    """Parameters of the NCCL-like model (`nccl`), written ``NCCL(...)`` in a topology.

    Attributes:
        base_ns: base latency of a collective per protocol (LL, LL128, Simple), ns.
        efficiency: share of the links' nominal rate each protocol reaches (at most LL 1/2,
            LL128 120/128, Simple 1: the bytes each puts on the wire besides its flags).
        nvls_base_ns: base latency of NVLS and NVLS-Tree (Simple protocol), ns.
        nvls_efficiency: NVLS all-reduce algbw as a share of dim 0's bandwidth.
        nvls_chunk_ns: what each NVLS chunk costs a channel besides its bytes, ns (`nccl` doc:
            NCCL's NVLS chunks shrink at smaller sizes, and the rate with them).
        nvls_channels: NCCL's NVLS channels (``NVLS_NCHANNELS``: 16 on Hopper, 32 on Blackwell).
        algos: the algorithms NCCL may pick (``NCCL_ALGO``); all by default.
        tree_efficiency: share of the across-node bandwidth a tree (Tree, NVLS-Tree) reaches.
        net_efficiency: share of the NICs' (dims 1 and up) nominal rate any algorithm reaches.
        channels: the channels NCCL spreads a collective over (`nccl` doc: fewer at small sizes).
        protocols: the protocols the library has (RCCL on gfx94x: no LL128).
        rccl: AMD's RCCL: its per-step latencies, no tree correction.
        uses: ``(algorithm, protocol, lo_bytes, hi_bytes)``, ascending: the pair a log shows the
            library running from one size to another (`nccl.choose`); none: the fastest pair.
    """

    base_ns: tuple[float, float, float] = (6600.0, 14000.0, 8400.0)  # NCCL's Ring base latencies
    efficiency: tuple[float, float, float] = (0.5, 0.92, 1.0)  # NCCL's Ring LL and LL128 factors
    nvls_base_ns: float = 25000.0
    nvls_efficiency: float = 0.85
    algos: tuple[str, ...] = NCCL_ALGOS
    tree_efficiency: float = 1.0
    net_efficiency: float = 1.0
    channels: float = 16.0
    protocols: tuple[str, ...] = PROTOCOLS
    rccl: bool = False
    uses: tuple[tuple[str, str, int, int], ...] = ()
    nvls_chunk_ns: float = 500.0
    nvls_channels: int = 16

    def __post_init__(self):
        if len(self.base_ns) != 3 or len(self.efficiency) != 3:
            raise UsageError("NCCL(...) needs a base latency and an efficiency for LL, LL128 and Simple")
        for proto, base, eff, cap in zip(PROTOCOLS, self.base_ns, self.efficiency, PROTOCOL_CAPS):
            in_range(f"NCCL {proto} base latency", base, 0, MAX_LATENCY_NS, "ns")
            in_range(f"NCCL {proto} efficiency", eff, MIN_INA_EFFICIENCY, cap)
        in_range("NCCL NVLS base latency", self.nvls_base_ns, 0, MAX_LATENCY_NS, "ns")
        in_range("NCCL NVLS efficiency", self.nvls_efficiency, MIN_INA_EFFICIENCY, 1.0)
        in_range("NCCL NVLS chunk cost", self.nvls_chunk_ns, 0, MAX_LATENCY_NS, "ns")
        in_range("NCCL NVLS channels", self.nvls_channels, 1, MAX_CHANNELS)
        in_range("NCCL tree efficiency", self.tree_efficiency, MIN_INA_EFFICIENCY, 1.0)
        in_range("NCCL net efficiency", self.net_efficiency, MIN_INA_EFFICIENCY, 1.0)
        in_range("NCCL channels", self.channels, 1.0, MAX_CHANNELS)
        if not self.algos or any(a not in ALL_ALGOS for a in self.algos):
            raise UsageError(f"NCCL algos must be some of {'+'.join(ALL_ALGOS)}, got {'+'.join(self.algos)}")
        if "Simple" not in self.protocols or any(p not in PROTOCOLS for p in self.protocols):
            raise UsageError(
                f"NCCL protocols must be Simple and some of LL, LL128, got {'+'.join(self.protocols)}"
            )
        last = 0
        for algo, proto, lo, hi in self.uses:
            if algo not in ALL_ALGOS or proto not in PROTOCOLS or not last < lo <= hi:
                raise UsageError(
                    f"NCCL use {algo.lower()}.{proto.lower()}@{lo}-{hi}: name an algorithm of "
                    f"{'+'.join(a.lower() for a in ALL_ALGOS)}, a protocol of "
                    f"{'+'.join(p.lower() for p in PROTOCOLS)}, and ascending sizes 0 < LO <= HI"
                )
            last = hi

    def spec(self) -> str:
        """``NCCL(ll=BASE:EFF,ll128=BASE:EFF,simple=BASE:EFF,nvls=BASE:EFF:CHUNK[,tree=EFF]...)``."""
        items = [f"{p.lower()}={b:g}:{e:g}" for p, b, e in zip(PROTOCOLS, self.base_ns, self.efficiency)]
        items.append(f"nvls={self.nvls_base_ns:g}:{self.nvls_efficiency:g}:{self.nvls_chunk_ns:g}")
        if self.nvls_channels != NcclParams.nvls_channels:
            items.append(f"nvch={self.nvls_channels:d}")
        if self.tree_efficiency != 1.0:
            items.append(f"tree={self.tree_efficiency:g}")
        if self.net_efficiency != 1.0:
            items.append(f"net={self.net_efficiency:g}")
        if self.channels != NcclParams.channels:
            items.append(f"ch={self.channels:g}")
        if self.protocols != PROTOCOLS:
            items.append("protos=" + "+".join(p.lower() for p in self.protocols))
        if self.rccl:
            items.append("rccl")
        if self.algos != NCCL_ALGOS:
            items.append("algos=" + "+".join(a.lower() for a in self.algos))
        if self.uses:
            items.append(
                "use=" + "+".join(f"{a.lower()}.{p.lower()}@{lo}-{hi}" for a, p, lo, hi in self.uses)
            )
        return f"NCCL({','.join(items)})"

    @classmethod
    def parse(cls, text: str) -> NcclParams:
        """The inside of ``NCCL(...)``.

        Keys: ``ll``, ``ll128``, ``simple`` (``=BASE_NS:EFF``), ``nvls`` (``=BASE_NS:EFF[:CHUNK_NS]``),
        ``nvch=N``, ``tree=EFF``, ``net=EFF``, ``ch=N``, ``protos=ll+simple``, ``rccl``,
        ``algos=ring+tree``, ``use=ALGO.PROTO@LO-HI+...``.
        """
        base, eff = list(cls.base_ns), list(cls.efficiency)
        nvls = [cls.nvls_base_ns, cls.nvls_efficiency, cls.nvls_chunk_ns]
        values: dict = {}
        names = {a.lower(): a for a in ALL_ALGOS}
        seen: set[str] = set()
        for field in filter(None, (f.strip() for f in text.split(","))):
            key, _, value = field.partition("=")
            key = key.strip().lower()
            if key in seen:
                raise UsageError(f"NCCL(...) gives {key} twice; keep one")
            seen.add(key)
            if key in ("algos", "protos"):
                table = names if key == "algos" else {p.lower(): p for p in PROTOCOLS}
                try:
                    values[key] = tuple(table[a.strip().lower()] for a in value.split("+"))
                except KeyError:
                    raise UsageError(f"NCCL {key} must be some of {'+'.join(table)}, got {value!r}") from None
            elif key in ("tree", "net", "ch"):
                values[key] = _number(value, key, field)
            elif key == "nvch":
                count = _number(value, key, field)
                if not math.isfinite(count) or count != int(count):
                    raise UsageError(f"NCCL nvch must be a whole number of channels, got {value!r}")
                values[key] = int(count)
            elif key == "rccl":
                values[key] = value.strip() in ("", "1")
            elif key == "use":
                values[key] = tuple(_use(item, field) for item in value.split("+"))
            elif key in ("ll", "ll128", "simple", "nvls"):
                lat_text, colon, rest = value.partition(":")
                if not colon:
                    raise UsageError(f"NCCL {key} takes BASE_NS:EFF (e.g. {key}=5000:0.3), got {field!r}")
                eff_text, _, chunk_text = rest.partition(":")
                lat, efficiency = _number(lat_text, key, field), _number(eff_text or "nan", key, field)
                if key == "nvls":
                    chunk = _number(chunk_text, key, field) if chunk_text else cls.nvls_chunk_ns
                    nvls = [lat, efficiency, chunk]
                elif chunk_text:
                    raise UsageError(f"NCCL {key} takes BASE_NS:EFF, got {value!r}")
                else:
                    i = ("ll", "ll128", "simple").index(key)
                    base[i], eff[i] = lat, efficiency
            else:
                raise UsageError(
                    f"unknown NCCL(...) key {key!r}; use ll, ll128, simple, nvls, nvch, tree, net, ch, "
                    "protos, rccl, algos or use"
                )
        return cls(
            (base[0], base[1], base[2]),
            (eff[0], eff[1], eff[2]),
            nvls[0],
            nvls[1],
            values.get("algos", NCCL_ALGOS),
            values.get("tree", 1.0),
            values.get("net", 1.0),
            values.get("ch", cls.channels),
            values.get("protos", PROTOCOLS),
            values.get("rccl", False),
            values.get("use", ()),
            nvls[2],
            values.get("nvch", cls.nvls_channels),
        )


def _use(text: str, field: str) -> tuple[str, str, int, int]:
    """``ALGO.PROTO@LO-HI`` (bytes) of an NCCL(...) use."""
    pair, _, sizes = text.strip().partition("@")
    algo, _, proto = pair.partition(".")
    lo, _, hi = sizes.partition("-")
    algos = {a.lower(): a for a in ALL_ALGOS}
    protos = {p.lower(): p for p in PROTOCOLS}
    key_a, key_p = algo.strip().lower(), proto.strip().lower()
    if key_a not in algos or key_p not in protos or not lo.strip().isdigit() or not hi.strip().isdigit():
        raise UsageError(
            f"bad NCCL use {text.strip()!r} in {field!r}: write ALGO.PROTO@LO-HI in bytes, e.g. "
            "nvls.simple@8-512"
        )
    return algos[key_a], protos[key_p], int(lo), int(hi)


@dataclass(frozen=True)
class Port:
    """A port that several dims share: their traffic leaves (and enters) the NPU through one NIC.

    Attributes:
        dims: the dims whose links all pass through this port (two or more).
        bandwidth_gbps: the port's rate in each direction, GB/s (2^30 B).
    """

    dims: tuple[int, ...]
    bandwidth_gbps: float

    def __post_init__(self):
        if len(self.dims) < 2 or len(set(self.dims)) != len(self.dims):
            raise UsageError(f"a shared port needs two or more distinct dims, got {list(self.dims)}")
        in_range("port bandwidth", self.bandwidth_gbps, MIN_BANDWIDTH_GBPS, MAX_BANDWIDTH_GBPS, "GB/s")

    @property
    def bandwidth_bytes_per_ns(self) -> float:
        """The port's rate in bytes per ns."""
        return self.bandwidth_gbps * BYTES_PER_GB / 1e9

    def spec(self) -> str:
        """The inline form, e.g. ``NIC(1+2,46.57)``."""
        return f"NIC({'+'.join(map(str, self.dims))},{self.bandwidth_gbps:g})"


@dataclass(frozen=True)
class Topology:
    """An ordered list of dims; dim 0 is the first (in the paper, the fastest).

    `ports` are NICs that several dims share (`Port`); the dims' own links stay as they are, and
    the port's rate bounds their traffic together under a sharing rule (`network`). `mtu_bytes`
    is the packet of its links (an inline ``MTU(9000)`` item; 0: not given), which the packet rule
    takes where ``--mtu`` is not given (`timing.packet.mtu_of`).
    """

    dims: tuple[Dim, ...]
    name: str = ""
    ports: tuple[Port, ...] = ()
    nccl: NcclParams | None = None
    mtu_bytes: int = 0

    def __post_init__(self):
        if not self.dims:
            raise UsageError("a topology needs at least one dim")
        flat = [d.algorithm == "nccl" for d in self.dims if d.npus > 1]
        if any(flat) and not all(flat):
            raise UsageError("nccl dims time a collective as one flat algorithm: make every dim nccl or none")
        if self.nccl is not None and not any(flat):
            raise UsageError("an NCCL(...) item needs nccl dims, e.g. SW(8,400,600,nccl)_NCCL(...)")
        if any(flat) and self.nccl is None:
            object.__setattr__(self, "nccl", NcclParams())
        if len(self.dims) > MAX_DIMS:
            raise UsageError(f"a topology has at most {MAX_DIMS} dims, got {len(self.dims)}")
        if self.npus > MAX_NPUS:
            raise UsageError(f"a topology has at most {MAX_NPUS} NPUs, got {self.npus}")
        shared = [d for port in self.ports for d in port.dims]
        if any(not 0 <= d < len(self.dims) for d in shared):
            raise UsageError(f"a shared port names a dim that is not there (dims 0..{len(self.dims) - 1})")
        if len(shared) != len(set(shared)):
            raise UsageError("a dim can leave the NPU through one shared port only")
        if self.mtu_bytes:
            in_range("MTU", self.mtu_bytes, 1, MAX_MTU_BYTES, "B")

    def port_of(self, dim: int) -> int | None:
        """The index of the port dim `dim` shares, or None."""
        return next((i for i, port in enumerate(self.ports) if dim in port.dims), None)

    @property
    def npus(self) -> int:
        """Total NPUs: the product of the dims' sizes."""
        return math.prod(d.npus for d in self.dims)

    def group_npus(self, dims) -> int:
        """NPUs in one group spanned by `dims` (the NPUs a collective on those dims involves)."""
        return math.prod(self.dims[d].npus for d in dims)

    def group_strides(self, dims) -> dict[int, int]:
        """Mixed-radix strides of a group's ranks over `dims`, the lowest dim varying fastest."""
        strides, stride = {}, 1
        for d in sorted(dims):
            strides[d] = stride
            stride *= self.dims[d].npus
        return strides

    @property
    def shape(self) -> tuple[int, ...]:
        """NPUs per dim."""
        return tuple(d.npus for d in self.dims)

    @property
    def flat(self) -> bool:
        """Whether collectives are timed by the NCCL-like model (nccl dims)."""
        return self.nccl is not None

    def spec(self) -> str:
        """The inline form, which `parse_topology` reads back to an equal topology."""
        items = [d.spec() for d in self.dims] + [p.spec() for p in self.ports]
        items += [f"MTU({self.mtu_bytes})"] if self.mtu_bytes else []
        return "_".join(items + ([self.nccl.spec()] if self.nccl is not None else []))

    def label(self) -> str:
        """The preset name when there is one, else the inline form."""
        return self.name or self.spec()

    def with_dims(self, dims) -> Topology:
        """A copy with other dims (and no preset name).

        Ports stay if their dims are still there; NCCL parameters stay while a dim is nccl.
        """
        dims = tuple(dims)
        ports = self.ports if len(dims) == len(self.dims) else ()
        nccl = self.nccl if any(d.algorithm == "nccl" for d in dims) else None
        return Topology(dims, "", ports, nccl, self.mtu_bytes)

    def with_overrides(self, bandwidth_gbps=None, latency_ns=None, algorithms=None) -> Topology:
        """A copy with per-dim bandwidth, latency or algorithm replaced (None keeps a value).

        A custom algorithm (``msccl:FILE``) keeps the dim's built-in one to fall back to; given
        once for a topology of several dims it is every dim's (docs/custom-algorithms.md).
        """
        dims = list(self.dims)
        if algorithms is not None:
            algorithms = list(algorithms)
            if len(algorithms) == 1 and len(dims) > 1 and algorithms[0] and is_custom(algorithms[0]):
                algorithms = algorithms * len(dims)
            dims = [
                d if not v else replace(d, custom=v) if is_custom(v) else replace(d, algorithm=v, custom="")
                for d, v in zip(dims, _as_long(algorithms, len(dims), "algorithm"))
            ]
            algorithms = None
        for field, values in (
            ("bandwidth_gbps", bandwidth_gbps),
            ("latency_ns", latency_ns),
            ("algorithm", algorithms),
        ):
            if values is None:
                continue
            dims = [
                d if v is None else replace(d, **{field: v})
                for d, v in zip(dims, _as_long(values, len(dims), field))
            ]
        changed = Topology(
            tuple(dims),
            self.name,
            self.ports,
            self.nccl if any(d.algorithm == "nccl" for d in dims) else None,
            self.mtu_bytes,
        )
        return changed if changed == self else self.with_dims(dims)

    def free(self) -> Topology:
        """The same NPUs with communication all but free: 1 PB/s, no latency, no shared port.

        What a pipeline's bubble is measured on (`run.priced.price_all`).
        """
        dims = len(self.dims)
        return replace(self.with_overrides([1e6] * dims, [0.0] * dims), ports=())


def _as_long(values, n: int, field: str) -> list:
    """Per-dim override values, one per dim, or one line."""
    values = list(values)
    if len(values) != n:
        raise UsageError(f"{len(values)} values given for {field} but the topology has {n} dims")
    return values


def _preset(spec: str, name: str) -> Topology:
    return replace(parse_inline(spec), name=name)


PRESETS = {
    # The paper's four 1024-NPU topologies (docs/design.md#the-papers-systems).
    "3D-SW_SW_SW_hetero": "SW(16,200,700)_SW(8,100,700)_SW(8,50,1700)",
    "3D-FC_Ring_SW": "FC(8,175,700)_Ring(16,100,700)_SW(8,50,1700)",
    "4D-Ring_SW_SW_SW": "Ring(4,250,20)_SW(4,200,700)_SW(8,100,700)_SW(8,50,1700)",
    "4D-Ring_FC_Ring_SW": "Ring(4,375,20)_FC(8,175,700)_Ring(4,150,700)_SW(8,100,1700)",
    # Platforms the paper names (sources in SOURCES; 1 GB = 2^30 B, so 450e9 B/s = 419.1 GB/s).
    "HGX-H100-SW_SW_SW": "SW(8,419.1,700)_SW(32,46.57,1700)_SW(4,46.57,1700)_NIC(1+2,46.57)",
    "Zion-FC_SW": "FC(8,175,700)_SW(128,46.57,1700)",
    "TPUv4-4x4x4": "Ring(4,93.13,500)_Ring(4,93.13,500)_Ring(4,93.13,500)",
    "TPUv4-16x16x16": "Ring(16,93.13,500)_Ring(16,93.13,500)_Ring(16,93.13,500)",
    # ASTRA-sim's 2023 tutorial point (docs/design.md#reference-numbers): 512 NPUs, hd everywhere.
    "tutorial-8x8x8": "SW(8,50,1)_SW(8,50,1)_SW(8,50,1)",
    # Laptop sizes. Equal bandwidth per dim makes the baseline overload dim 0.
    "2x2x2": "Ring(2,100,20)_FC(2,100,700)_SW(2,100,700)",
    "4x4x4": "Ring(4,100,20)_FC(4,100,700)_SW(4,100,700)",
    "2x2x2-hetero": "SW(2,200,700)_SW(2,100,700)_SW(2,50,1700)",
    "4x2": "Ring(4,100,20)_SW(2,50,700)",
    "8": "Ring(8,100,20)",
}
DESCRIPTIONS = {
    "3D-SW_SW_SW_hetero": "paper: HGX-H100-like, 3 switch levels",
    "3D-FC_Ring_SW": "paper: Zion-like FC package, ring, scale-out switch",
    "4D-Ring_SW_SW_SW": "paper: 4 levels",
    "4D-Ring_FC_Ring_SW": "paper: 4 levels",
    "HGX-H100-SW_SW_SW": "HGX/DGX H100 SuperPOD: NVSwitch x8, rail leaf x32 nodes, spine x4 units",
    "Zion-FC_SW": "Facebook Zion: 8 OAMs fully connected, scale-out switch",
    "TPUv4-4x4x4": "TPU v4 cube: 64 chips, 3D torus",
    "TPUv4-16x16x16": "TPU v4 pod: 4096 chips, 3D torus (OCS-closed wraparound)",
    "tutorial-8x8x8": "ASTRA-sim 2023 tutorial (1 GiB AR check)",
    "2x2x2": "laptop, 8 ranks, equal bandwidth",
    "4x4x4": "laptop/cluster, 64 ranks, equal bandwidth",
    "2x2x2-hetero": "laptop, 8 ranks, 200/100/50 GB/s",
    "4x2": "laptop, 8 ranks, two dims",
    "8": "laptop, 8 ranks, one ring",
}

SOURCES = {
    "HGX-H100-SW_SW_SW": (
        "dim 0: NVLink 4 through NVSwitch, 18 links = 450 GB/s (1e9 B/s) per direction per GPU, 8 GPUs "
        "(NVIDIA H100 datasheet, HGX H100 / DGX H100 user guide); dim 1: one ConnectX-7 400 Gb/s = 50e9 B/s "
        "per GPU into its rail's leaf switch, 32 nodes per scalable unit; dim 2: non-blocking spine, 4 "
        "scalable units (NVIDIA DGX SuperPOD H100 reference architecture); dims 1 and 2 leave the GPU "
        "through that one NIC, NIC(1+2,46.57). Latencies are the Themis paper's (700 ns in-node switch, "
        "1700 ns scale-out), not measured."
    ),
    "Zion-FC_SW": (
        "8 OAM accelerators fully connected in the node (Facebook Zion, OCP Summit 2019; OCP OAM spec: "
        "7 links per module); FC bandwidth and latency are the Themis paper's FC package (175 GB/s, "
        "700 ns); scale-out assumed one 400 Gb/s NIC per accelerator (50e9 B/s) into a 128-node switch."
    ),
    "TPUv4-4x4x4": (
        "TPU v4 (Jouppi et al., ISCA 2023): 6 ICI links per chip, a 4x4x4 cube per rack, cubes joined by "
        "optical circuit switches into a torus; a link carries 50e9 B/s per direction (400 Gb/s), two "
        "links per dim = 100e9 B/s = 93.13 GB/s; 500 ns per hop assumed (sub-microsecond neighbours)."
    ),
    "TPUv4-16x16x16": "as TPUv4-4x4x4; 64 cubes = 4096 chips in a 16x16x16 torus (the full pod).",
}

_SHAPE = re.compile(r"^[1-9][0-9]{0,6}(x[1-9][0-9]{0,6}){0,15}$")
GENERIC_DIMS = ("Ring({},100,20)", "FC({},100,700)", "SW({},100,700)")  # a generic shape's dims 0, 1, 2+
MAX_YAML_DEPTH = 32  # an ASTRA-sim network file is two levels deep
MAX_TOPOLOGY_CHARS = 4096  # 16 dims, NIC(...) and NCCL(...) items fit many times over


_INLINE_DIM = re.compile(r"^\s*([A-Za-z]+)\s*\(([^()]*)\)\s*$")


def _number(text: str, what: str, dim_text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise UsageError(f"bad {what} {text.strip()!r} in topology dim {dim_text!r}") from None


def _port(item: str, fields: str) -> Port:
    """``NIC(1+2,46.57)``: dims 1 and 2 share a port of 46.57 GB/s."""
    parts = [f.strip() for f in fields.split(",")]
    if len(parts) != 2:
        raise UsageError(f"shared port {shown(item)} needs DIMS,GB/s, e.g. NIC(1+2,46.57)")
    dims = []
    for text in parts[0].split("+"):
        if not text.strip().isdigit():
            raise UsageError(
                f"bad dim {text.strip()!r} in shared port {shown(item)}: use dim indices like 1+2"
            )
        dims.append(int(text))
    return Port(tuple(dims), _number(parts[1], "GB/s", item))


def _items(spec: str) -> list[str]:
    """The ``_``-joined items of an inline topology (a custom algorithm's path may hold ``_``)."""
    items, depth, current = [], 0, ""
    for ch in spec:
        depth += (ch == "(") - (ch == ")")
        if ch == "_" and depth == 0:
            items.append(current)
            current = ""
        else:
            current += ch
    return [*items, current]


def parse_inline(spec: str) -> Topology:
    """Parse ``KIND(npus,GB/s,ns[,algorithm])`` items joined by ``_``, then ``NIC(d1+d2,GB/s)`` ports.

    An ``NCCL(...)`` item gives the NCCL-like model's parameters (`NcclParams`) of nccl dims; an
    ``MTU(BYTES)`` item after the dims, the links' packet (`Topology.mtu_bytes`).
    """
    dims, ports = [], []
    nccl = None
    mtu_bytes = 0
    for item in _items(spec):
        match = _INLINE_DIM.match(item)
        if not match:
            raise UsageError(
                f"malformed topology dim {shown(item)}: expected KIND(npus,GB/s,ns), e.g. SW(8,100,700)"
            )
        if match.group(1).upper() == "NCCL":
            if nccl is not None:
                raise UsageError("a topology has at most one NCCL(...) item")
            nccl = NcclParams.parse(match.group(2))
            continue
        if match.group(1).upper() == "NIC":
            ports.append(_port(item, match.group(2)))
            continue
        if match.group(1).upper() == "MTU":
            if mtu_bytes:
                raise UsageError("a topology has at most one MTU(...) item")
            mtu_bytes = _mtu(item, match.group(2))
            continue
        if ports or mtu_bytes:
            raise UsageError(
                f"topology dim {shown(item)} comes after a shared port or an MTU: write the NIC(...) "
                "and MTU(...) items last"
            )
        kind = KIND_ALIASES.get(match.group(1).lower())
        if kind is None:
            raise UsageError(f"unknown dim kind {match.group(1)!r} in {shown(item)}; use Ring, FC or SW")
        fields = [f.strip() for f in match.group(2).split(",")]
        if len(fields) not in (3, 4):
            raise UsageError(f"topology dim {shown(item)} needs 3 or 4 fields: npus, GB/s, ns[, algorithm]")
        npus = _number(fields[0], "npus", item)
        if not math.isfinite(npus) or npus != int(npus):
            raise UsageError(f"npus must be an integer in topology dim {shown(item)}")
        algorithm = fields[3] if len(fields) == 4 else ""
        algorithm = algorithm if is_custom(algorithm) else algorithm.lower()
        dims.append(
            Dim(kind, int(npus), _number(fields[1], "GB/s", item), _number(fields[2], "ns", item), algorithm)
        )
    if not dims:
        raise UsageError("a topology needs at least one dim besides NCCL(...), NIC(...) and MTU(...)")
    if nccl is not None:  # a custom algorithm on nccl dims falls back to nccl (`Topology.spec` writes it so)
        dims = [replace(d, algorithm="nccl") if d.custom else d for d in dims]
    return Topology(tuple(dims), "", tuple(ports), nccl, mtu_bytes)


def _mtu(item: str, text: str) -> int:
    """``MTU(9000)``: the links' packet, a whole number of bytes."""
    if not text.strip().isdigit():
        raise UsageError(f"{shown(item)} needs a whole number of bytes, e.g. MTU(9000)")
    mtu_bytes = int(text)
    in_range("MTU", mtu_bytes, 1, MAX_MTU_BYTES, "B")
    return mtu_bytes


def parse_yaml(path: str) -> Topology:
    """Read an ASTRA-sim 2.x network YAML (topology, npus_count, bandwidth, latency lists)."""
    import yaml  # only YAML topologies pay for it

    class Loader(yaml.SafeLoader):
        """PyYAML's safe loader without aliases (a YAML bomb expands them) and with a depth limit."""

        depth = 0

        def compose_node(self, parent, index):
            if self.check_event(yaml.events.AliasEvent):
                mark = self.peek_event().start_mark
                raise yaml.YAMLError(f"line {mark.line + 1}: aliases (*name) are not allowed in a topology")
            self.depth += 1
            if self.depth > MAX_YAML_DEPTH:
                raise yaml.YAMLError(f"nested more than {MAX_YAML_DEPTH} levels deep")
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def construct_mapping(self, node, deep=False):
            seen = set()
            for key, _ in node.value:
                if not isinstance(key, yaml.ScalarNode):
                    continue
                if key.value in seen:  # (PyYAML keeps the last value, silently)
                    raise yaml.YAMLError(
                        f"line {key.start_mark.line + 1}: key {shown(key.value)} appears twice; give it once"
                    )
                seen.add(key.value)
            return super().construct_mapping(node, deep)

    try:
        with open(path) as f:
            doc = yaml.load(f, Loader=Loader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise UsageError(f"cannot read topology file {path}: {str(exc).splitlines()[0]}") from None
    keys = ("topology", "npus_count", "bandwidth", "latency")
    if not isinstance(doc, dict) or any(k not in doc for k in keys):
        raise UsageError(f"{path}: an ASTRA-sim network YAML needs the keys {', '.join(keys)}")
    lists = [doc[k] if isinstance(doc[k], list) else [doc[k]] for k in keys]
    if len({len(v) for v in lists}) != 1:
        raise UsageError(f"{path}: topology, npus_count, bandwidth and latency differ in length")
    dims = []
    for kind_text, npus, bw, lat in zip(*lists):
        kind = KIND_ALIASES.get(str(kind_text).lower())
        if kind is None:
            raise UsageError(f"{path}: unknown topology kind {shown(str(kind_text))}; use Ring, FC or SW")
        if isinstance(npus, bool) or not isinstance(npus, int):
            raise UsageError(f"{path}: npus_count entries must be integers, got {shown(str(npus))}")
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in (bw, lat)):
            raise UsageError(f"{path}: bandwidth and latency entries must be numbers")
        if any(isinstance(v, int) and abs(v) > 2**53 for v in (npus, bw, lat)):
            raise UsageError(f"{path}: a number of the topology is out of range (at most 2^53)")
        dims.append(Dim(kind, npus, float(bw), float(lat)))
    return Topology(tuple(dims), os.path.basename(path))


def generic_shape(text: str) -> Topology:
    """A shape that is not a preset, ``AxBxC...``: a Ring, then a FullyConnected, then Switch dims.

    Every dim has 100 GB/s; the Ring 20 ns per hop, the others 700 ns (the laptop presets'
    numbers): ``8x8x8`` is ``Ring(8,100,20)_FC(8,100,700)_SW(8,100,700)``.
    """
    sizes = [int(n) for n in text.split("x")]
    specs = [GENERIC_DIMS[min(d, len(GENERIC_DIMS) - 1)].format(n) for d, n in enumerate(sizes)]
    return Topology(parse_inline("_".join(specs)).dims, text)


def links_per_npu(dim: Dim) -> int:
    """Outgoing links of one NPU on a dim: 2 on a Ring (both ways), P-1 FullyConnected, 1 to a Switch."""
    return {"Ring": 2, "FullyConnected": dim.npus - 1}.get(dim.kind, 1)


def from_link_bandwidths(topology: Topology) -> Topology:
    """A topology whose bandwidths were given per link and direction (ASTRA-sim 2.x), per NPU.

    Every dim's bandwidth is multiplied by `links_per_npu`: FC8 at 50 GB/s per link is 350 GB/s.
    """
    dims = tuple(replace(d, bandwidth_gbps=d.bandwidth_gbps * links_per_npu(d)) for d in topology.dims)
    return replace(topology, dims=dims)


@dataclass(frozen=True)
class FitFile:
    """A fit that ``calibrate --json`` wrote, as ``-t`` reads it.

    Attributes:
        topology: the fitted topology (what ``-t`` takes).
        chunks: the chunk count the fit assumes: ``-c`` when the command line gives none.
        args: further options the fit needs (none for calibrate's fits: the topology says all).
    """

    topology: str
    chunks: int
    args: tuple[str, ...] = ()


MAX_FIT_BYTES = 64 * 2**20


def read_fit(path: str) -> FitFile | None:
    """The fit in a ``calibrate --json`` file, or None for a path that is no JSON file.

    A JSON file that is no fit (no ``topology`` string, a bad ``chunks``) gets one line.
    """
    if not (path.endswith(".json") or os.path.isfile(path)):
        return None
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FIT_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"cannot read topology file {path}: {exc.strerror or exc}") from None
    if not raw.lstrip()[:1] == b"{":
        return None
    import json  # only fit files pay for it

    try:
        doc = json.loads(raw.decode("utf-8")) if len(raw) <= MAX_FIT_BYTES else None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        why = str(exc).splitlines()[0] if not isinstance(exc, RecursionError) else "nested too deep"
        raise UsageError(f"{path}: not a calibrate --json file ({why})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("topology"), str):
        raise UsageError(f"{path}: a JSON file but not a calibrate --json fit (no 'topology' string)")
    chunks = doc.get("chunks", 1)
    args = doc.get("args", [])
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise UsageError(f"{path}: 'chunks' must be a whole number >= 1, got {chunks!r}")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise UsageError(f"{path}: 'args' must be a list of option strings")
    return FitFile(doc["topology"], chunks, tuple(args))


def parse_topology(text: str) -> Topology:
    """A preset name, an inline string, a ``calibrate --json`` fit or a path to an ASTRA-sim YAML file."""
    if len(text) > MAX_TOPOLOGY_CHARS:
        raise UsageError(f"topology {shown(text)} is too long (at most {MAX_TOPOLOGY_CHARS} characters)")
    if text in PRESETS:
        return _preset(PRESETS[text], text)
    fit = read_fit(text) if not text.endswith((".yml", ".yaml")) else None
    if fit is not None:
        parsed = parse_inline(fit.topology)
        return replace(parsed, name=os.path.basename(text))
    if text.endswith((".yml", ".yaml")) or os.path.isfile(text):
        return parse_yaml(text)
    if _SHAPE.match(text):
        return generic_shape(text)
    if "(" not in text:
        raise UsageError(
            f"unknown topology preset {shown(text)}; see `themis-mpi topologies`, or write "
            "KIND(npus,GB/s,ns)_... or give a .yml file"
        )
    return parse_inline(text)
