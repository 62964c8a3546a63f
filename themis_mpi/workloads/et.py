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

`convert` turns this project's text workloads into ET files and back.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError
from ..output import atomic_path

# NodeType
INVALID_NODE, METADATA_NODE, MEM_LOAD_NODE, MEM_STORE_NODE = 0, 1, 2, 3
COMP_NODE, COMM_SEND_NODE, COMM_RECV_NODE, COMM_COLL_NODE = 4, 5, 6, 7
MAX_ET_BYTES = 1 << 30  # a trace's bytes, inflated: far above any real one, far below this machine's memory
GUNZIP_PIECE_BYTES = 1 << 24  # inflated a piece at a time, so a gzip bomb is caught early
MAX_ET_NODES = 10_000_000

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


def first_attr(attrs: list[Attr], name: str, default: Any = None) -> Any:
    """The value of the first attribute in `attrs` called `name`, else `default`."""
    return next((a.value for a in attrs if a.name == name), default)


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
        return first_attr(self.attrs, name, default)

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
        return first_attr(self.attrs, name, default)

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
        return _gunzip(data, path)
    if len(data) > MAX_ET_BYTES:
        raise UsageError(f"{path}: {len(data)} bytes; a Chakra trace may hold at most {MAX_ET_BYTES}")
    return data


def _gunzip(data: bytes, path: str) -> bytes:
    """Inflate a gzip stream piece by piece, refusing it once it grows past `MAX_ET_BYTES`."""
    inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip's header and trailer
    out = bytearray()
    try:
        pending = data
        while pending:
            out += inflate.decompress(pending, GUNZIP_PIECE_BYTES)
            if len(out) > MAX_ET_BYTES:
                raise UsageError(
                    f"{path}: the gzip stream inflates past {MAX_ET_BYTES} bytes; a Chakra trace may hold at "
                    "most that"
                )
            pending = inflate.unconsumed_tail
        out += inflate.flush()
    except zlib.error as exc:
        raise UsageError(f"{path}: truncated or corrupt gzip stream ({exc})") from None
    if not inflate.eof:
        raise UsageError(f"{path}: truncated or corrupt gzip stream (it ends early)")
    return bytes(out)


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
                if len(trace.nodes) >= MAX_ET_NODES:
                    raise _Malformed(start, f"more than {MAX_ET_NODES} nodes")
                if length == 0:  # (a run of zero bytes is a run of these: refused at the first)
                    raise _Malformed(start, "an empty record (no id, no type) is no Chakra node")
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
