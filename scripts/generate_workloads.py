"""Generate the four training workloads of the Themis paper in ASTRA-sim 1.0's text format.

Usage::

    python scripts/generate_workloads.py [--out traces] [--peak-tflops 989] [--efficiency 0.5]
                                         [--bucket-mib 25]

Writes resnet152.txt, gnmt.txt, dlrm.txt and transformer_1t.txt. Every number comes from the
model's architecture and the assumptions below, which traces/README.md repeats:

- Accelerator: 989 TFLOP/s peak (H100-class dense FP16/BF16), 50 % achieved, for every layer
  (`--peak-tflops`, `--efficiency`: the compute times for another accelerator; the update times,
  bound by memory bandwidth, stay).
- Times in ns. Forward compute = forward FLOPs / achieved rate; the input-gradient and the
  weight-gradient compute each take as long as the forward (backward = 2x forward).
- Gradients and activations in 2-byte precision (mixed-precision training); a layer's
  weight-gradient collective moves its parameter count x 2 bytes.
- Weight update: 16 bytes per parameter (Adam: weights, gradient, two moments) at 3 TB/s.
- Per-NPU batches: ResNet-152 32 images at 224x224; GNMT 128 sentences of 50 tokens; DLRM 512
  samples; Transformer-1T micro-batch of 4 sequences of 2048 tokens.
- Data-parallel gradients are all-reduced in 25 MiB buckets, as PyTorch DDP does: walking the
  layers from the last to the first, a bucket's all-reduce is issued by the layer that fills it
  (the last, partial bucket by layer 0). Without buckets, ResNet-152's 156 small all-reduces,
  each cut into 64 chunks, would be latency-bound whatever the schedule. `--bucket-mib 0` writes
  one all-reduce per layer (traces/per-layer/), for `themis-mpi train --bucket-mib N` to bucket.
"""

import argparse
import os

from themis_mpi.output import write_text

PEAK_FLOPS = 989e12
EFFICIENCY = 0.5
BYTES = 2
UPDATE_BYTES_PER_PARAM = 16
HBM_BYTES_PER_S = 3e12


def ns(flops: float) -> int:
    """Compute time in ns of `flops` at the achieved rate (at least 1 ns)."""
    return max(1, round(flops / (PEAK_FLOPS * EFFICIENCY) * 1e9))


def update_ns(params: float) -> int:
    """Weight-update time in ns of `params` parameters."""
    return max(1, round(params * UPDATE_BYTES_PER_PARAM / HBM_BYTES_PER_S * 1e9))


BUCKET_BYTES = 25 * 2**20


def configure(peak_tflops: float = 989.0, efficiency: float = 0.5, bucket_mib: float = 25.0) -> None:
    """Set the accelerator (peak TFLOP/s, achieved fraction) and the bucket size (0: per layer)."""
    global PEAK_FLOPS, EFFICIENCY, BUCKET_BYTES
    if not (peak_tflops > 0 and 0 < efficiency <= 1 and bucket_mib >= 0):
        raise SystemExit("need --peak-tflops > 0, 0 < --efficiency <= 1 and --bucket-mib >= 0")
    PEAK_FLOPS, EFFICIENCY, BUCKET_BYTES = peak_tflops * 1e12, efficiency, round(bucket_mib * 2**20)


def bucketed(layers: list[tuple]) -> list[str]:
    """Lines of (name, fwd_flops, params) layers whose gradients go out in DDP-style buckets."""
    wg_bytes = [0] * len(layers)
    pending = 0
    for i in reversed(range(len(layers))):
        pending += layers[i][2] * BYTES
        if pending >= BUCKET_BYTES or i == 0:
            wg_bytes[i], pending = pending, 0
    return [
        line(name, flops, wg=("ALLREDUCE", size) if size else ("NONE", 0), params=params)
        for (name, flops, params), size in zip(layers, wg_bytes)
    ]


def line(name, fwd_flops, fwd=("NONE", 0), ig=("NONE", 0), wg=("NONE", 0), params=0.0):
    """One layer line: name, reserved, then fwd/ig/wg compute, type and bytes, then update."""
    t = ns(fwd_flops)
    return (
        f"{name}\t-1\t{t}\t{fwd[0]}\t{int(fwd[1])}\t{t}\t{ig[0]}\t{int(ig[1])}\t{t}\t{wg[0]}\t"
        f"{int(wg[1])}\t{update_ns(params)}"
    )


def resnet152() -> list[str]:
    """ResNet-152 (He et al. 2016, torchvision v1.5): data parallel, one line per conv or fc."""
    batch = 32
    layers = []

    def conv(name, k, cin, cout, hw_out):
        params = k * k * cin * cout + 2 * cout  # weights + batch-norm scale and shift
        layers.append((name, 2 * k * k * cin * cout * hw_out * hw_out * batch, params))

    conv("conv1", 7, 3, 64, 112)
    cin = 64
    for stage, (blocks, width, hw) in enumerate(((3, 64, 56), (8, 128, 28), (36, 256, 14), (3, 512, 7)), 2):
        for b in range(blocks):
            prefix = f"res{stage}_{b}"
            conv(f"{prefix}_a", 1, cin, width, hw if b or stage == 2 else hw * 2)
            conv(f"{prefix}_b", 3, width, width, hw)
            conv(f"{prefix}_c", 1, width, 4 * width, hw)
            if b == 0:
                conv(f"{prefix}_down", 1, cin, 4 * width, hw)
            cin = 4 * width
    params = 2048 * 1000 + 1000
    layers.append(("fc", 2 * params * batch, params))
    return ["DATA", str(len(layers)), *bucketed(layers)]


def gnmt() -> list[str]:
    """GNMT as in MLPerf: 4+4 LSTM layers of 1024, bidirectional first encoder layer, 32k vocab."""
    tokens = 128 * 50
    hidden, vocab = 1024, 32000
    layers = []

    def dense(name, params, matmul_params):
        layers.append((name, 2 * matmul_params * tokens, params))

    def lstm(inputs):
        return 4 * (inputs + hidden) * hidden + 8 * hidden

    dense("enc_embedding", vocab * hidden, hidden)  # a lookup: charge one row's worth of work
    dense("enc_lstm1_bidir", 2 * lstm(hidden), 2 * lstm(hidden))
    dense("enc_lstm2", lstm(2 * hidden), lstm(2 * hidden))
    dense("enc_lstm3", lstm(hidden), lstm(hidden))
    dense("enc_lstm4", lstm(hidden), lstm(hidden))
    dense("dec_embedding", vocab * hidden, hidden)
    dense("attention", 2 * hidden * hidden + hidden, 2 * hidden * hidden)
    for i in range(1, 5):
        dense(f"dec_lstm{i}", lstm(2 * hidden), lstm(2 * hidden))
    dense("classifier", hidden * vocab + vocab, hidden * vocab)
    return ["DATA", str(len(layers)), *bucketed(layers)]


def dlrm() -> list[str]:
    """DLRM as in MLPerf (Criteo 1TB): 26 tables of dim 128 (model parallel), MLPs data parallel."""
    batch, tables, dim = 512, 26, 128
    a2a = batch * tables * dim * BYTES  # each NPU's embedding outputs, exchanged both ways
    bottom = [13, 512, 256, 128]
    interaction = tables * (tables + 1) // 2 + dim  # 351 pairwise dots + the dense vector = 479
    top = [interaction, 1024, 1024, 512, 256, 1]
    mlps = [
        (f"{prefix}_mlp{i}", 2 * a * b * batch, a * b + b)
        for prefix, widths in (("bottom", bottom), ("top", top))
        for i, (a, b) in enumerate(zip(widths, widths[1:]))
    ]
    mlp_lines = bucketed(mlps)  # 4.7 MB of MLP gradients: one bucket, issued by the first MLP
    embedding = line("embedding", batch * tables * dim, fwd=("ALLTOALL", a2a), ig=("ALLTOALL", a2a))
    return [f"HYBRID_DLRM\t{len(bottom) - 1}", str(1 + len(mlps)), embedding, *mlp_lines]


def transformer_1t() -> list[str]:
    """A 1-trillion-parameter GPT (Megatron's 1T configuration).

    128 layers, hidden 25600, 160 heads, sequence 2048, vocabulary 51200; tensor (model) parallel
    over 128 NPUs, data parallel over the rest. Per layer, Megatron all-reduces the activations
    twice in the forward and twice in the input gradient; one line per layer carries both as one
    collective of twice the size.
    """
    mp, b, s, h, vocab, n_layers = 128, 4, 2048, 25600, 51200, 128
    act = b * s * h * BYTES
    layer_params = 12 * h * h / mp
    layer_flops = (24 * b * s * h * h + 4 * b * s * s * h) / mp
    emb_params = vocab * h / mp
    lines = [
        line(
            "embedding",
            2 * b * s * h * vocab / mp,
            fwd=("ALLREDUCE", act),
            wg=("ALLREDUCE", emb_params * BYTES),
            params=emb_params,
        )
    ]
    for i in range(n_layers):
        lines.append(
            line(
                f"layer{i}",
                layer_flops,
                fwd=("ALLREDUCE", 2 * act),
                ig=("ALLREDUCE", 2 * act),
                wg=("ALLREDUCE", layer_params * BYTES),
                params=layer_params,
            )
        )
    return [f"HYBRID_TRANSFORMER\tmodel_parallel_NPU_group: {mp}", str(len(lines)), *lines]


WORKLOADS = {"resnet152": resnet152, "gnmt": gnmt, "dlrm": dlrm, "transformer_1t": transformer_1t}


def generate(out: str) -> list[str]:
    """Write the four workloads into `out` with the current settings; their paths."""
    os.makedirs(out, exist_ok=True)
    paths = []
    for name, build in WORKLOADS.items():
        path = os.path.join(out, f"{name}.txt")
        write_text(path, "\n".join(build()) + "\n")
        paths.append(path)
    return paths


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/traces", help="output folder (traces/ holds the shipped files)")
    ap.add_argument(
        "--peak-tflops", type=float, default=989.0, help="accelerator peak TFLOP/s (default 989, H100)"
    )
    ap.add_argument(
        "--efficiency", type=float, default=0.5, help="fraction of the peak achieved (default 0.5)"
    )
    ap.add_argument(
        "--bucket-mib",
        type=float,
        default=25.0,
        help="DDP bucket of the data-parallel gradients in the file; 0 = one all-reduce per layer (25)",
    )
    args = ap.parse_args()
    configure(args.peak_tflops, args.efficiency, args.bucket_mib)
    for path in generate(args.out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
