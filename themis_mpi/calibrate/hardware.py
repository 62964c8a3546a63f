"""The GPUs calibrate knows: their links' nominal rates and the algorithms they have, from datasheets.

A log names its GPUs in its "Using devices" lines (``NVIDIA H100 80GB HBM3``, ``AMD Instinct
MI300X``); `gpu_of` finds the row. Rates are per GPU and direction, all links together, in GB/s of
1e9 B (a datasheet's "900 GB/s NVLink" is both directions: 450 each way). The NIC rate is the
platform's reference design (one NIC per GPU), a default that ``--nic-gbps`` overrides.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    """One GPU product as calibrate uses it.

    Attributes:
        name: the product.
        patterns: lower-case substrings of a device name that mean this product (tried in
            table order, so a PCIe variant's row comes before its SXM one).
        vendor: nvidia or amd (NCCL's or RCCL's algorithms and constants).
        arch: volta, ampere, hopper, blackwell (NCCL's compute-capability classes), cdna3, cdna4.
        link_gbps: GPU-to-GPU rate per direction, all links together, GB/s (1e9 B/s).
        fabric: Switch (NVSwitch: any GPU to any at the full rate) or FullyConnected (a full mesh).
        nvls: whether NVLink SHARP (NVLS, NVLS-Tree) exists: Hopper or later with NVSwitch.
        domain: GPUs one NVLink domain can hold (72 in an NVL72 rack; a node otherwise).
        node: GPUs per server (tray) of the reference platform.
        nic_gbits: the platform's NIC per GPU, Gb/s.
        source: where the numbers come from.
    """

    name: str
    patterns: tuple[str, ...]
    vendor: str
    arch: str
    link_gbps: float
    fabric: str
    nvls: bool
    domain: int
    node: int
    nic_gbits: float
    source: str


GPUS: tuple[Gpu, ...] = (
    Gpu("A100 PCIe", ("a100-pcie", "a100 pcie"), "nvidia", "ampere", 32.0, "Switch", False, 8, 8, 200,
        "NVIDIA A100 datasheet: PCIe Gen4 x16, 64 GB/s both ways (no NVLink switch)"),
    Gpu("A100", ("a100",), "nvidia", "ampere", 300.0, "Switch", False, 8, 8, 200,
        "NVIDIA A100 Tensor Core GPU datasheet: third-generation NVLink, 12 links, 600 GB/s both ways; "
        "DGX A100 user guide: 8x ConnectX-6 200 Gb/s"),
    Gpu("A800", ("a800",), "nvidia", "ampere", 200.0, "Switch", False, 8, 8, 200,
        "NVIDIA A800 datasheet: NVLink 400 GB/s both ways"),
    Gpu("H100 PCIe", ("h100 pcie", "h100-pcie"), "nvidia", "hopper", 64.0, "Switch", False, 8, 8, 400,
        "NVIDIA H100 datasheet (PCIe): PCIe Gen5 x16, 128 GB/s both ways"),
    Gpu("H100 NVL", ("h100 nvl",), "nvidia", "hopper", 300.0, "Switch", False, 8, 8, 400,
        "NVIDIA H100 datasheet (NVL): NVLink bridge 600 GB/s both ways"),
    Gpu("H800", ("h800",), "nvidia", "hopper", 200.0, "Switch", True, 8, 8, 400,
        "NVIDIA H800 datasheet (SXM): NVLink 400 GB/s both ways"),
    Gpu("H100", ("h100",), "nvidia", "hopper", 450.0, "Switch", True, 8, 8, 400,
        "NVIDIA H100 Tensor Core GPU datasheet (SXM5): fourth-generation NVLink, 18 links, 900 GB/s "
        "both ways, NVLink Switch with SHARP; DGX H100 user guide: 8x ConnectX-7 400 Gb/s"),
    Gpu("H200", ("h200",), "nvidia", "hopper", 450.0, "Switch", True, 8, 8, 400,
        "NVIDIA H200 Tensor Core GPU datasheet (SXM): NVLink 900 GB/s both ways; HGX H200: 400 Gb/s per GPU"),
    Gpu("GB200", ("gb200",), "nvidia", "blackwell", 900.0, "Switch", True, 72, 4, 400,
        "NVIDIA GB200 NVL72 datasheet: fifth-generation NVLink 1.8 TB/s both ways per GPU, 72 GPUs in one "
        "NVLink domain, 4 GPUs per compute tray; ConnectX-7 400 Gb/s per GPU"),
    Gpu("GB300", ("gb300",), "nvidia", "blackwell", 900.0, "Switch", True, 72, 4, 800,
        "NVIDIA GB300 NVL72 datasheet: NVLink 1.8 TB/s both ways per GPU, 72 GPUs per NVLink domain; "
        "ConnectX-8 800 Gb/s per GPU"),
    Gpu("B300", ("b300",), "nvidia", "blackwell", 900.0, "Switch", True, 8, 8, 800,
        "NVIDIA HGX B300 datasheet: NVLink 1.8 TB/s both ways per GPU; ConnectX-8 800 Gb/s per GPU"),
    Gpu("B200", ("b200",), "nvidia", "blackwell", 900.0, "Switch", True, 8, 8, 400,
        "NVIDIA DGX B200 datasheet: fifth-generation NVLink 1.8 TB/s both ways per GPU; 8x ConnectX-7 "
        "400 Gb/s"),
    Gpu("V100", ("v100",), "nvidia", "volta", 150.0, "Switch", False, 8, 8, 100,
        "NVIDIA Tesla V100 datasheet (SXM2): NVLink 300 GB/s both ways (6 links)"),
    Gpu("MI300X", ("mi300x",), "amd", "cdna3", 448.0, "FullyConnected", False, 8, 8, 400,
        "AMD Instinct MI300X data sheet: 7 Infinity Fabric links to the other GPUs, 128 GB/s each both "
        "ways (896 GB/s aggregate); 400 Gb/s NIC per GPU in the reference platform"),
    Gpu("MI325X", ("mi325x",), "amd", "cdna3", 448.0, "FullyConnected", False, 8, 8, 400,
        "AMD Instinct MI325X data sheet: 896 GB/s aggregate peer-to-peer Infinity Fabric (7 links)"),
    Gpu("MI355X", ("mi355x", "mi350x"), "amd", "cdna4", 537.6, "FullyConnected", False, 8, 8, 400,
        "AMD Instinct MI355X / MI350X data sheet: 7 Infinity Fabric links at 153.6 GB/s both ways "
        "(1075.2 GB/s aggregate)"),
)  # fmt: skip

VENDOR_MARKS = {  # text in a log that names the library even without device names
    "amd": ("rccl", "rocm", "amd instinct", "hip version", "gfx9"),
    "nvidia": ("nccl info", "cudadev", "nvidia", "cuda"),
}


def gpu_of(device: str) -> Gpu | None:
    """The row whose pattern a device name contains (first in table order), or None."""
    text = device.lower()
    return next((g for g in GPUS if any(p in text for p in g.patterns)), None)


def vendor_rows(vendor: str) -> tuple[Gpu, ...]:
    """The rows of one vendor (bounds for a GPU the log does not name)."""
    return tuple(g for g in GPUS if g.vendor == vendor and g.link_gbps >= 100)


def markdown_table() -> str:
    """The table as the docs show it."""
    lines = [
        "| GPU | vendor | arch | link GB/s each way | fabric | NVLS | NVLink domain | GPUs per node | "
        "NIC Gb/s | source |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for g in GPUS:
        lines.append(
            f"| {g.name} | {g.vendor} | {g.arch} | {g.link_gbps:g} | {g.fabric} | "
            f"{'yes' if g.nvls else 'no'} | {g.domain} | {g.node} | {g.nic_gbits:g} | {g.source} |"
        )
    return "\n".join(lines)
