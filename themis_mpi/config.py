"""How a run is carried out, whatever it runs: `RunConfig` and its defaults.

Every transport, the engine and the policies' context read the same frozen `RunConfig`; it is
checked once, when it is made. Policy names are not checked here (the registry sits above this
layer): the sweep that resolves them (`run.sweep`) and the engine that makes them do.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .cost import ASTRA_SIM_1_0, ASTRA_SIM_2, NO_ENDPOINT, CostModels, Endpoint, check_compat
from .errors import UsageError
from .limits import (
    MAX_LINK_SCALE,
    MAX_SIZE_BYTES,
    MAX_TIME_NS,
    MAX_TIME_SCALE,
    MAX_TIMEOUT_S,
    MIN_LINK_SCALE,
    in_range,
)
from .timing.packet import check_mtu
from .timing.rules import DEFAULT_RULE, IDEAL, PACKET, STORE_FORWARD, check_rule, default_rule, rule_names
from .topology import Topology

DEFAULT_TIMEOUT_S = 60.0  # a rank that sees no progress this long ends the job (MPI only)


@dataclass(frozen=True)
class RunConfig:
    """How a run is carried out, whatever it runs.

    Attributes:
        intra: intra-dim queue policy, a name of the registry (fifo, scf, rg, lrpf or a plugin).
        active_per_dim: stages each dim runs at once.
        endpoint_delay_ns: delay added to every algorithm step (ASTRA-sim uses 10).
        clock: virtual (emulated time travels with the messages) or wall (delays really waited).
        time_scale: wall seconds per emulated second (wall clock only).
        timeout_s: seconds a rank waits without progress before it ends the job (MPI only).
        compat: "" for this project's model, or "astra-sim-1.0" for ASTRA-sim 1.0's exact
            semantics where they are modelling choices (see `cost` and `engine`).
        endpoint: the NPU's memory bandwidth, compute share and ACE (`cost.Endpoint`; off).
        network: how stages that run at once share links, a rule's name (`timing.rules`): packet
            (the default), fair, store-forward or ideal (they share nothing: the cost model alone,
            ASTRA-sim 1.0's rule). Empty: the default (`timing.rules.default_rule`), chosen when
            the settings are made (`network_default` is then set; `on` a topology of nccl dims
            it becomes ideal).
        network_default: whether `network` is the default's choice rather than one named.
        mtu_bytes: the packet rule's packet (``--mtu``); None: the topology's ``MTU(...)``, else
            4096 (`timing.packet.mtu_of`).
        compat_concurrent: under ``astra-sim-2``, let collectives be in flight together (its
            ``hwres_multi_comm`` build); by default one runs at a time per NPU, as its workload layer.
        compat_fifo: under ``astra-sim-2``, its ``scheduling-policy: FIFO`` (the earlier collective
            first) instead of LIFO.
        comm_scheduler: the communication scheduler between collectives, a name of the registry
            (fifo, lifo, p3, bytescheduler, tictac or a plugin; `policies.scheduler`); "" = fifo,
            or lifo under an ASTRA-sim compat (`policies.scheduler.default_scheduler`).
        credit_bytes: bytescheduler's credit, bytes of stages running per dim (0: its default).
        npu_delay_ns: late NPUs, ``(rank, ns)`` pairs: each starts its work that much later.
        link_scale: ``(dim, rank, factor)``: that NPU's links in that dim run at factor times
            their bandwidth (`timing.ideal.LinkScales`). With either, the model runs every NPU
            (`timing.planner`), and each dim starts its stages in one agreed order
            (`engine.Engine.agree`).
    """

    intra: str = "fifo"
    active_per_dim: int = 1
    endpoint_delay_ns: float = 0.0
    clock: str = "virtual"
    time_scale: float = 1.0
    timeout_s: float = DEFAULT_TIMEOUT_S
    compat: str = ""
    endpoint: Endpoint = NO_ENDPOINT
    network: str = ""
    network_default: bool = False
    mtu_bytes: int | None = None
    compat_concurrent: bool = False
    compat_fifo: bool = False
    comm_scheduler: str = ""
    credit_bytes: int = 0
    npu_delay_ns: tuple[tuple[int, float], ...] = ()
    link_scale: tuple[tuple[int, int, float], ...] = ()

    def __post_init__(self) -> None:
        check_compat(self.compat)
        if self.compat and self.endpoint.on:
            raise UsageError(
                f"the endpoint model (--hbm-gbps) is not part of --compat {self.compat}; drop one of the two"
            )
        if not self.network:  # the default: ideal where no rule times the run per link
            per_link = not self.endpoint.on and self.clock != "wall"
            object.__setattr__(self, "network", default_rule(self.compat, per_link))
            object.__setattr__(self, "network_default", True)
        if self.network not in rule_names():
            raise UsageError(f"unknown --network {self.network!r}; use one of {', '.join(rule_names())}")
        if self.network not in (IDEAL, STORE_FORWARD) and self.compat == ASTRA_SIM_2:
            raise UsageError(f"--compat {self.compat} takes --network store-forward or ideal")
        if self.network != IDEAL and self.compat == ASTRA_SIM_1_0:
            raise UsageError(f"--compat {self.compat} shares no link: it takes --network ideal only")
        if (self.compat_concurrent or self.compat_fifo) and self.compat != ASTRA_SIM_2:
            raise UsageError(
                "--compat-concurrent and --compat-scheduling FIFO need --compat astra-sim-2; add it"
            )
        if self.network != IDEAL and self.endpoint.on:
            raise UsageError(
                f"the endpoint model (--hbm-gbps) is not modelled under --network {self.network}"
            )
        check_mtu(self.mtu_bytes)
        if self.mtu_bytes is not None and self.network != PACKET:
            raise UsageError(
                f"--mtu is the packet rule's (--network packet); this run is under --network {self.network}"
            )
        if not isinstance(self.intra, str) or not self.intra:
            raise UsageError(f"intra-dim policy must be a name, got {self.intra!r}")
        in_range("active chunks per dim", self.active_per_dim, 1, 1024)
        if not isinstance(self.comm_scheduler, str):
            raise UsageError(f"communication scheduler must be a name, got {self.comm_scheduler!r}")
        if self.comm_scheduler and self.compat_fifo:
            raise UsageError("--compat-scheduling and --comm-scheduler both choose the scheduler; give one")
        if self.credit_bytes:
            in_range("credit", self.credit_bytes, 1, MAX_SIZE_BYTES, "B")
        in_range("endpoint delay", self.endpoint_delay_ns, 0, MAX_TIME_NS, "ns")
        if self.clock not in ("virtual", "wall"):
            raise UsageError(f"unknown clock {self.clock!r}; use virtual or wall")
        in_range("time scale", self.time_scale, 1e-9, MAX_TIME_SCALE, "wall s per emulated s")
        in_range("timeout", self.timeout_s, 0.1, MAX_TIMEOUT_S, "s")
        ranks = [rank for rank, _ in self.npu_delay_ns]
        if len(set(ranks)) != len(ranks):
            raise UsageError(f"--npu-delay-us names a rank twice: {sorted(ranks)}")
        for rank, delay_ns in self.npu_delay_ns:
            in_range("--npu-delay-us rank", rank, 0, 1 << 20)
            in_range(f"--npu-delay-us of rank {rank}", delay_ns / 1e3, 0, MAX_TIME_NS / 1e3, "us")
        links = [(d, rank) for d, rank, _ in self.link_scale]
        if len(set(links)) != len(links):
            raise UsageError(f"--link-scale names a link twice: {sorted(links)}")
        for d, rank, factor in self.link_scale:
            in_range("--link-scale dim", d, 0, 63)
            in_range("--link-scale rank", rank, 0, 1 << 20)
            in_range(f"--link-scale of dim {d}, rank {rank}", factor, MIN_LINK_SCALE, MAX_LINK_SCALE)
        if self.asymmetric and self.compat:
            raise UsageError(f"--compat {self.compat} has identical NPUs: drop --npu-delay-us, --link-scale")
        if self.asymmetric and self.active_per_dim != 1:
            raise UsageError(
                "a late NPU or a scaled link (--npu-delay-us, --link-scale) runs with one active chunk a dim"
            )

    def on(self, topology: Topology) -> RunConfig:
        """These settings on a topology: the default rule is ideal on nccl dims; a named rule is checked.

        nccl dims are timed by the NCCL-like model, per collective, not per link
        (`timing.rules.check_rule`).
        """
        if self.network_default and topology.flat and self.network == DEFAULT_RULE and not self.compat:
            return replace(self, network=IDEAL)
        check_rule(topology, self.network)
        return self

    def alike(self) -> RunConfig:
        """These settings with every NPU alike, on the virtual clock: the run NPUs agree with."""
        return replace(self, npu_delay_ns=(), link_scale=(), clock="virtual", time_scale=1.0)

    def costs(self, topology: Topology) -> CostModels:
        """The cost models of a run of these settings on a topology (each element size's)."""
        return CostModels(topology, self.endpoint_delay_ns, self.compat, self.endpoint)

    def late_ns(self, rank: int) -> float:
        """When NPU `rank` starts its work: its ``--npu-delay-us``, else 0."""
        return dict(self.npu_delay_ns).get(rank, 0.0)

    @property
    def asymmetric(self) -> bool:
        """Whether NPUs differ (late NPUs, scaled links): the model must then run every NPU."""
        return bool(self.npu_delay_ns or self.link_scale)
