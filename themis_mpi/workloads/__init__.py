"""Workloads: what a training run issues, and the files it comes from.

- `text`: ASTRA-sim 1.0 text workloads (layers, phases, parallelism).
- `training`: the text workload's layer loop as an engine process, gradient buckets.
- `et`: Chakra execution-trace files, a protobuf codec with no dependency.
- `convert`: text workloads to ET files and back.
- `chakra`: replay of Chakra execution graphs on the engine.
"""
