"""MSCCL-IR, the XML algorithm format RCCL and MSCCL run, as typed dataclasses: read and written.

The format as RCCL's parser reads it (``src/misc/msccl/msccl_parser.cc``) and msccl-tools writes
it (``msccl/language/ir.py``), in our words (docs/custom-algorithms.md has the whole story):

- ``<algo name coll ngpus nchannels nchunksperloop proto inplace [outofplace minBytes maxBytes]>``
  holds one ``<gpu id i_chunks o_chunks s_chunks>`` per GPU: its input, output and scratch
  buffers, counted in chunks of ``size / nchunksperloop`` (the size of the larger buffer).
- A GPU holds ``<tb id send recv chan>`` threadblocks: at most one peer it sends to and one it
  receives from, on a channel; a threadblock runs its ``<step>`` elements in order.
- ``<step s type srcbuf srcoff dstbuf dstoff cnt depid deps hasdep>``: ``cnt`` chunks from
  ``srcbuf[srcoff]`` and/or to ``dstbuf[dstoff]``; ``depid``/``deps`` name a step of another
  threadblock of the GPU that must be done first (-1: none); ``hasdep`` says the step signals
  when done (RCCL sets a flag only then; a waiting step waits for the flag to reach its step).

Reading is bounded (file size, element depth and counts) and refuses any DTD, so no entity can
expand. Any mistake is one `UsageError` line naming the file, GPU, threadblock and step.
"""

from __future__ import annotations

import os
import xml.parsers.expat as expat
from dataclasses import asdict, dataclass

from ..errors import UsageError
from ..output import write_text

SEND, RECV, RECV_COPY_SEND, RECV_REDUCE_SEND = "s", "r", "rcs", "rrs"
RECV_REDUCE_COPY, RECV_REDUCE_COPY_SEND, COPY, REDUCE, NOP = "rrc", "rrcs", "cpy", "re", "nop"
STEP_TYPES = (
    SEND,
    RECV,
    RECV_COPY_SEND,
    RECV_REDUCE_SEND,
    RECV_REDUCE_COPY,
    RECV_REDUCE_COPY_SEND,
    COPY,
    REDUCE,
    NOP,
)
SENDS = frozenset({SEND, RECV_COPY_SEND, RECV_REDUCE_SEND, RECV_REDUCE_COPY_SEND})
RECEIVES = frozenset({RECV, RECV_COPY_SEND, RECV_REDUCE_SEND, RECV_REDUCE_COPY, RECV_REDUCE_COPY_SEND})
REDUCES = frozenset({RECV_REDUCE_SEND, RECV_REDUCE_COPY, RECV_REDUCE_COPY_SEND, REDUCE})
READS_SRC = frozenset({SEND, RECV_REDUCE_SEND, RECV_REDUCE_COPY, RECV_REDUCE_COPY_SEND, COPY, REDUCE})
WRITES_DST = frozenset({RECV, RECV_COPY_SEND, RECV_REDUCE_COPY, RECV_REDUCE_COPY_SEND, COPY, REDUCE})
INPUT, OUTPUT, SCRATCH = "i", "o", "s"
BUFFER_NAMES = {INPUT: "input", OUTPUT: "output", SCRATCH: "scratch"}
PROTOCOLS = ("LL", "LL128", "Simple")

# Bounds of what the reader takes (RCCL's own are smaller: 256 steps per threadblock, 72 chunks
# per step); they keep a hostile file from taking the machine's memory or time.
MAX_FILE_BYTES = 64 * 2**20
MAX_GPUS = 2**16
MAX_ELEMENTS = 4 * 2**20  # gpu + tb + step elements
MAX_CHUNKS = 2**24  # nchunksperloop and any buffer, in chunks


@dataclass(frozen=True)
class Collective:
    """What a ``coll`` computes and its buffers, in chunks of a loop of C chunks over P GPUs.

    Attributes:
        name: the canonical name (allreduce, allgather, reduce_scatter, alltoall, reduce,
            broadcast).
        xml: the spelling RCCL's parser takes (``reducescatter`` for reduce_scatter).
        op: themis-mpi's name of the operation (``all_reduce``...), "" where it has none.
        input_whole: the input holds C chunks (else C/P: an all-gather's).
        output_whole: the output holds C chunks (else C/P: a reduce-scatter's).
    """

    name: str
    xml: str
    op: str
    input_whole: bool = True
    output_whole: bool = True

    def chunks(self, nchunks: int, ngpus: int) -> tuple[int, int]:
        """(input, output) chunks of one GPU."""
        block = nchunks // ngpus
        return (nchunks if self.input_whole else block), (nchunks if self.output_whole else block)

    @property
    def per_gpu(self) -> bool:
        """Whether the loop's chunks are split in one block per GPU (nchunksperloop % ngpus == 0)."""
        return self.name in ("allgather", "reduce_scatter", "alltoall")


COLLECTIVES = {
    c.name: c
    for c in (
        Collective("allreduce", "allreduce", "all_reduce"),
        Collective("allgather", "allgather", "all_gather", input_whole=False),
        Collective("reduce_scatter", "reducescatter", "reduce_scatter", output_whole=False),
        Collective("alltoall", "alltoall", "all_to_all"),
        Collective("reduce", "reduce", ""),
        Collective("broadcast", "broadcast", ""),
    )
}
COLL_ALIASES = {"reducescatter": "reduce_scatter"}
ROOT = 0  # the root of a reduce or a broadcast
ANY_BYTES = 2**63 - 1  # maxBytes of a file for every size: RCCL's parser needs minBytes and maxBytes


@dataclass(frozen=True)
class Step:
    """One ``<step>``: an operation on ``cnt`` chunks, in its threadblock's order."""

    s: int
    type: str
    srcbuf: str
    srcoff: int
    dstbuf: str
    dstoff: int
    cnt: int
    depid: int = -1
    deps: int = -1
    hasdep: bool = False

    @property
    def sends(self) -> bool:
        """Whether the step sends to the threadblock's send peer."""
        return self.type in SENDS

    @property
    def receives(self) -> bool:
        """Whether the step receives from the threadblock's receive peer."""
        return self.type in RECEIVES


@dataclass(frozen=True)
class Threadblock:
    """One ``<tb>``: its peers (-1: none) and channel, and its steps in order."""

    id: int
    send: int
    recv: int
    chan: int
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class Gpu:
    """One ``<gpu>``: its buffers' sizes in chunks and its threadblocks."""

    id: int
    i_chunks: int
    o_chunks: int
    s_chunks: int
    threadblocks: tuple[Threadblock, ...]

    def chunks(self, buffer: str) -> int:
        """The declared size of a buffer (``i``, ``o`` or ``s``) in chunks."""
        return {INPUT: self.i_chunks, OUTPUT: self.o_chunks, SCRATCH: self.s_chunks}[buffer]


@dataclass(frozen=True)
class Algorithm:
    """One ``<algo>``: an MSCCL algorithm for `ngpus` GPUs.

    Attributes:
        name: its name.
        coll: the canonical collective name (`COLLECTIVES`).
        ngpus: GPUs it runs on.
        nchannels: channels its threadblocks use.
        nchunksperloop: chunks of the larger buffer (C).
        proto: LL, LL128 or Simple.
        inplace: whether it runs in place (output and input share memory).
        outofplace: whether it runs out of place (absent in the file: not inplace).
        min_bytes: smallest size RCCL would pick it for (None: any).
        max_bytes: largest size (None: any).
        gpus: one per GPU, in the order of their ids (the reader sorts GPUs and threadblocks).
    """

    name: str
    coll: str
    ngpus: int
    nchannels: int
    nchunksperloop: int
    proto: str
    inplace: bool
    outofplace: bool
    gpus: tuple[Gpu, ...]
    min_bytes: int | None = None
    max_bytes: int | None = None

    @property
    def collective(self) -> Collective:
        """The collective's semantics."""
        return COLLECTIVES[self.coll]

    @property
    def placements(self) -> tuple[bool, ...]:
        """The placements it runs in: True for in place, False for out of place."""
        return tuple(p for p, ok in ((True, self.inplace), (False, self.outofplace)) if ok)

    def n_steps(self) -> int:
        """Steps of all GPUs."""
        return sum(len(tb.steps) for g in self.gpus for tb in g.threadblocks)

    def to_dict(self) -> dict:
        """The algorithm as plain data (JSON)."""
        return asdict(self)


def where(gpu: int, tb: int | None = None, step: int | None = None) -> str:
    """``GPU g threadblock t step s``: how every message names a place."""
    text = f"GPU {gpu}"
    if tb is not None:
        text += f" threadblock {tb}"
    if step is not None:
        text += f" step {step}"
    return text


class _Reader:
    """Expat callbacks that build the dataclasses, bounded, with a DTD refused."""

    NESTING = {"algo": None, "gpu": "algo", "tb": "gpu", "step": "tb"}

    def __init__(self, source: str):
        self.source = source
        self.stack: list[str] = []
        self.algo: dict | None = None
        self.gpus: list[dict] = []
        self.elements = 0
        self.parser = expat.ParserCreate()
        self.parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
        self.parser.StartDoctypeDeclHandler = self._dtd
        self.parser.EntityDeclHandler = self._dtd
        self.parser.StartElementHandler = self._start
        self.parser.EndElementHandler = self._end

    def fail(self, what: str) -> UsageError:
        return UsageError(f"{self.source}: {what}")

    def _dtd(self, *_) -> None:
        raise self.fail(f"line {self.parser.CurrentLineNumber}: a DTD or entity declaration (refused)")

    def _place(self) -> str:
        parts = []
        if self.gpus:
            gpu = self.gpus[-1]
            parts.append(f"GPU {gpu.get('id', '?')}")
            if "tb" in self.stack and gpu["tbs"]:
                parts.append(f"threadblock {gpu['tbs'][-1].get('id', '?')}")
        return " ".join(parts) or "<algo>"

    def _int(self, attrs: dict, key: str, default: int | None = None) -> int:
        if key not in attrs:
            if default is not None:
                return default
            raise self.fail(
                f"{self._place()} (line {self.parser.CurrentLineNumber}): missing attribute {key}"
            )
        text = attrs[key].strip()
        if not (text.lstrip("-").isdigit() and len(text) <= 19):
            raise self.fail(
                f"{self._place()} (line {self.parser.CurrentLineNumber}): {key}={attrs[key]!r} "
                "is not an integer"
            )
        return int(text)

    def _str(self, attrs: dict, key: str, choices) -> str:
        if key not in attrs:
            raise self.fail(
                f"{self._place()} (line {self.parser.CurrentLineNumber}): missing attribute {key}"
            )
        if attrs[key] not in choices:
            raise self.fail(
                f"{self._place()} (line {self.parser.CurrentLineNumber}): {key}={attrs[key]!r} is not one of "
                f"{', '.join(choices)}"
            )
        return attrs[key]

    def _start(self, name: str, attrs: dict) -> None:
        parent = self.stack[-1] if self.stack else None
        if name not in self.NESTING or self.NESTING[name] != parent:
            inside = f"inside <{parent}>" if parent else "at the top"
            raise self.fail(
                f"line {self.parser.CurrentLineNumber}: unexpected element <{name}> {inside} "
                "(MSCCL-IR as RCCL reads it: <algo>, <gpu>, <tb>, <step>)"
            )
        self.stack.append(name)
        if name == "algo":
            if self.algo is not None:
                raise self.fail(f"line {self.parser.CurrentLineNumber}: a second <algo>")
            self.algo = dict(attrs)
            return
        self.elements += 1
        if self.elements > MAX_ELEMENTS:
            raise self.fail(f"more than {MAX_ELEMENTS} gpu, tb and step elements")
        if name == "gpu":
            self.gpus.append({"id": attrs.get("id", "?"), "tbs": []})
            gpu = self.gpus[-1]
            gpu["id"] = self._int(attrs, "id")
            for key in ("i_chunks", "o_chunks", "s_chunks"):
                gpu[key] = self._int(attrs, key)
        elif name == "tb":
            tbs = self.gpus[-1]["tbs"]
            tbs.append({"id": attrs.get("id", "?"), "steps": []})
            for key in ("id", "send", "recv", "chan"):
                tbs[-1][key] = self._int(attrs, key)
        else:
            tb = self.gpus[-1]["tbs"][-1]
            s, hasdep = self._int(attrs, "s"), self._int(attrs, "hasdep", 0)
            if hasdep not in (0, 1):
                raise self.fail(f"{self._place()} step {s}: hasdep={hasdep} is not 0 or 1")
            step = Step(
                s=s,
                type=self._str(attrs, "type", STEP_TYPES),
                srcbuf=self._str(attrs, "srcbuf", tuple(BUFFER_NAMES)),
                srcoff=self._int(attrs, "srcoff"),
                dstbuf=self._str(attrs, "dstbuf", tuple(BUFFER_NAMES)),
                dstoff=self._int(attrs, "dstoff"),
                cnt=self._int(attrs, "cnt"),
                depid=self._int(attrs, "depid", -1),
                deps=self._int(attrs, "deps", -1),
                hasdep=hasdep == 1,
            )
            tb["steps"].append(step)

    def _end(self, name: str) -> None:
        self.stack.pop()

    def algorithm(self, data: bytes) -> Algorithm:
        try:
            self.parser.Parse(data, True)
        except expat.ExpatError as exc:
            raise self.fail(f"not well-formed XML: {exc}") from None
        if self.algo is None:
            raise self.fail("no <algo> element")
        return self._build(self.algo)

    def _build(self, attrs: dict) -> Algorithm:
        def number(key: str, lo: int, hi: int, default: int | None = None) -> int:
            value = self._int(attrs, key, default)
            if not lo <= value <= hi:
                raise self.fail(f"<algo> {key}={value} is out of range ({lo}..{hi})")
            return value

        coll_text = attrs.get("coll", "")
        coll = COLL_ALIASES.get(coll_text, coll_text)
        if coll not in COLLECTIVES:
            names = ", ".join(c.xml for c in COLLECTIVES.values())
            raise self.fail(f"<algo> coll={coll_text!r} is not one of {names}")
        ngpus = number("ngpus", 1, MAX_GPUS)
        nchunks = number("nchunksperloop", 1, MAX_CHUNKS)
        inplace = number("inplace", 0, 1) == 1
        min_bytes = self._int(attrs, "minBytes") if "minBytes" in attrs else None
        max_bytes = self._int(attrs, "maxBytes") if "maxBytes" in attrs else None
        gpus = tuple(
            Gpu(
                g["id"],
                g["i_chunks"],
                g["o_chunks"],
                g["s_chunks"],
                tuple(
                    Threadblock(t["id"], t["send"], t["recv"], t["chan"], tuple(t["steps"]))
                    for t in sorted(g["tbs"], key=lambda t: t["id"])
                ),
            )
            for g in sorted(self.gpus, key=lambda g: g["id"])
        )
        return Algorithm(
            name=attrs.get("name", ""),
            coll=coll,
            ngpus=ngpus,
            nchannels=number("nchannels", 1, MAX_CHUNKS),
            nchunksperloop=nchunks,
            proto=self._str(attrs, "proto", PROTOCOLS),
            inplace=inplace,
            outofplace=number("outofplace", 0, 1, 0 if inplace else 1) == 1,
            gpus=gpus,
            min_bytes=min_bytes,
            max_bytes=max_bytes,
        )


def parse_algorithm(data: bytes | str, source: str = "<xml>") -> Algorithm:
    """An algorithm from MSCCL-IR text; `source` names it in messages."""
    if isinstance(data, str):
        data = data.encode()
    if len(data) > MAX_FILE_BYTES:
        raise UsageError(f"{source}: larger than {MAX_FILE_BYTES >> 20} MiB")
    return _Reader(source).algorithm(data)


def read_algorithm(path: str) -> Algorithm:
    """An algorithm from an MSCCL-IR file (as RCCL's parser reads it), bounded in size."""
    try:
        size = os.path.getsize(path)
        if size > MAX_FILE_BYTES:
            raise UsageError(f"{path}: {size} B is larger than {MAX_FILE_BYTES >> 20} MiB")
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    return parse_algorithm(data, path)


def to_xml(algo: Algorithm) -> str:
    """The algorithm as MSCCL-IR text, in the attribute order msccl-tools writes."""
    head = {
        "name": algo.name,
        "proto": algo.proto,
        "nchannels": algo.nchannels,
        "nchunksperloop": algo.nchunksperloop,
        "ngpus": algo.ngpus,
        "coll": algo.collective.xml,
        "inplace": int(algo.inplace),
        "outofplace": int(algo.outofplace),
    }
    if algo.min_bytes is not None:
        head["minBytes"] = algo.min_bytes
    if algo.max_bytes is not None:
        head["maxBytes"] = algo.max_bytes

    from xml.sax.saxutils import quoteattr  # (here: it imports urllib.request, 15 ms of every start)

    def element(tag: str, attrs: dict, close: bool = False) -> str:
        text = " ".join(f"{k}={quoteattr(str(v))}" for k, v in attrs.items())
        return f"<{tag} {text}{'/' if close else ''}>"

    lines = [element("algo", head)]
    for gpu in algo.gpus:
        lines.append(
            "  "
            + element(
                "gpu",
                {"id": gpu.id, "i_chunks": gpu.i_chunks, "o_chunks": gpu.o_chunks, "s_chunks": gpu.s_chunks},
            )
        )
        for tb in gpu.threadblocks:
            lines.append(
                "    " + element("tb", {"id": tb.id, "send": tb.send, "recv": tb.recv, "chan": tb.chan})
            )
            for st in tb.steps:
                attrs = {k: v for k, v in asdict(st).items() if k != "hasdep"}
                attrs["hasdep"] = int(st.hasdep)
                lines.append("      " + element("step", attrs, close=True))
            lines.append("    </tb>")
        lines.append("  </gpu>")
    lines.append("</algo>")
    return "\n".join(lines) + "\n"


def write_algorithm(path: str, algo: Algorithm) -> None:
    """Write the algorithm as an MSCCL-IR file (atomically)."""
    write_text(path, to_xml(algo))


def summary(algo: Algorithm) -> str:
    """One line about an algorithm: what it computes, on how many GPUs, its shape."""
    place = " and ".join("in place" if p else "out of place" for p in algo.placements)
    window = ""
    if (algo.min_bytes or 0) > 0 or algo.max_bytes not in (None, ANY_BYTES):
        top = "any" if algo.max_bytes in (None, ANY_BYTES) else algo.max_bytes
        window = f", picked by RCCL for {algo.min_bytes or 0}..{top} B"
    tbs = sum(len(g.threadblocks) for g in algo.gpus)
    return (
        f"{algo.name or 'unnamed'}: {algo.coll} on {algo.ngpus} GPUs, {algo.nchunksperloop} chunks per loop, "
        f"{algo.nchannels} channel{'s' if algo.nchannels > 1 else ''}, {algo.proto}, {place}{window}; "
        f"{tbs} threadblocks, {algo.n_steps()} steps"
    )
