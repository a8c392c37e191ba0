"""Hostile packs, crafted byte by byte: valid containers (CRCs recomputed) around headers,
chunk tables and zstd frames that lie. Used by tests/codec/test_hostile_packs.py; run as a script
it is the child process whose peak memory that test measures:

    python hostile.py baseline|hostile DIR

decodes the packs in DIR (written by `write_packs`) and prints one JSON line per pack: the
error raised (its class name, or null) and the process's VmHWM so far."""

import json
import struct
import sys
import zlib
from pathlib import Path

import torch
import zstandard

import weight_teleport as wt
from weight_teleport.codec import inspect
from weight_teleport.errors import WeightTeleportError
from weight_teleport.format import Group, Stream, container, read_groups, write_groups

BLOCK = 1 << 17
"""zstd's largest block."""
GIB = 1 << 30
SPARSE_ELEMS = 1 << 22
"""Elements of the state the sparse packs patch: one chunk of the largest size."""


def frame(parts: list, declared: int | None = None) -> bytes:
    """A zstd frame made by hand: `parts` are bytes (raw blocks) or (byte, count) runs (RLE
    blocks, 4 bytes for 128 KiB); `declared`: the content size its header declares (None:
    none, and a 128 KiB window)."""
    if declared is None:
        out = bytearray(struct.pack("<IBB", 0xFD2FB528, 0x00, 7 << 3))
    else:
        out = bytearray(struct.pack("<IBQ", 0xFD2FB528, 0xE0, declared))
    blocks = []
    for p in parts:
        if isinstance(p, tuple):
            byte, n = p
            blocks += [(1, min(BLOCK, n - i), bytes([byte])) for i in range(0, n, BLOCK)]
        else:
            blocks += [(0, len(p[i : i + BLOCK]), p[i : i + BLOCK]) for i in range(0, len(p), BLOCK)]
    for j, (kind, size, content) in enumerate(blocks):
        out += ((size << 3) | (kind << 1) | (j == len(blocks) - 1)).to_bytes(3, "little") + content
    return bytes(out)


def framed(header: dict | bytes, payload: bytes = b"", compress: bool | bytes = False) -> bytes:
    """A container around `header` (a dict as compact JSON, or the JSON's bytes) and
    `payload`, its CRC recomputed. `compress`: store the header as a zstd frame (bytes: that
    frame, as given)."""
    head = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    if compress is True:
        head = zstandard.ZstdCompressor(level=3).compress(head)
    elif compress:
        head = compress
    flags = container.FLAG_HEADER_ZSTD if compress else 0
    pre = container.PREAMBLE.pack(
        container.MAGIC, container.FORMAT_VERSION, flags, len(head), zlib.crc32(head), len(payload)
    )
    return pre + head + payload


def header_json(pack: bytes) -> dict:
    """The header of a pack as a JSON object."""
    _, _, flags, hlen, _, _ = container.PREAMBLE.unpack_from(pack, 0)
    head = pack[container.PREAMBLE.size : container.PREAMBLE.size + hlen]
    if flags & container.FLAG_HEADER_ZSTD:
        head = zstandard.ZstdDecompressor().decompress(head)
    return json.loads(head)


def chunks_of(pack: bytes) -> dict[str, list[bytes]]:
    """Each tensor's chunks' bytes."""
    h = container.read_header(pack)
    return {t.name: [bytes(container.chunk_payload(pack, h, c)) for c in t.chunks] for t in h.tensors}


def with_chunks(header: dict, chunks: dict[str, list[bytes]]) -> tuple[dict, bytes]:
    """(`header` with each record's chunk references pointing at `chunks` laid end to end,
    the payload)."""
    payload, at = bytearray(), 0
    for rec in header["tensors"]:
        rec["chunks"] = []
        for data in chunks.get(rec["name"], []):
            rec["chunks"].append([at, len(data), zlib.crc32(data)])
            payload += data
            at += len(data)
        if not rec["chunks"]:
            del rec["chunks"]
    return header, bytes(payload)


def snapshot_u8(n: int) -> bytes:
    """An honest snapshot of one uint8 tensor of `n` elements."""
    return wt.encode_snapshot({"w": torch.arange(n, dtype=torch.uint8)}, version=1, chunk_elems=4096)


def sparse_state() -> dict:
    return {"w": (torch.arange(SPARSE_ELEMS) % 251).to(torch.uint8)}


def sparse_delta() -> bytes:
    """An honest delta of a few changes to `sparse_state`."""
    old = sparse_state()
    new = {"w": old["w"].clone()}
    new["w"][::4099] += 1
    return wt.encode_delta(old, new, base_version=1, version=2, chunk_elems=SPARSE_ELEMS)


def stream_frame_of_a_gib() -> bytes:
    """A snapshot whose one plane is a 32 KB zstd frame that declares and holds 1 GiB."""
    honest = snapshot_u8(4096)
    groups = [Group(4096, [Stream(1, 4096, frame([(0, GIB)], declared=GIB))])]
    return framed(*with_chunks(header_json(honest), {"w": [write_groups(groups)]}))


def header_frame_of_a_gib() -> bytes:
    """An honest snapshot whose header is a zstd frame of the JSON and a GiB of spaces."""
    honest = snapshot_u8(4096)
    text = json.dumps(header_json(honest), separators=(",", ":")).encode()
    head = frame([text, (ord(" "), GIB)], declared=len(text) + GIB)
    return framed(text, honest[container.read_header(honest).payload_offset :], compress=head)


def million_chunks(n: int = 2_000_000) -> bytes:
    """A 1 KB pack whose compressed header lists `n` chunks, all the payload's one byte."""
    rec = {
        "name": "w",
        "dtype": "uint8",
        "shape": [8 * n],
        "codec": "dense_values",
        "digest": "0" * 16,
        "changed": 8 * n,
        "chunks": [],
    }
    head = {
        "kind": "snapshot",
        "version": 1,
        "base_version": None,
        "chunk_elems": 8,
        "stream_codecs": ["raw"],
        "tensors": [rec],
    }
    before, after = json.dumps(head, separators=(",", ":")).encode().split(b'"chunks":[]')
    text = before + b'"chunks":[' + b"[0,1,0]," * (n - 1) + b"[0,1,0]]" + after
    return framed(text, b"\0", compress=True)


def sparse_events_claim() -> bytes:
    """A delta whose sparse chunk claims 8 events an element, in a 1 KB frame of zeros (each
    a valid event): decoded before its counts were checked, they took 1.3 GB."""
    honest = sparse_delta()
    (chunk,) = chunks_of(honest)["w"]
    count = 8 * SPARSE_ELEMS
    empty = [Stream(0, 0, b"")] * 3
    groups = [Group(count, [Stream(1, count, frame([(0, count)], declared=count)), *empty]) for _ in read_groups(chunk)]
    return framed(*with_chunks(header_json(honest), {"w": [write_groups(groups)]}))


HOSTILE = {
    "stream_frame": (stream_frame_of_a_gib, "decode_snapshot"),
    "header_frame": (header_frame_of_a_gib, "decode_snapshot"),
    "million_chunks": (million_chunks, "inspect"),
    "sparse_events": (sparse_events_claim, "apply_delta"),
}
BASELINE = {
    "stream_frame": (lambda: snapshot_u8(4096), "decode_snapshot"),
    "million_chunks": (lambda: snapshot_u8(1 << 16), "inspect"),
    "sparse_events": (sparse_delta, "apply_delta"),
}


def write_packs(directory: Path, which: dict) -> None:
    for name, (make, _) in which.items():
        (directory / f"{name}.pack").write_bytes(make())


def _peak_kib() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1])
    return -1


def _decode(how: str, pack: bytes) -> None:
    if how == "decode_snapshot":
        wt.decode_snapshot(pack)
    elif how == "inspect":
        inspect(pack)
    else:
        wt.apply_delta(sparse_state(), pack)


def main(mode: str, directory: str) -> None:
    for name, (_, how) in (HOSTILE if mode == "hostile" else BASELINE).items():
        pack = (Path(directory) / f"{name}.pack").read_bytes()
        error = None
        try:
            _decode(how, pack)
        except Exception as e:  # reported, judged by the test
            error = type(e).__name__ if isinstance(e, WeightTeleportError) else f"untyped {type(e).__name__}"
        print(json.dumps({"pack": name, "bytes": len(pack), "error": error, "vm_hwm_kib": _peak_kib()}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
