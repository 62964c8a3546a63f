"""The API's calibrate (one dim fitted to an nccl-tests log) and price_gpt (`workload gpt ... --run`)."""

import themis_mpi
from themis_mpi import api

log = "tests/data/nccl-tests/h100x8_nvls_dgxc.txt"
fit = api.calibrate(log, algorithm="ring", kind="SW", chunks=4, min_size="1M")  # calibrate's flags
print(fit.topology, fit.chunks, fit.latency_ns, fit.bandwidth_gbps)  # fit.to_dict(): what --json writes
rows = themis_mpi.price_gpt(["2x2x2", "4x2"], "both", layers=8, hidden=1024, heads=16, seq=1024, vocab=32000,
                            tp=4, pp=2, global_batch=4)  # fmt: skip
for r in rows:  # PricedResult per topology and policy: the rows of `workload gpt ... --run --json -`
    print(r.topology, r.policy, round(r.iteration_us, 2), round(r.TP, 2), round(r.PP, 2), round(r.speedup, 3))
