"""Custom collective algorithms in MSCCL-IR: read, check, prove on data, time, write, synthesize.

`ir` reads and writes the format, `check` refuses a file that could not run (one line naming
the GPU, threadblock and step), `program` turns it into each GPU's ordered operations, `execute`
runs them on real numpy data and symbolically, `timing` times them standalone, `build` writes
algorithms (the built-in ones among them) and `synthesis` synthesizes all-gathers for a topology.
docs/custom-algorithms.md tells the whole story.
"""
