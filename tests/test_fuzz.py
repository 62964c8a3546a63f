"""Fuzzing the parsers: every malformed input gets a UsageError (one clear line), nothing else."""

import random

import h5py
import numpy as np
import pytest
import yaml
from harness import DATA
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from themis_mpi.collectives import Collective
from themis_mpi.config import RunConfig
from themis_mpi.errors import UsageError
from themis_mpi.run.collective import model_collective
from themis_mpi.topology import parse_inline, parse_topology, parse_yaml
from themis_mpi.trace import DATASETS, Trace, TraceRecorder
from themis_mpi.workloads.text import parse_workload

REFERENCE = DATA / "astra-sim-1.0-text"
SPEC_ALPHABET = "RingFCSWswitchringfc()_,.-+eE0123456789 \t"


def accepts_or_usage_error(fn, *args):
    """Call fn; a UsageError must be one line. Returns the result or None."""
    try:
        return fn(*args)
    except UsageError as exc:
        assert "\n" not in str(exc) and str(exc)
        return None


@given(st.text(alphabet=SPEC_ALPHABET, max_size=60))
def test_random_inline_topologies(text):
    """Any string: a topology that round-trips through its spec, or a UsageError."""
    topo = accepts_or_usage_error(parse_inline, text)
    if topo is not None:
        assert parse_inline(topo.spec()).dims == topo.dims


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["Ring", "FC", "SW", "Torus", ""]),
            st.lists(
                st.one_of(
                    st.integers(-3, 40).map(str),
                    st.floats(allow_nan=True).map(str),
                    st.sampled_from(["", "hd", "ring", "direct", "x"]),
                ),
                max_size=5,
            ),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_structured_inline_topologies(items):
    """Near-valid KIND(a,b,c[,d]) strings: accepted only when every field is valid."""
    text = "_".join(f"{k}({','.join(fields)})" for k, fields in items)
    accepts_or_usage_error(parse_topology, text)


yaml_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 64), st.floats(allow_nan=True), st.text(max_size=8)),
    lambda inner: st.lists(inner, max_size=4),
    max_leaves=10,
)


@given(
    st.dictionaries(st.sampled_from(["topology", "npus_count", "bandwidth", "latency", "other"]), yaml_values)
)
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_random_yaml_networks(tmp_path, doc):
    """Any YAML mapping: a topology or a UsageError."""
    path = tmp_path / "net.yml"
    path.write_text(yaml.safe_dump(doc))
    accepts_or_usage_error(parse_yaml, str(path))


def test_yaml_that_is_not_yaml(tmp_path):
    """Broken YAML syntax is a UsageError too."""
    path = tmp_path / "broken.yml"
    path.write_text("topology: [Ring\nnpus_count: ]]\n")
    with pytest.raises(UsageError, match="cannot read topology file"):
        parse_yaml(str(path))


@given(
    st.sampled_from(sorted(p.name for p in REFERENCE.glob("*.txt"))),
    st.integers(0, 2**32 - 1),
    st.sampled_from(["delete", "replace", "duplicate", "truncate"]),
)
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_mutated_workloads(tmp_path, name, seed, how):
    """A reference workload with one token deleted, replaced, duplicated, or cut: parses or names the line."""
    rng = random.Random(seed)
    tokens = (REFERENCE / name).read_text().split()
    i = rng.randrange(len(tokens))
    junk = rng.choice(
        ["-1", "0", "1e3", "NONE", "ALLREDUCE", "x", "model_parallel_NPU_group:", "99999999999"]
    )
    if how == "delete":
        tokens.pop(i)
    elif how == "replace":
        tokens[i] = junk
    elif how == "duplicate":
        tokens.insert(i, tokens[i])
    else:
        tokens = tokens[:i]
    path = tmp_path / "w.txt"
    path.write_text(" ".join(tokens))
    try:
        parse_workload(str(path))
    except UsageError as exc:
        assert str(exc).startswith(f"{path}") and "\n" not in str(exc)


@pytest.fixture(scope="module")
def trace_bytes(tmp_path_factory):
    from themis_mpi.topology import parse_topology as topo_of

    topo = topo_of("2x2x2")
    recorder = TraceRecorder(
        topo, "model", clock="model", time_scale=1.0, active_per_dim=1, endpoint_delay_ns=0.0
    )
    row, engine = model_collective(
        topo, Collective("all_reduce", 4096, "float32", 4, (0, 1, 2)), "themis", RunConfig(intra="scf")
    )
    recorder.add_run(row, engine)
    path = tmp_path_factory.mktemp("t") / "good.h5"
    recorder.write(str(path), np.concatenate(recorder.events))
    assert Trace(str(path)).events.size
    return path.read_bytes()


@given(st.integers(0, 2**32 - 1), st.sampled_from(["truncate", "flip", "zero"]))
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_damaged_traces(tmp_path, trace_bytes, seed, how):
    """A trace cut short or with flipped bytes: loads (if the damage missed everything) or a UsageError."""
    rng = random.Random(seed)
    data = bytearray(trace_bytes)
    if how == "truncate":
        data = data[: rng.randrange(len(data))]
    else:
        for _ in range(rng.randint(1, 16)):
            i = rng.randrange(len(data))
            data[i] = rng.randrange(256) if how == "flip" else 0
    path = tmp_path / "damaged.h5"
    path.write_bytes(bytes(data))
    accepts_or_usage_error(Trace, str(path))


def test_trace_without_a_needed_table_is_refused(tmp_path, trace_bytes):
    """A trace whose events table was removed is refused as damaged."""
    path = tmp_path / "t.h5"
    path.write_bytes(trace_bytes)
    with h5py.File(path, "a") as f:
        del f["events"]
    with pytest.raises(UsageError, match="damaged trace"):
        Trace(str(path))


@given(st.data())
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=40)
def test_any_flipped_byte_of_a_tables_data_is_refused(tmp_path, trace_bytes, data):
    """Every table carries a checksum: changing any one byte of its data makes reading the trace refuse it."""
    path = tmp_path / "flipped.h5"
    path.write_bytes(trace_bytes)
    with h5py.File(path, "r") as f:
        extents = [(name, f[name].id.get_offset(), f[name].id.get_storage_size()) for name in DATASETS]
    name, offset, size = data.draw(st.sampled_from([e for e in extents if e[1] is not None and e[2] > 0]))
    position = offset + data.draw(st.integers(0, size - 1))
    flipped = bytearray(trace_bytes)
    flipped[position] ^= data.draw(st.integers(1, 255))
    path.write_bytes(bytes(flipped))
    with pytest.raises(UsageError):
        Trace(str(path))


CHAKRA_SAMPLE = sorted((DATA / "astra-sim-chakra-et" / "all_reduce" / "8npus_1MB").glob("*.et"))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_truncated_or_corrupted_chakra_traces(data):
    """A cut or byte-flipped .et file: it parses, or a one-line UsageError names file, byte and record."""
    from themis_mpi.workloads.et import parse_et_bytes

    raw = bytearray(CHAKRA_SAMPLE[data.draw(st.integers(0, len(CHAKRA_SAMPLE) - 1))].read_bytes())
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    for _ in range(data.draw(st.integers(0, 4))):
        if raw:
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    try:
        parse_et_bytes(bytes(raw), "fuzz.et")
    except UsageError as exc:
        message = str(exc)
        assert "\n" not in message and message.startswith("fuzz.et: byte ")
        assert "GlobalMetadata" in message or ": node " in message


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_as_a_chakra_trace(raw):
    """Any bytes: an ET trace, or a one-line UsageError."""
    from themis_mpi.workloads.et import parse_et_bytes

    accepts_or_usage_error(parse_et_bytes, raw, "r.et")
