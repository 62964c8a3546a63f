"""The Python API in a few lines: a sweep on the model, its rows, and training iterations."""

import themis_mpi

results = themis_mpi.sweep("3D-SW_SW_SW_hetero", size=["1M", "64M"], policy=["baseline", "themis"], chunks=64)
for r in results:  # CollectiveResult objects; r.to_dict() for plain values
    print(r.size_bytes, r.policy, round(r.time_us, 2), [round(d.busy_us, 1) for d in r.dims])
training = themis_mpi.train("traces/resnet152.txt", "3D-SW_SW_SW_hetero")  # TrainingResult per policy
for t in training:
    print(t.policy, round(t.iteration_us, 2))
