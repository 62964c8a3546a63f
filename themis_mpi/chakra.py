"""MLCommons Chakra execution traces (``.et``): a reader and a writer with no protobuf dependency.

A Chakra ET file (MLCommons Chakra, ``schema/protobuf/et_def.proto``, Apache-2.0) is a sequence
of length-prefixed protobuf messages: a varint byte count, then that many bytes. The first
message is a ``GlobalMetadata`` (field 1 ``version``, field 2 repeated ``attr``), every later one
a ``Node``:

====  =================  ======================================================
  1   id                 uint64
  2   name               string
  3   type               NodeType: 1 METADATA, 2 MEM_LOAD, 3 MEM_STORE, 4 COMP,
                         5 COMM_SEND, 6 COMM_RECV, 7 COMM_COLL
  4   ctrl_deps          repeated uint64 (packed or not)
  5   data_deps          repeated uint64
  6   start_time_micros  uint64
  7   duration_micros    uint64
  8   inputs, 9 outputs  IOInfo: 1 values, 2 shapes, 3 types (strings)
 10   attr               repeated AttributeProto: 1 name, 2 doc_string, then one
                         value of fields 3..32 (`SCALARS`; field n+1 is the list
                         of field n's type)
====  =================  ======================================================

The whole file may be gzip-compressed (recognised by its magic bytes). Unknown fields are
skipped, as protobuf does. A malformed file raises `UsageError` with one line naming the file,
the byte offset (in the decompressed stream) and the record.

This module also converts this project's text workloads to ET and back (`workload_to_et`,
`et_to_workload`): see their docs.
"""

from __future__ import annotations

import gzip
import os
import struct
import types
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .errors import UsageError
from .output import atomic_path

# NodeType
INVALID_NODE, METADATA_NODE, MEM_LOAD_NODE, MEM_STORE_NODE = 0, 1, 2, 3
COMP_NODE, COMM_SEND_NODE, COMM_RECV_NODE, COMM_COLL_NODE = 4, 5, 6, 7
NODE_TYPES = {
    INVALID_NODE: "INVALID",
    METADATA_NODE: "METADATA",
    MEM_LOAD_NODE: "MEM_LOAD",
    MEM_STORE_NODE: "MEM_STORE",
    COMP_NODE: "COMP",
    COMM_SEND_NODE: "COMM_SEND",
    COMM_RECV_NODE: "COMM_RECV",
    COMM_COLL_NODE: "COMM_COLL",
}
# CollectiveCommType
COMM_TYPES = {
    0: "ALL_REDUCE",
    1: "REDUCE",
    2: "ALL_GATHER",
    3: "GATHER",
    4: "SCATTER",
    5: "BROADCAST",
    6: "ALL_TO_ALL",
    7: "REDUCE_SCATTER",
    8: "REDUCE_SCATTER_BLOCK",
    9: "BARRIER",
}

VARINT, I64, LEN, I32 = 0, 1, 2, 5
MAX_VARINT_BYTES = 10
U64 = (1 << 64) - 1

# AttributeProto's value fields: number -> scalar kind (number + 1 is the list of that kind)
SCALARS = {
    3: "double",
    5: "float",
    7: "int32",
    9: "int64",
    11: "uint32",
    13: "uint64",
    15: "sint32",
    17: "sint64",
    19: "fixed32",
    21: "fixed64",
    23: "sfixed32",
    25: "sfixed64",
    27: "bool",
    29: "string",
    31: "bytes",
}
FIELD_OF_KIND = {kind: number for number, kind in SCALARS.items()}
VARINT_KINDS = ("int32", "int64", "uint32", "uint64", "sint32", "sint64", "bool")
FIXED = {"double": "<d", "float": "<f", "fixed32": "<I", "fixed64": "<Q", "sfixed32": "<i", "sfixed64": "<q"}


class _Malformed(Exception):
    """A decoding error at an absolute byte offset (turned into one `UsageError` line)."""

    def __init__(self, offset: int, message: str):
        super().__init__(message)
        self.offset, self.message = offset, message


# --- the data model ----------------------------------------------------------------------------


@dataclass
class Attr:
    """One AttributeProto: a name and one typed value (a scalar, or a list when `is_list`).

    `kind` is the protobuf scalar type (``int64``, ``bool``, ``string``, ... see `SCALARS`),
    kept so that a written file has the same field numbers as the one read.
    """

    name: str
    kind: str
    value: Any
    is_list: bool = False
    doc: str = ""


@dataclass
class IOInfo:
    """A node's inputs or outputs: three strings, as PyTorch's converter writes them."""

    values: str = ""
    shapes: str = ""
    types: str = ""


@dataclass
class Node:
    """One ET node (see the module doc for the fields)."""

    id: int
    name: str = ""
    type: int = INVALID_NODE
    ctrl_deps: list[int] = field(default_factory=list)
    data_deps: list[int] = field(default_factory=list)
    start_time_micros: int = 0
    duration_micros: int = 0
    inputs: IOInfo | None = None
    outputs: IOInfo | None = None
    attrs: list[Attr] = field(default_factory=list)

    def attr(self, name: str, default: Any = None) -> Any:
        """The value of the first attribute called `name`, else `default`."""
        for a in self.attrs:
            if a.name == name:
                return a.value
        return default

    def has_attr(self, name: str) -> bool:
        """Whether the node has an attribute called `name`."""
        return any(a.name == name for a in self.attrs)

    @property
    def type_name(self) -> str:
        """COMP, COMM_COLL, ... (or the number of an unknown type)."""
        return NODE_TYPES.get(self.type, str(self.type))

    @property
    def deps(self) -> list[int]:
        """Control and data dependencies, each id once, in order."""
        return list(dict.fromkeys([*self.ctrl_deps, *self.data_deps]))


@dataclass
class EtTrace:
    """A whole ET file: the GlobalMetadata's version and attributes, then the nodes."""

    path: str
    version: str = ""
    attrs: list[Attr] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)

    def attr(self, name: str, default: Any = None) -> Any:
        """The value of the first metadata attribute called `name`, else `default`."""
        for a in self.attrs:
            if a.name == name:
                return a.value
        return default

    def counts(self) -> dict[str, int]:
        """Nodes per type name, in NodeType order."""
        out: dict[str, int] = {}
        for node in sorted(self.nodes, key=lambda n: n.type):
            out[node.type_name] = out.get(node.type_name, 0) + 1
        return out


# --- decoding ----------------------------------------------------------------------------------


class _Reader:
    """Fields of one message in `buf[start:stop]`; offsets are absolute (for errors)."""

    def __init__(self, buf: bytes, start: int, stop: int):
        self.buf, self.pos, self.stop = buf, start, stop

    def varint(self) -> int:
        buf, pos, result, shift = self.buf, self.pos, 0, 0
        for i in range(MAX_VARINT_BYTES):
            if pos + i >= self.stop:
                raise _Malformed(pos + i, "truncated varint")
            byte = buf[pos + i]
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                self.pos = pos + i + 1
                return result & U64
            shift += 7
        raise _Malformed(pos, "varint longer than 10 bytes")

    def fields(self) -> Iterator[tuple[int, int, int, Any]]:
        """(offset, field number, wire type, value): an int, or (start, stop) for LEN fields."""
        while self.pos < self.stop:
            at = self.pos
            key = self.varint()
            number, wire = key >> 3, key & 7
            if number == 0:
                raise _Malformed(at, "field number 0")
            if wire == VARINT:
                yield at, number, wire, self.varint()
            elif wire in (I64, I32):
                size = 8 if wire == I64 else 4
                if self.pos + size > self.stop:
                    raise _Malformed(self.pos, f"truncated {size}-byte field {number}")
                yield at, number, wire, (self.pos, self.pos + size)
                self.pos += size
            elif wire == LEN:
                length = self.varint()
                if self.pos + length > self.stop:
                    left = self.stop - self.pos
                    raise _Malformed(self.pos, f"field {number} needs {length} bytes, {left} left")
                yield at, number, wire, (self.pos, self.pos + length)
                self.pos += length
            else:
                raise _Malformed(at, f"field {number} has unsupported wire type {wire}")

    def string(self, span: tuple[int, int], at: int) -> str:
        try:
            return self.buf[span[0] : span[1]].decode("utf-8")
        except UnicodeDecodeError:
            raise _Malformed(at, "string is not UTF-8") from None


def _signed(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def _from_varint(kind: str, v: int) -> int | bool:
    if kind == "bool":
        return v != 0
    if kind == "int32":
        return _signed(v, 32)
    if kind == "int64":
        return _signed(v, 64)
    if kind == "uint32":
        return v & 0xFFFFFFFF
    if kind in ("sint32", "sint64"):
        return (v >> 1) ^ -(v & 1)
    return v  # uint64


def _expect(wire: int, want: int, at: int, what: str) -> None:
    if wire != want:
        raise _Malformed(at, f"{what} has wire type {wire}, expected {want}")


def _scalar(r: _Reader, kind: str, wire: int, value: Any, at: int) -> Any:
    if kind in VARINT_KINDS:
        _expect(wire, VARINT, at, kind)
        return _from_varint(kind, value)
    if kind in FIXED:
        fmt = FIXED[kind]
        _expect(wire, I64 if struct.calcsize(fmt) == 8 else I32, at, kind)
        return struct.unpack(fmt, r.buf[value[0] : value[1]])[0]
    _expect(wire, LEN, at, kind)
    return r.string(value, at) if kind == "string" else bytes(r.buf[value[0] : value[1]])


def _list(r: _Reader, kind: str, span: tuple[int, int]) -> list:
    """A XxxList message: field 1 repeated, packed (numbers) or one record per value."""
    out: list = []
    inner = _Reader(r.buf, *span)
    for at, number, wire, value in inner.fields():
        if number != 1:
            continue
        if wire == LEN and kind in VARINT_KINDS:
            packed = _Reader(r.buf, *value)
            while packed.pos < packed.stop:
                out.append(_from_varint(kind, packed.varint()))
        elif wire == LEN and kind in FIXED:
            fmt = FIXED[kind]
            size = struct.calcsize(fmt)
            if (value[1] - value[0]) % size:
                raise _Malformed(at, f"packed {kind} list of {value[1] - value[0]} bytes")
            out += [x[0] for x in struct.iter_unpack(fmt, r.buf[value[0] : value[1]])]
        else:
            out.append(_scalar(inner, kind, wire, value, at))
    return out


def _attr(r: _Reader, span: tuple[int, int]) -> Attr:
    a = Attr("", "", None)
    inner = _Reader(r.buf, *span)
    for at, number, wire, value in inner.fields():
        if number == 1:
            _expect(wire, LEN, at, "attribute name")
            a.name = inner.string(value, at)
        elif number == 2:
            _expect(wire, LEN, at, "attribute doc_string")
            a.doc = inner.string(value, at)
        elif number in SCALARS:
            a.kind, a.is_list = SCALARS[number], False
            a.value = _scalar(inner, a.kind, wire, value, at)
        elif number - 1 in SCALARS and number <= 32:
            _expect(wire, LEN, at, "attribute list")
            a.kind, a.is_list = SCALARS[number - 1], True
            a.value = _list(inner, a.kind, value)
    return a


def _uints(r: _Reader, wire: int, value: Any, at: int, what: str) -> list[int]:
    if wire == VARINT:
        return [value]
    _expect(wire, LEN, at, what)
    packed, out = _Reader(r.buf, *value), []
    while packed.pos < packed.stop:
        out.append(packed.varint())
    return out


def _io(r: _Reader, span: tuple[int, int]) -> IOInfo:
    io = IOInfo()
    inner = _Reader(r.buf, *span)
    for at, number, wire, value in inner.fields():
        if number in (1, 2, 3):
            _expect(wire, LEN, at, "IOInfo string")
            setattr(io, ("values", "shapes", "types")[number - 1], inner.string(value, at))
    return io


def _node(r: _Reader, node: Node) -> None:
    uint_fields = {1: "id", 3: "type", 6: "start_time_micros", 7: "duration_micros"}
    for at, number, wire, value in r.fields():
        if number in uint_fields:
            _expect(wire, VARINT, at, uint_fields[number])
            setattr(node, uint_fields[number], value)
        elif number == 2:
            _expect(wire, LEN, at, "name")
            node.name = r.string(value, at)
        elif number == 4:
            node.ctrl_deps += _uints(r, wire, value, at, "ctrl_deps")
        elif number == 5:
            node.data_deps += _uints(r, wire, value, at, "data_deps")
        elif number in (8, 9):
            _expect(wire, LEN, at, "IOInfo")
            setattr(node, "inputs" if number == 8 else "outputs", _io(r, value))
        elif number == 10:
            _expect(wire, LEN, at, "attr")
            node.attrs.append(_attr(r, value))


def _metadata(r: _Reader, trace: EtTrace) -> None:
    for at, number, wire, value in r.fields():
        if number == 1:
            _expect(wire, LEN, at, "version")
            trace.version = r.string(value, at)
        elif number == 2:
            _expect(wire, LEN, at, "attr")
            trace.attrs.append(_attr(r, value))


def load_bytes(path: str) -> bytes:
    """The file's bytes, gunzipped when it starts with gzip's magic; one line when unreadable."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise UsageError(f"cannot read Chakra trace {path}: {exc.strerror or exc}") from None
    if data[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise UsageError(f"{path}: truncated or corrupt gzip stream ({exc})") from None
    return data


def parse_et_bytes(data: bytes, path: str = "<bytes>") -> EtTrace:
    """Decode an ET byte stream (not compressed); see `read_et`."""
    trace = EtTrace(path)
    top = _Reader(data, 0, len(data))
    record = 0
    node: Node | None = None
    try:
        while top.pos < top.stop:
            length = top.varint()
            start = top.pos
            if start + length > len(data):
                left = len(data) - start
                raise _Malformed(start, f"record of {length} bytes but only {left} left (truncated)")
            body = _Reader(data, start, start + length)
            if record == 0:
                _metadata(body, trace)
            else:
                node = Node(id=0)
                _node(body, node)
                trace.nodes.append(node)
                node = None
            top.pos = start + length
            record += 1
    except _Malformed as exc:
        if record == 0:
            where = "the GlobalMetadata record"
        else:
            where = f"node {record - 1}" + (f" (id {node.id})" if node is not None and node.id else "")
        raise UsageError(f"{path}: byte {exc.offset}: {where}: {exc.message}") from None
    if record == 0:
        raise UsageError(f"{path}: byte 0: empty file, no GlobalMetadata record")
    return trace


def read_et(path: str) -> EtTrace:
    """Read a Chakra ET file (gzip optional); a malformed one raises one `UsageError` line."""
    return parse_et_bytes(load_bytes(path), path)


# --- encoding ----------------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    value &= U64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _len_field(number: int, payload: bytes) -> bytes:
    return _key(number, LEN) + _varint(len(payload)) + payload


def _to_varint(kind: str, value: Any) -> int:
    if kind in ("sint32", "sint64"):
        bits = 32 if kind == "sint32" else 64
        return ((value << 1) ^ (value >> (bits - 1))) & ((1 << bits) - 1)
    return int(value) & U64


def _scalar_bytes(kind: str, value: Any) -> tuple[int, bytes]:
    """(wire type, encoded value without key)."""
    if kind in VARINT_KINDS:
        return VARINT, _varint(_to_varint(kind, value))
    if kind in FIXED:
        fmt = FIXED[kind]
        return (I64 if struct.calcsize(fmt) == 8 else I32), struct.pack(fmt, value)
    raw = value.encode("utf-8") if kind == "string" else bytes(value)
    return LEN, _varint(len(raw)) + raw


def encode_attr(a: Attr) -> bytes:
    """One AttributeProto."""
    if a.kind not in FIELD_OF_KIND:
        raise UsageError(f"attribute {a.name!r}: unknown kind {a.kind!r}")
    out = bytearray()
    if a.name:
        out += _len_field(1, a.name.encode("utf-8"))
    if a.doc:
        out += _len_field(2, a.doc.encode("utf-8"))
    number = FIELD_OF_KIND[a.kind]
    if not a.is_list:
        wire, raw = _scalar_bytes(a.kind, a.value)
        out += _key(number, wire) + raw
        return bytes(out)
    if a.kind in ("string", "bytes"):
        body = b"".join(_key(1, LEN) + _scalar_bytes(a.kind, v)[1] for v in a.value)
    else:
        packed = b"".join(_scalar_bytes(a.kind, v)[1] for v in a.value)
        body = _len_field(1, packed) if packed else b""
    out += _len_field(number + 1, body)
    return bytes(out)


def _packed_uints(number: int, values: Iterable[int]) -> bytes:
    packed = b"".join(_varint(v) for v in values)
    return _len_field(number, packed) if packed else b""


def encode_node(node: Node) -> bytes:
    """One Node message (proto3: fields at their default value are left out)."""
    out = bytearray()
    if node.id:
        out += _key(1, VARINT) + _varint(node.id)
    if node.name:
        out += _len_field(2, node.name.encode("utf-8"))
    if node.type:
        out += _key(3, VARINT) + _varint(node.type)
    out += _packed_uints(4, node.ctrl_deps) + _packed_uints(5, node.data_deps)
    if node.start_time_micros:
        out += _key(6, VARINT) + _varint(node.start_time_micros)
    if node.duration_micros:
        out += _key(7, VARINT) + _varint(node.duration_micros)
    for number, io in ((8, node.inputs), (9, node.outputs)):
        if io is not None:
            body = b"".join(
                _len_field(i, s.encode("utf-8"))
                for i, s in ((1, io.values), (2, io.shapes), (3, io.types))
                if s
            )
            out += _len_field(number, body)
    for a in node.attrs:
        out += _len_field(10, encode_attr(a))
    return bytes(out)


def encode_metadata(version: str, attrs: Iterable[Attr]) -> bytes:
    """The GlobalMetadata message."""
    out = bytearray(_len_field(1, version.encode("utf-8")) if version else b"")
    for a in attrs:
        out += _len_field(2, encode_attr(a))
    return bytes(out)


def et_bytes(trace: EtTrace) -> bytes:
    """The whole file's bytes (uncompressed): length-prefixed metadata, then nodes."""
    out = bytearray()
    for record in (encode_metadata(trace.version, trace.attrs), *(encode_node(n) for n in trace.nodes)):
        out += _varint(len(record)) + record
    return bytes(out)


def write_et(path: str, trace: EtTrace, compress: bool | None = None) -> None:
    """Write an ET file atomically; gzip when `compress`, or by default when `path` ends in .gz."""
    data = et_bytes(trace)
    if compress if compress is not None else path.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)


# --- text workloads <-> ET ---------------------------------------------------------------------
#
# `workload_to_et` runs the text-workload loop (`training.TrainingLoop`) once against a
# recorder that stands in for the engine: every compute delay becomes a COMP node, every
# collective a COMM_COLL node, every weight update after a collective a COMP node with
# ``themis_overlap`` (a timer, not compute), and each node depends on what its process waited
# for since the process's previous node. The graph therefore runs exactly as the loop does.
# The header and layer table go into the GlobalMetadata (``themis_*`` attributes), so that
# `et_to_workload` gives the text workload back.

ET_VERSION = "0.0.4"  # the schema version ASTRA-sim's own microbenchmark traces carry
CHAKRA_COMM_TYPE = {"all_reduce": 0, "all_gather": 2, "all_to_all": 6, "reduce_scatter": 7}
TEXT_COMM_TYPE = {"all_reduce": "ALLREDUCE", "all_gather": "ALLGATHER", "all_to_all": "ALLTOALL"}
TEXT_COMM_TYPE["reduce_scatter"] = "REDUCESCATTER"


class _Recorded:
    """An event of the recorder: triggered at once; it stands for the nodes that end it."""

    triggered = True
    value = None

    def __init__(self, nodes: frozenset[int]):
        self.nodes = nodes

    def add_callback(self, callback: Any) -> None:  # pragma: no cover - never waited on
        callback(self)


class _Recorder:
    """The engine API a `TrainingLoop` uses (`timeout`, `issue`, `process`), recording nodes."""

    def __init__(self, topology: Any, itemsize: int):
        self.topology, self.itemsize = topology, itemsize
        self.now_ns = 0.0
        self.nodes: list[Node] = []
        self._frontiers: list[set[int]] = [set()]
        self.label = ""
        self.update = ""  # the name of the next timeout when it is a weight update
        self.file_bytes = 0

    def _add(self, name: str, type_: int, attrs: list[Attr], duration_ns: float = 0.0) -> _Recorded:
        node = Node(id=len(self.nodes), name=name, type=type_, ctrl_deps=sorted(self._frontiers[-1]))
        node.duration_micros = int(round(duration_ns / 1e3))
        node.attrs = attrs
        self.nodes.append(node)
        return _Recorded(frozenset({node.id}))

    def timeout(self, delay_ns: float) -> _Recorded:
        name, self.update = self.update or "compute", ""
        attrs = [Attr("is_cpu_op", "bool", False), Attr("themis_duration_ns", "double", float(delay_ns))]
        if name != "compute":
            attrs.append(Attr("themis_overlap", "bool", True))
        return self._add(name, COMP_NODE, attrs, delay_ns)

    def issue(self, collective: Any, orders: Any, *args: Any, **kwargs: Any) -> _Recorded:
        involved = [d in collective.dims for d in range(len(self.topology.dims))]
        attrs = [
            Attr("is_cpu_op", "bool", False),
            Attr("comm_type", "int64", CHAKRA_COMM_TYPE[collective.op]),
            Attr("comm_size", "int64", self.file_bytes),
            Attr("involved_dim", "bool", involved, is_list=True),
        ]
        return self._add(self.label, COMM_COLL_NODE, attrs)

    def process(self, generator: Any) -> _Recorded:
        self._frontiers.append(set(self._frontiers[-1]))
        try:
            event = next(generator)
            while True:
                self._wait(event)
                event = generator.send(None)
        except StopIteration:
            pass
        return _Recorded(frozenset(self._frontiers.pop()))

    def _wait(self, event: _Recorded) -> None:
        frontier = self._frontiers[-1]
        for n in event.nodes:  # what the new nodes depend on already needs no edge of its own
            frontier.difference_update(self.nodes[n].ctrl_deps)
        frontier.update(event.nodes)


def workload_to_et(workload: Any, topology: Any, iterations: int = 1, path: str = "") -> EtTrace:
    """The ET graph of `iterations` training iterations of a text workload on a topology.

    The topology decides which dims each collective involves (``involved_dim``); a transformer
    whose model-parallel group splits a dim records the split topology's dims and its group
    (``themis_model_parallel_group``), so the replay splits the same way. Compute times keep
    their nanoseconds in ``themis_duration_ns`` (``duration_micros`` is rounded, for other
    tools). Collective sizes are the file's bytes per NPU (an all-gather's input).
    """
    from .training import TrainingLoop, TrainingSpec

    fitted = workload.fit_topology(topology)
    spec = TrainingSpec(chunks=1, iterations=iterations)
    recorder = _Recorder(fitted, 4)

    class Loop(TrainingLoop):
        def _issue(self, engine: Any, layer: Any, phase: str) -> Any:
            recorder.label = f"{layer.name}.{phase}"
            recorder.file_bytes = layer.phase(phase).size_bytes
            return super()._issue(engine, layer, phase)

        def _finished(self, engine: Any, layer: Any, run: Any) -> Any:
            yield run
            recorder.update = f"{layer.name}.update"
            if layer.update_ns > 0:
                yield engine.timeout(layer.update_ns)
            recorder.update = ""

    class AnySchedule(dict):
        """Every collective's schedule: none matters, the recorder only notes the collective."""

        def __missing__(self, key: Any) -> Any:
            return types.SimpleNamespace(orders=None, fuse_last=False, bounds=None, intra="")

    loop = Loop(workload, fitted, spec, AnySchedule())
    recorder.process(loop.process(recorder))  # type: ignore[arg-type]
    attrs = [
        Attr("themis_source", "string", os.path.basename(workload.path)),
        Attr("themis_iterations", "int64", iterations),
        Attr("themis_topology", "string", fitted.spec()),
        Attr("themis_parallelism", "string", workload.parallelism),
        Attr(
            "themis_layers",
            "string",
            [_layer_line(workload, layer) for layer in workload.layers],
            is_list=True,
        ),
    ]
    if workload.model_parallel_group is not None:
        attrs.append(Attr("themis_model_parallel_group", "int64", workload.model_parallel_group))
    if workload.dlrm_last_bottom_layer is not None:
        attrs.append(Attr("themis_dlrm_last_bottom_layer", "int64", workload.dlrm_last_bottom_layer))
    if workload.parallelism == "HYBRID_TRANSFORMER_FWD_IN_BCKWD":
        attrs.append(Attr("themis_checkpoints", "int64", list(workload.checkpoints), is_list=True))
        attrs.append(
            Attr("themis_checkpoint_initiates", "int64", list(workload.checkpoint_initiates), is_list=True)
        )
    return EtTrace(path, ET_VERSION, attrs, recorder.nodes)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _layer_line(workload: Any, layer: Any) -> str:
    cells = [layer.name, "-1"]
    for phase in (layer.fwd, layer.ig, layer.wg):
        kind = TEXT_COMM_TYPE[phase.op] if phase.op else "NONE"
        cells += [_number(phase.compute_ns), kind, str(phase.size_bytes)]
    cells.append(_number(layer.update_ns))
    if workload.parallelism == "HYBRID_CUSTOMIZED":
        cells.append(layer.policy)
    return "\t".join(cells)


def et_to_workload_text(trace: EtTrace) -> str:
    """The text workload an ET converted by `workload_to_et` came from.

    Only such a file can be turned back: a general execution graph has no layer table. Other
    files are refused with one line.
    """
    parallelism = trace.attr("themis_parallelism")
    layers = trace.attr("themis_layers")
    if not isinstance(parallelism, str) or not isinstance(layers, list):
        raise UsageError(
            f"{trace.path}: not converted from a text workload (no themis_parallelism/themis_layers "
            "metadata), so it has no layer table to write"
        )
    header = parallelism
    group = trace.attr("themis_model_parallel_group")
    if parallelism.startswith("HYBRID_TRANSFORMER"):
        header += f"\tmodel_parallel_NPU_group: {group}"
        if parallelism == "HYBRID_TRANSFORMER_FWD_IN_BCKWD":
            checkpoints = trace.attr("themis_checkpoints", [])
            initiates = trace.attr("themis_checkpoint_initiates", [])
            header += f" checkpoints: {len(checkpoints)} " + " ".join(map(str, checkpoints))
            header += f" checkpoint_initiates: {len(initiates)} " + " ".join(map(str, initiates))
    elif parallelism.startswith("HYBRID_DLRM"):
        header += f"\t{trace.attr('themis_dlrm_last_bottom_layer')}"
    return "\n".join([header, str(len(layers)), *layers]) + "\n"
