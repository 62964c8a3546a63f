"""The synthesized all-gather against flat ring, direct and halving-doubling and the hierarchical schedules.

Usage::

    python scripts/study_synthesis.py [--out docs/synthesis] [--quick]

Issue 44's study: on each topology, an all-gather of 1 MiB and 64 MiB (nccl-tests' size: the
whole output), timed by the model under ``--network fair`` (the messages of every algorithm
share the links; every custom file's time is the same under ``ideal``, docs/custom-algorithms.md):

- ``synthesized``: `themis-mpi synthesize all_gather` (one chunk per NPU), run as the collective
  (``--algorithm msccl:FILE``, one chunk);
- ``ring``, ``direct``, ``halving-doubling``: the built-in algorithm over all N NPUs as one flat
  algorithm (`msccl.build.builtin`, exported and run the same way; halving-doubling where N is a
  power of two), its messages routed through the dims;
- ``hierarchical`` and ``themis``: the built-in per-dim algorithms in the baseline and Themis
  schedules, each at its best of 1, 4, 16 and 64 chunks.

The topologies: TACOS's two tori (Torus2D 4x4 and Torus3D 4x4x4), the paper's four shapes and
the HGX preset cut down to 16 or 32 NPUs (the same dim kinds, bandwidths and latencies, every
dim of 2 to 8 NPUs: the synthesizer takes at most 256 NPUs, and every NPU's program runs on every
NPU's links). ``--quick`` runs the 2-D torus at 64 MiB: its rows equal the shipped ones
(tests/test_study_synthesis.py). Writes study.json (every row), study.md (the table) and
study.png (the plot) into --out and prints the table.
"""

import argparse
import os
import sys
import tempfile
import time

from themis_mpi.api import sweep
from themis_mpi.msccl.build import builtin
from themis_mpi.msccl.ir import write_algorithm
from themis_mpi.msccl.synthesis import synthesize_all_gather, to_algorithm
from themis_mpi.output import atomic_path, write_study
from themis_mpi.report import measured_on
from themis_mpi.results import ideal_time_us
from themis_mpi.topology import is_power_of_two, parse_topology

TOPOLOGIES = {  # label -> inline topology
    "Torus2D 4x4": "Ring(4,100,500)_Ring(4,100,500)",
    "Torus3D 4x4x4": "Ring(4,100,500)_Ring(4,100,500)_Ring(4,100,500)",
    "3D-SW_SW_SW_hetero (4x2x2)": "SW(4,200,700)_SW(2,100,700)_SW(2,50,1700)",
    "3D-FC_Ring_SW (4x4x2)": "FC(4,175,700)_Ring(4,100,700)_SW(2,50,1700)",
    "4D-Ring_SW_SW_SW (4x2x2x2)": "Ring(4,250,20)_SW(2,200,700)_SW(2,100,700)_SW(2,50,1700)",
    "4D-Ring_FC_Ring_SW (2x4x2x2)": "Ring(2,375,20)_FC(4,175,700)_Ring(2,150,700)_SW(2,100,1700)",
    "HGX-H100 (8x2x2)": "SW(8,419.1,700)_SW(2,46.57,1700)_SW(2,46.57,1700)_NIC(1+2,46.57)",
}
SIZES = {"1M": 2**20, "64M": 2**26}
FLAT = ("ring", "direct", "halving_doubling")
CHUNKS = (1, 4, 16, 64)
RULE = "fair"
ALGORITHMS = ("synthesized", "ring", "direct", "halving_doubling", "hierarchical", "themis")
WALL_KEYS = ("wall_s",)


def points(quick: bool) -> list[tuple[str, str]]:
    """(topology label, size) of the study (--quick: the 2-D torus at 64 MiB)."""
    if quick:
        return [("Torus2D 4x4", "64M")]
    return [(t, s) for t in TOPOLOGIES for s in SIZES]


def custom_us(spec: str, size: int, algo, folder: str, name: str) -> float:
    """The model's time of an algorithm written as MSCCL-IR and run as the all-gather."""
    path = os.path.join(folder, f"{name}.xml")
    write_algorithm(path, algo)
    (row,) = sweep(spec, size, "baseline", 1, op="all_gather", network=RULE, algorithm=[f"msccl:{path}"])
    return row.time_us


def point_rows(label: str, size_name: str, folder: str) -> list[dict]:
    """Every algorithm's all-gather on one topology at one size."""
    spec, size = TOPOLOGIES[label], SIZES[size_name]
    topo = parse_topology(spec)
    n = topo.npus
    bound = ideal_time_us("all_gather", size, topo, range(len(topo.dims)))
    rows = []

    def row(algorithm: str, time_us: float, chunks: int, t0: float) -> None:
        rows.append(
            {
                "topology": label,
                "spec": spec,
                "npus": n,
                "size": size_name,
                "algorithm": algorithm,
                "chunks": chunks,
                "time_us": time_us,
                "bound_us": bound,
                "utilization": bound / time_us,
                "wall_s": time.perf_counter() - t0,
            }
        )

    t0 = time.perf_counter()
    row(
        "synthesized",
        custom_us(spec, size, to_algorithm(synthesize_all_gather(topo, size)), folder, "synth"),
        1,
        t0,
    )
    for name in FLAT:
        if name == "halving_doubling" and not is_power_of_two(n):
            continue
        t0 = time.perf_counter()
        row(name, custom_us(spec, size, builtin(name, "all_gather", n), folder, name), 1, t0)
    for policy, name in (("baseline", "hierarchical"), ("themis", "themis")):
        t0 = time.perf_counter()
        best = min(
            sweep(spec, size, policy, list(CHUNKS), op="all_gather", network=RULE), key=lambda r: r.time_us
        )
        row(name, best.time_us, best.chunks, t0)
    fastest = min(r["time_us"] for r in rows)
    for r in rows:
        r["vs_fastest"] = r["time_us"] / fastest
    return rows


def table(rows: list[dict]) -> str:
    """The study's markdown table: time (us) per algorithm, the fastest in bold."""
    md = [
        f"All-gather time (us) under `--network {RULE}`, the model; in brackets the chunks of the "
        "hierarchical and Themis schedules' best; bound: the bandwidth bound (docs/design.md's metric).\n",
        "| topology | NPUs | size | bound | " + " | ".join(a.replace("_", "-") for a in ALGORITHMS) + " |",
        "|---" * (4 + len(ALGORITHMS)) + "|",
    ]
    for label, size in dict.fromkeys((r["topology"], r["size"]) for r in rows):
        sel = {r["algorithm"]: r for r in rows if r["topology"] == label and r["size"] == size}
        first = next(iter(sel.values()))
        cells = []
        for a in ALGORITHMS:
            r = sel.get(a)
            if r is None:
                cells.append("-")
                continue
            text = f"{r['time_us']:.2f}" + (f" ({r['chunks']})" if a in ("hierarchical", "themis") else "")
            cells.append(f"**{text}**" if r["vs_fastest"] == 1.0 else text)
        md.append(
            f"| {label} | {first['npus']} | {size} | {first['bound_us']:.2f} | " + " | ".join(cells) + " |"
        )
    return "\n".join(md) + "\n"


def plot(rows: list[dict], path: str) -> None:
    """Each algorithm's time over the bound at 64 MiB (or the largest size run), one group per topology."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    size = list(dict.fromkeys(r["size"] for r in rows))[-1]
    labels = list(dict.fromkeys(r["topology"] for r in rows if r["size"] == size))
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / len(ALGORITHMS)
    for i, a in enumerate(ALGORITHMS):
        xs, ys = [], []
        for j, label in enumerate(labels):
            r = next(
                (r for r in rows if r["topology"] == label and r["size"] == size and r["algorithm"] == a),
                None,
            )
            if r is not None:
                xs.append(j + (i - len(ALGORITHMS) / 2 + 0.5) * width)
                ys.append(r["time_us"] / r["bound_us"])
        ax.bar(xs, ys, width, label=a.replace("_", "-"))
    ax.set_xticks(range(len(labels)), labels, rotation=15, ha="right", fontsize=8)
    ax.set_ylabel("time / bandwidth bound")
    ax.set_title(
        f"All-gather of {size}iB, --network {RULE}: the synthesized algorithm against the built-in ones"
    )
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def main(argv=None) -> list[dict]:
    """Run the study, write study.md, study.json and study.png into --out, print the table; the rows."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out", default="results/synthesis", help="output folder (docs/synthesis is the shipped copy)"
    )
    ap.add_argument("--quick", action="store_true", help="the 2-D torus at 64 MiB (seconds)")
    args = ap.parse_args(argv)
    grid = points(args.quick)
    rows, started = [], time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        for i, (label, size) in enumerate(grid):
            rows += point_rows(label, size, folder)
            sys.stderr.write(f"\r{i + 1}/{len(grid)} points, {time.perf_counter() - started:5.1f} s")
    sys.stderr.write("\n")
    text = table(rows)
    text += f"\n{len(rows)} runs on the model in {time.perf_counter() - started:.1f} s ({measured_on()}).\n"
    write_study(args.out, "study", text, rows)
    plot(rows, os.path.join(args.out, "study.png"))
    print(text)
    return rows


if __name__ == "__main__":
    main()
