"""The Python API for notebooks and scripts: sweeps on the model, results as objects or a DataFrame.

    import themis_mpi
    results = themis_mpi.sweep("3D-SW_SW_SW_hetero", size=["1M", "64M"], policy=["baseline", "themis"])
    frame = themis_mpi.to_dataframe(results)     # needs pandas (not a dependency)

Every call runs the same driver, engine and cost model as `themis-mpi model`; no MPI is involved.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

from .collectives import DEFAULT_DTYPE
from .config import RunConfig
from .cost import default_endpoint_delay_ns
from .errors import UsageError
from .limits import MAX_BANDWIDTH_GBPS, MAX_CHUNKS, MIN_BANDWIDTH_GBPS, in_range
from .progress import Progress
from .results import CollectiveResult, TrainingResult, flat_row

if TYPE_CHECKING:
    from .calibrate import Fit, NcclFit, NcclLog
from .run.pool import parse_workers, run_cells, run_training_cells, train_graph, train_text
from .run.priced import DEFAULT_CHUNKS as DEFAULT_GPT_CHUNKS
from .run.priced import PricedResult, gpt_cells, price_cell
from .run.sweep import TrainingCell, baseline_cells, sweep_cells, training_cells
from .topology import KIND_ALIASES, PRESETS, Topology, parse_topology, read_fit
from .units import parse_size, size_sweep
from .workloads.chakra import is_et_source, load_graph
from .workloads.et import MAX_ET_NODES
from .workloads.llm import PRESETS as LLM_PRESETS
from .workloads.llm import Layout, LlmConfig, fit_groups, parse_order, parse_schedule, rank_nodes, write_llm
from .workloads.text import Workload, parse_workload
from .workloads.training import TrainingSpec


def _items(value: Any, what: str, kinds: tuple[type, ...], accepts: str) -> list:
    """A scalar or a list/tuple of them, each of `kinds` (bools are not ints); else a TypeError naming it."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items or any(isinstance(v, bool) or not isinstance(v, kinds) for v in items):
        raise TypeError(f"{what} must be {accepts}, or a list of them; got {value!r}")
    return items


def _names(value: Any, what: str) -> list[str]:
    return _items(value, what, (str,), "a name (str)")


def _policies(value: Any) -> str | list[str]:
    """Policy names as `run.sweep.policy_names` takes them ("all", "both", "a,b" or a list)."""
    names = _names(value, "policy")
    return value if isinstance(value, str) else names


def _one(value: Any, what: str, kinds: tuple[type, ...], accepts: str) -> Any:
    """A single value of `kinds` (bools are not ints), else a TypeError naming the parameter."""
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise TypeError(f"{what} must be {accepts}; got {value!r}")
    return value


def _size_bytes(size: int | str) -> int:
    """Bytes of a size given as a number of bytes or with a K/M/G suffix."""
    return parse_size(size) if isinstance(size, str) else size


class _DefaultSize(str):
    """`sweep`'s size when none is given (a range may then be)."""


DEFAULT_SIZE = _DefaultSize("64M")


def _stragglers(npu_delay_us, link_scale) -> dict:
    """The `RunConfig` fields of the mapping forms ``{rank: us}`` and ``{(dim, rank): factor}``."""
    delays = tuple((rank, us * 1e3) for rank, us in sorted((npu_delay_us or {}).items()))
    links = tuple((d, rank, f) for (d, rank), f in sorted((link_scale or {}).items()))
    return {"npu_delay_ns": delays, "link_scale": links}


def _slow_compute(npu_compute_scale, compute_jitter, seed) -> dict:
    """The `TrainingSpec` fields of ``{rank: factor}``, a lognormal sigma and its seed."""
    return {
        "npu_compute_scale": tuple(sorted((npu_compute_scale or {}).items())),
        "compute_jitter": _one(compute_jitter, "compute_jitter", (int, float), "a lognormal sigma"),
        "seed": _one(seed, "seed", (int,), "a whole number (int)"),
    }


def sweep(
    topology: str | Sequence[str] = "2x2x2",
    size: int | str | Sequence[int | str] = DEFAULT_SIZE,
    policy: str | Sequence[str] = ("baseline", "themis"),
    chunks: int | Sequence[int] | None = None,
    *,
    begin: int | str | None = None,
    end: int | str | None = None,
    factor: float = 2.0,
    op: str = "all_reduce",
    dtype: str = DEFAULT_DTYPE,
    intra: str | Sequence[str] = "auto",
    active_per_dim: int = 1,
    endpoint_delay_ns: float | None = None,
    compat: str = "",
    network: str | None = None,
    mtu_bytes: int | None = None,
    bandwidth_gbps: Sequence[float | None] | None = None,
    latency_ns: Sequence[float | None] | None = None,
    algorithm: Sequence[str | None] | None = None,
    workers: int | str = 1,
    npu_delay_us: Mapping[int, float] | None = None,
    link_scale: Mapping[tuple[int, int], float] | None = None,
) -> list[CollectiveResult]:
    """Model a collective over every combination of the given values; one result per combination.

    The same cells, defaults and rows as ``themis-mpi model`` (`run.sweep_cells`).

    Args:
        topology: preset names, inline specs or ASTRA-sim YAML paths (see `themis-mpi topologies`).
        size: bytes per NPU, as numbers or with K/M/G suffixes ("64M"); or give a range:
        begin: the first size of a range, as ``-b`` (with `end` and `factor`; not with `size`).
        end: the range's last size, as ``-e`` (default: `begin`).
        factor: the factor between the range's sizes, as ``-f`` (default 2).
        policy: inter-dim policies ("all" names every one, "both" baseline and Themis).
        chunks: chunk counts (default 64, or the chunk count of the first `calibrate` fit among the
            topologies, given as its JSON file).
        op: all_reduce, reduce_scatter, all_gather or all_to_all.
        dtype: element type.
        intra: intra-dim policies (auto: each inter-dim policy's own, e.g. fifo for the baseline).
        active_per_dim: stages each dim runs at once.
        endpoint_delay_ns: delay added to every algorithm step (default 0, or ASTRA-sim's 10 ns
            with compat "astra-sim-1.0").
        compat: "", "astra-sim-1.0" or "astra-sim-2".
        network: how stages that run at once share links: packet, fair, store-forward or ideal
            (None: the default, as without ``--network``: packet, ideal on nccl dims).
        mtu_bytes: the packet rule's packet, as --mtu (None: the topology's MTU(...), else 4096).
        bandwidth_gbps: per-dim bandwidth overrides in GB/s (None keeps a dim's), as --bandwidth.
        latency_ns: per-dim latency overrides in ns, as --latency.
        algorithm: per-dim algorithm overrides, as --algorithm (``["msccl:FILE.xml"]``: a custom
            algorithm runs each collective, docs/custom-algorithms.md).
        workers: local processes to run the cells on (1: this process), or "mpi" (an mpi4py.futures
            pool, under ``mpiexec -n K python -m mpi4py.futures SCRIPT``); the same results.
        npu_delay_us: late NPUs, ``{rank: us}``, as --npu-delay-us (the model then times every NPU).
        link_scale: ``{(dim, rank): factor}``: that NPU's links in that dim at factor times the
            bandwidth, as --link-scale.

    Returns:
        `CollectiveResult` objects (``to_dict()`` for plain values), in loop order topology, size,
        chunks, policy, intra.

    Raises:
        TypeError: a parameter of the wrong type (named, with what it accepts).
        UsageError: a value out of range or a name that is not known (one line).
    """
    _one(active_per_dim, "active_per_dim", (int,), "a whole number (int)")
    if endpoint_delay_ns is not None:
        _one(endpoint_delay_ns, "endpoint_delay_ns", (int, float), "a number of ns")
    delay_ns = default_endpoint_delay_ns(compat) if endpoint_delay_ns is None else endpoint_delay_ns
    base = RunConfig(
        active_per_dim=active_per_dim,
        endpoint_delay_ns=delay_ns,
        compat=compat,
        network=network or "",
        mtu_bytes=mtu_bytes,
        **_stragglers(npu_delay_us, link_scale),
    )
    cells = sweep_cells(
        [
            parse_topology(t).with_overrides(bandwidth_gbps, latency_ns, algorithm)
            for t in _names(topology, "topology")
        ],
        _sizes(size, begin, end, factor),
        _items(_chunks(chunks, _names(topology, "topology"), 64), "chunks", (int,), "a whole number (int)"),
        _policies(policy),
        _names(intra, "intra"),
        base,
        op=_one(op, "op", (str,), "a name (str)"),
        dtype=_one(dtype, "dtype", (str,), "a name (str)"),
    )
    return [result for _, result in run_cells(cells, range(len(cells)), parse_workers(workers))]


def _sizes(size: Any, begin: Any, end: Any, factor: Any) -> list[int]:
    """`sweep`'s sizes in bytes: the list given, or `begin` .. `end` by `factor` (nccl-tests' -b/-e/-f)."""
    accepts = 'a byte count (int) or a size like "64M"'
    sizes = [_size_bytes(s) for s in _items(size, "size", (int, str), accepts)]
    if begin is None:
        if end is not None:
            raise UsageError("end needs begin (the range's first size)")
        return sizes
    if not isinstance(size, _DefaultSize):
        raise UsageError("give either size (a list) or begin/end/factor (a range), not both")
    first = _size_bytes(_one(begin, "begin", (int, str), accepts))
    last = None if end is None else _size_bytes(_one(end, "end", (int, str), accepts))
    return size_sweep(first, last, _one(factor, "factor", (int, float), "a number"))


def train(
    workload: str,
    topology: str | Sequence[str] = "2x2x2",
    policy: str | Sequence[str] = ("baseline", "themis"),
    chunks: int | Sequence[int] | None = None,
    iterations: int = 2,
    *,
    intra: str | Sequence[str] = "auto",
    dtype: str = DEFAULT_DTYPE,
    compute_scale: float = 1.0,
    comm_scale: float = 1.0,
    compat: str = "",
    network: str | Sequence[str] | None = None,
    mtu_bytes: int | None = None,
    bucket_mib: float = 0.0,
    first_bucket_mib: float | None = None,
    comm_group: str | None = None,
    comm_scheduler: str | Sequence[str] = "",
    partition_mib: float | None = None,
    credit_mib: float | None = None,
    npu_delay_us: Mapping[int, float] | None = None,
    link_scale: Mapping[tuple[int, int], float] | None = None,
    npu_compute_scale: Mapping[int, float] | None = None,
    compute_jitter: float = 0.0,
    seed: int = 0,
    workers: int | str = 1,
) -> list[TrainingResult]:
    """Training iterations of a workload on the model, one result per cell, as ``themis-mpi train``.

    `topology`, `chunks`, `policy`, `intra`, `network` and `comm_scheduler` take a value or a
    list; the cells are those of ``train`` with the same lists (topologies x chunks x policies x
    intra x rules x schedulers), and the results its rows, speedups included (over the first
    baseline row of the same topology, chunks, rule and scheduler).
    `chunks` defaults to 64, or to the chunk count of a `calibrate` fit among the topologies.
    `workload` is an ASTRA-sim 1.0 text workload, or a Chakra trace (a .et file, or the prefix of
    prefix.<rank>.et files; `comm_group` names its communicator-group JSON). Each policy runs
    with its own intra-dim policy under ``intra="auto"``. Buckets (`bucket_mib`,
    `first_bucket_mib`) apply to text workloads. The scheduler between collectives
    (`comm_scheduler`, `partition_mib`, `credit_mib`) and stragglers (`npu_delay_us`,
    `link_scale`, `npu_compute_scale`, `compute_jitter` with `seed`) are train's flags of the
    same names (text workloads; see `sweep` for the mapping forms); `network`, `mtu_bytes` and
    `workers` are `sweep`'s.
    """
    _one(workload, "workload", (str,), "a path (str)")
    names = _names(topology, "topology")
    counts = _items(_chunks(chunks, names, 64), "chunks", (int,), "a whole number (int)")
    _one(iterations, "iterations", (int,), "a whole number (int)")
    for what, scale in (
        ("compute_scale", compute_scale),
        ("comm_scale", comm_scale),
        ("bucket_mib", bucket_mib),
    ):
        _one(scale, what, (int, float), "a number")
    credit_bytes = (
        0 if credit_mib is None else max(1, int(_one(credit_mib, "credit_mib", (int, float), "MiB") * 2**20))
    )
    bases = [
        RunConfig(
            endpoint_delay_ns=default_endpoint_delay_ns(compat),
            compat=compat,
            network=rule,
            mtu_bytes=mtu_bytes,
            comm_scheduler=scheduler,
            credit_bytes=credit_bytes,
            **_stragglers(npu_delay_us, link_scale),
        )
        for rule in _names(network or "", "network")
        for scheduler in _names(comm_scheduler, "comm_scheduler")
    ]
    spec = TrainingSpec(
        counts[0],
        _one(dtype, "dtype", (str,), "a name (str)"),
        iterations,
        compute_scale,
        comm_scale,
        bucket_mib,
        first_bucket_mib,
        **_slow_compute(npu_compute_scale, compute_jitter, seed),
    )
    given = [parse_topology(t) for t in names]
    if is_et_source(workload):
        if bucket_mib or first_bucket_mib is not None:
            raise UsageError("bucket_mib and first_bucket_mib apply to text workloads only")
        graph = load_graph(workload, comm_group)
        wl = Workload("", "HYBRID_TRANSFORMER", [], graph.model_parallel_group)
        spec = replace(spec, iterations=1)
        run: Any = partial(train_graph, graph, None)
    else:
        wl = parse_workload(workload)
        run = partial(train_text, wl)
    cells = training_cells(
        [(t, wl.fit_topology(t)) for t in given],
        counts,
        _policies(policy),
        _names(intra, "intra"),
        bases,
        spec,
        partition_mib,
    )
    return _rows(run, cells, workers)


def _rows(run: Any, cells: list[TrainingCell], workers: int | str) -> list:
    """Each training cell's row in grid order, its speedup over its baseline cell's (`baseline_cells`)."""
    rows = dict(run_training_cells(run, cells, range(len(cells)), parse_workers(workers)))
    out = []
    for i, base in enumerate(baseline_cells(cells)):
        row = rows[i]
        if base is not None and row.iteration_us:
            row = replace(row, speedup=rows[base].iteration_us / row.iteration_us)
        out.append(row)
    return out


SHAPE = ("layers", "hidden", "heads", "seq", "vocab", "ffn", "experts", "topk", "micro_batch", "global_batch")


def gpt_config(
    preset: str | None = None,
    shape: Mapping[str, int | None] | None = None,
    flag: Any = str,
    **settings: Any,
) -> LlmConfig:
    """An LLM's shape and parallelism as `workloads.llm.LlmConfig`: a preset's shape, `shape` over it.

    `shape` maps the names of `SHAPE` to values (None keeps the preset's); `settings` are the
    other fields of `LlmConfig` (tp, pp, dp, ep, zero, recompute, overlap_dp, peak_tflops,
    efficiency, bytes_per_element, order) and ``schedule`` as ``workload gpt --schedule`` takes it
    ("interleaved:V" included). `flag` spells a name in a message (the CLI's ``--name``).
    A shape that does not divide, or a missing size, is a `UsageError`.
    """
    if preset is not None and preset not in LLM_PRESETS:
        raise UsageError(f"unknown preset {preset!r}; use one of {', '.join(LLM_PRESETS)}")
    values = dict(LLM_PRESETS[preset]) if preset else {}
    for name, value in (shape or {}).items():
        if name not in SHAPE:
            raise TypeError(f"gpt has no shape parameter {name!r}; it takes {', '.join(SHAPE)}")
        if value is not None:
            _one(value, name, (int,), "a whole number (int)")
            if value < 1 and name in ("vocab", "ffn"):  # (0 is the library's "none" and "4 x hidden")
                raise UsageError(f"{flag(name)} must be >= 1, got {value}")
            values[name] = value
    missing = [flag(n) for n in ("layers", "hidden", "heads", "seq", "vocab") if n not in values]
    if missing:
        raise UsageError(f"workload gpt needs {' '.join(missing)} (or {flag('preset')})")
    values.setdefault("micro_batch", 1)
    values.setdefault("global_batch", values["micro_batch"] * settings.get("dp", 1))
    schedule, chunks = parse_schedule(settings.pop("schedule", "1f1b"))
    order = "-".join(parse_order(settings.pop("order", "tp-dp-pp")))
    return LlmConfig(**values, **settings, schedule=schedule, chunks=chunks, order=order)


def gpt(
    topology: str = "2x2x2",
    out: str | None = None,
    *,
    preset: str | None = None,
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    seq: int | None = None,
    vocab: int | None = None,
    ffn: int | None = None,
    experts: int | None = None,
    topk: int | None = None,
    micro_batch: int | None = None,
    global_batch: int | None = None,
    tp: int = 1,
    pp: int = 1,
    dp: int = 1,
    ep: int = 1,
    zero: int = 0,
    schedule: str = "1f1b",
    order: str = "tp-dp-pp",
    recompute: bool = False,
    overlap_dp: bool = False,
    peak_tflops: float = 989.0,
    efficiency: float = 0.5,
    bytes_per_element: int = 2,
) -> tuple[LlmConfig, Topology]:
    """An LLM's training iteration, as ``themis-mpi workload gpt``: its config and the topology it runs on.

    The parameters are the command's flags of the same names (``--preset`` a shape whose sizes
    the others override). With `out`, ``OUT.<rank>.et`` are written, one file per rank, as
    ``--out`` writes them; `train` (``train(out, topology)`` with the returned topology's
    ``spec()``) replays them.

    Returns:
        The `workloads.llm.LlmConfig` (parameters, FLOPs, sizes) and the topology its groups fit,
        a dim split where a group ends inside it.
    """
    shape = dict(layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab, ffn=ffn, experts=experts,
                 topk=topk, micro_batch=micro_batch, global_batch=global_batch)  # fmt: skip
    c = gpt_config(
        preset, shape, tp=tp, pp=pp, dp=dp, ep=ep, zero=zero, schedule=schedule, order=order,
        recompute=recompute, overlap_dp=overlap_dp, peak_tflops=peak_tflops, efficiency=efficiency,
        bytes_per_element=bytes_per_element,
    )  # fmt: skip
    topo = parse_topology(_one(topology, "topology", (str,), "a preset name, an inline spec or a YAML path"))
    layout = write_gpt(c, topo, out) if out else fit_groups(c, topo)
    return c, layout.topology


def price_gpt(
    topology: str | Sequence[str] = "2x2x2",
    policy: str | Sequence[str] = ("baseline", "themis"),
    chunks: int | Sequence[int] | None = None,
    *,
    network: str | Sequence[str] | None = None,
    mtu_bytes: int | None = None,
    npu_delay_us: Mapping[int, float] | None = None,
    link_scale: Mapping[tuple[int, int], float] | None = None,
    npu_compute_scale: Mapping[int, float] | None = None,
    compute_jitter: float = 0.0,
    seed: int = 0,
    workers: int | str = 1,
    **model: Any,
) -> list[PricedResult]:
    """An LLM's training iteration priced on the model, as ``themis-mpi workload gpt ... --run``.

    A function of its own, not a ``run=`` flag of `gpt`: `gpt` gives one layout's config and
    topology (and files), this a sweep's rows, taking lists as `train` does. The cells are
    ``--run``'s with the same lists (topologies x chunks x policies x `network` rules, each
    policy with its own intra-dim policy; `run.priced.gpt_cells`), each topology fitted to the
    model's groups; the rows those ``--run --json -`` prints, speedups included (over the first
    baseline row of the same topology, chunks and rule).

    Args:
        topology: preset names, inline specs, ASTRA-sim YAML paths or `calibrate` fits.
        policy: inter-dim policies ("all" names every one, "both" baseline and Themis).
        chunks: chunk counts (default 4, or the chunk count of the first `calibrate` fit among
            the topologies).
        network: link rules, as ``--network`` (None: the default).
        mtu_bytes: the packet rule's packet, as ``--mtu``.
        npu_delay_us: late NPUs ``{rank: us}``, as `train`'s (the stragglers run in every run
            of the split, `run.priced.price_all`; under ideal they are refused).
        link_scale: degraded links ``{(dim, rank): factor}``, as `train`'s.
        npu_compute_scale: slow NPUs ``{rank: factor}``, as `train`'s.
        compute_jitter: a lognormal sigma on every compute phase, as `train`'s.
        seed: the jitter's seed.
        workers: local processes to run the cells on (1: this process), or "mpi", as `sweep`'s.
        **model: `gpt`'s keyword parameters (preset, the shape, tp, pp, dp, ep, zero, schedule,
            order, recompute, overlap_dp, peak_tflops, efficiency, bytes_per_element).

    Returns:
        `run.priced.PricedResult` rows (``to_dict()`` is a ``--json`` row), in loop order topology,
        chunks, policy, rule.
    """
    names = _names(topology, "topology")
    counts = _items(_chunks(chunks, names, DEFAULT_GPT_CHUNKS), "chunks", (int,), "a whole number (int)")
    c, _ = gpt(names[0], None, **model)
    bases = [
        RunConfig(network=rule, mtu_bytes=mtu_bytes, **_stragglers(npu_delay_us, link_scale))
        for rule in _names(network or "", "network")
    ]
    spec = TrainingSpec(
        4, DEFAULT_DTYPE, 1, **_slow_compute(npu_compute_scale, compute_jitter, seed)
    )  # (as --run's)
    cells, layouts = gpt_cells(c, [parse_topology(t) for t in names], counts, _policies(policy), bases, spec)
    return _rows(partial(price_cell, c, layouts), cells, workers)


def write_gpt(c: LlmConfig, topology: Topology, prefix: str) -> Layout:
    """``PREFIX.<rank>.et`` of every rank (`workloads.llm.write_llm`), once their size is known to be sane."""
    if rank_nodes(c) * c.npus > MAX_ET_NODES:
        raise UsageError(
            f"--out would write {c.npus} files of up to {rank_nodes(c)} nodes each; at most "
            f"{MAX_ET_NODES} nodes in all, as convert writes (fewer NPUs, or a smaller shape)"
        )
    return write_llm(c, topology, prefix)


def _chunks(chunks: Any, topologies: list[str], default: int) -> Any:
    """The chunk count asked, else the first `calibrate` fit's among the topologies, else `default`."""
    if chunks is not None:
        return chunks
    fits = [fit for fit in (read_fit(t) for t in topologies if t not in PRESETS) if fit is not None]
    return fits[0].chunks if fits else default


def calibrate(
    log: str,
    *,
    op: str | None = None,
    npus: int | None = None,
    kind: str = "SW",
    algorithm: str = "nccl",
    chunks: int = 1,
    min_size: int | str = "1M",
    table: int | None = None,
    nccl_algo: str | None = None,
    base: str | None = None,
    link_gbps: float | None = None,
    nic_gbps: float | None = None,
    gpus_per_node: int | None = None,
    progress: Progress | None = None,
    on_log: Callable[[NcclLog, str], None] | None = None,
) -> NcclFit | Fit:
    """Fit an nccl-tests or rccl-tests log, as ``themis-mpi calibrate LOG`` (which calls this).

    The parameters are the command's flags of the same names and defaults (its parser gives
    none of its own; tests/test_api_calibrate_workload.py holds its help to these), checked
    here, so that a bad value is the command's line. `algorithm` "nccl" fits the NCCL-like
    model (all sizes; `base`, `link_gbps`, `nic_gbps`, `gpus_per_node` and `nccl_algo` are its);
    a per-dim algorithm (ring, direct, hd...) fits one dim of `kind`'s latency and bandwidth
    at `chunks`, on the sizes from `min_size` up.

    Args:
        log: the log's path, read as posted (`calibrate.read_nccl_log`).
        op: the collective (default: the log's).
        npus: the NPU count (default: the log's).
        kind: the per-dim fit's dim kind: SW, Ring or FC.
        algorithm: nccl, or the per-dim algorithm to fit.
        chunks: chunks the per-dim fit assumes.
        min_size: the per-dim fit's smallest size, bytes or with a K/M/G suffix.
        table: one table of several (default: all of them, fitted together).
        nccl_algo: the algorithms the run allowed, as ``NCCL_ALGO`` (default: the log's, else all).
        base: a single-node fit (its topology or its JSON file): fit only the network level.
        link_gbps: GPU-to-GPU rate each way, GB/s of 1e9 B (default: the GPU table's).
        nic_gbps: the NIC per GPU, GB/s of 1e9 B (default: the GPU's reference platform).
        gpus_per_node: GPUs per node (default: the log's host names).
        progress: told each whole staged fit of the NCCL-like model done.
        on_log: given the log once read and the fit's first lines (`calibrate.fit_header` or
            `calibrate.nccl_fit_header`), before the fit (the command prints them then).

    Returns:
        The fit: `calibrate.NcclFit` for nccl, else `calibrate.Fit`. ``topology`` is what ``-t``
        and `sweep` take; ``to_dict()`` is what ``calibrate --json`` writes, a file `sweep` and
        `train` take as their topology.

    Raises:
        TypeError: a parameter of the wrong type (named, with what it accepts).
        UsageError: a value out of range, an unknown kind, a log that cannot be fitted (one line).
    """
    from .calibrate import fit, fit_header, fit_nccl, nccl_fit_header, parse_algos, read_base, read_nccl_log

    _one(log, "log", (str,), "a path (str)")
    in_range("--chunks", chunks, 1, MAX_CHUNKS)
    if npus is not None:
        in_range("--npus", npus, 2, 2**20)
    dim_kind = KIND_ALIASES.get(_one(kind, "kind", (str,), "SW, Ring or FC (str)").lower())
    if dim_kind is None:
        raise UsageError(f"unknown dim kind {kind!r}; use SW, Ring or FC")
    name = _one(algorithm, "algorithm", (str,), "nccl or a per-dim algorithm (str)").lower()
    found = read_nccl_log(log, op, npus, table)
    if name != "nccl":
        size = _size_bytes(_one(min_size, "min_size", (int, str), 'a byte count (int) or a size like "1M"'))
        if on_log:
            on_log(found, fit_header(found))
        return fit(found, dim_kind, name, chunks, size)
    fitted_base = read_base(base) if base else None
    for flag, value in (("--link-gbps", link_gbps), ("--nic-gbps", nic_gbps)):
        if value is not None:
            in_range(flag, value, MIN_BANDWIDTH_GBPS, MAX_BANDWIDTH_GBPS)
    if gpus_per_node is not None:
        in_range("--gpus-per-node", gpus_per_node, 1, 2**20)
    if on_log:
        on_log(found, nccl_fit_header(found))
    return fit_nccl(
        found,
        fitted_base,
        parse_algos(nccl_algo),
        link_gbps=link_gbps,
        nic_gbps=nic_gbps,
        gpus_per_node=gpus_per_node,
        progress=progress,
    )


def to_dataframe(results: Iterable[CollectiveResult | TrainingResult]) -> Any:
    """Results as a pandas DataFrame, one row each, per-dim figures as dim<d>_<field> columns.

    Raises:
        UsageError: pandas is not installed (it is optional: ``pip install pandas``).
    """
    try:
        import pandas as pd  # type: ignore[import-untyped]
    except ImportError:
        raise UsageError("to_dataframe needs pandas: pip install pandas") from None
    return pd.DataFrame([flat_row(r.to_dict()) for r in results])
