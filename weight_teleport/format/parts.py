"""Versions made of parts (docs/FORMAT.md, "Versions made of parts"): a version published by
several writers, each pack covering boxes of checkpoint tensors. Parsing and the geometry
checks, plain Python."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from weight_teleport.errors import ManifestError
from weight_teleport.store.errors import InvalidKey
from weight_teleport.store.keys import validate_key

MAX_INT = (1 << 63) - 1
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")
_PART_FIELDS = {"key", "size", "sha256", "covers", "piece_bytes"}

Box = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Part:
    """One writer's pack of a version."""

    key: str
    size: int
    sha256: str
    """The pack's content hash (`store.hashing.object_hash` with `piece_bytes`)."""
    covers: tuple[tuple[str, Box], ...]
    """(name, box) of each record the pack holds, in the pack's record order."""
    piece_bytes: int = 0

    def to_doc(self) -> dict:
        doc = {
            "key": self.key,
            "size": self.size,
            "sha256": self.sha256,
            "covers": [[name, [list(b) for b in box]] for name, box in self.covers],
        }
        if self.piece_bytes:
            doc["piece_bytes"] = self.piece_bytes
        return doc


def _count(value: object, what: str, low: int = 0) -> int:
    if type(value) is not int or not low <= value <= MAX_INT:
        raise ManifestError(f"{what} {str(value)[:40]!r} is not an integer in [{low}, 2^63)")
    return value


def parse_part(raw: object, where: str, check_piece) -> Part:
    """A part of an entry, every field checked; `check_piece(piece_bytes, where)` the
    manifest's rule for piece sizes."""
    if not isinstance(raw, dict):
        raise ManifestError(f"{where}: a part is a {type(raw).__name__}, not an object")
    missing, unknown = {"key", "size", "sha256", "covers"} - raw.keys(), raw.keys() - _PART_FIELDS
    if missing or unknown:
        raise ManifestError(f"{where}: a part misses {sorted(missing)} or has unknown {sorted(unknown)[:5]}")
    try:
        validate_key(raw["key"])
    except InvalidKey as exc:
        raise ManifestError(f"{where}: {exc}") from None
    sha = raw["sha256"]
    if not isinstance(sha, str) or not _SHA256.match(sha):
        raise ManifestError(f"{where}: part sha256 {str(sha)[:80]!r} is not 64 lowercase hex digits")
    covers = raw["covers"]
    if not isinstance(covers, list):
        raise ManifestError(f"{where}: covers is a {type(covers).__name__}, not a list")
    piece = _count(raw.get("piece_bytes", 0), f"{where}: piece_bytes")
    check_piece(piece, where)
    return Part(
        raw["key"], _count(raw["size"], f"{where}: size", 1), sha, tuple(_cover(c, where) for c in covers), piece
    )


def _cover(raw: object, where: str) -> tuple[str, Box]:
    if not (isinstance(raw, list) and len(raw) == 2 and isinstance(raw[0], str) and isinstance(raw[1], list)):
        raise ManifestError(f"{where}: a cover is not [name, box] ({str(raw)[:80]})")
    box = []
    for pair in raw[1]:
        if not (isinstance(pair, list) and len(pair) == 2):
            raise ManifestError(f"{where}: the box of {raw[0][:100]!r} is not [offset, extent] pairs")
        box.append((_count(pair[0], f"{where}: an offset"), _count(pair[1], f"{where}: an extent")))
    return raw[0], tuple(box)


def check_covers(parts: tuple[Part, ...], where: str) -> None:
    """ManifestError where a tensor's boxes across the parts overlap, differ in rank, or
    a part lists a tensor twice. (That they cover each tensor whole is checked against the
    packs' shapes: `check_whole`.)"""
    by_name: dict[str, list[Box]] = {}
    for p in parts:
        names = [n for n, _ in p.covers]
        if len(set(names)) != len(names):
            raise ManifestError(f"{where}: part {p.key!r} lists a tensor twice")
        for name, box in p.covers:
            by_name.setdefault(name, []).append(box)
    for name, boxes in by_name.items():
        if len({len(b) for b in boxes}) != 1:
            raise ManifestError(f"{where}: the boxes of {name!r} have different ranks")
        for i, a in enumerate(boxes):
            for b in boxes[i + 1 :]:
                if _overlap(a, b):
                    raise ManifestError(f"{where}: the boxes {a} and {b} of {name!r} overlap")


def check_whole(parts: tuple[Part, ...], shapes: dict[str, tuple[int, ...]], where: str) -> None:
    """ManifestError unless the (disjoint) boxes of each tensor lie inside its shape and
    add up to all of its elements."""
    covered: dict[str, int] = {}
    for p in parts:
        for name, box in p.covers:
            shape = shapes[name]
            if len(box) != len(shape) or any(o + e > d for (o, e), d in zip(box, shape)):
                raise ManifestError(f"{where}: box {box} of {name!r} is not inside its shape {shape}")
            covered[name] = covered.get(name, 0) + math.prod(e for _, e in box)
    short = [n for n, c in covered.items() if c != math.prod(shapes[n])]
    if short:
        raise ManifestError(
            f"{where}: the parts do not cover tensor {short[0]!r} whole "
            f"({covered[short[0]]} of {math.prod(shapes[short[0]])} elements)"
        )


def _overlap(a: Box, b: Box) -> bool:
    return all(max(oa, ob) < min(oa + ea, ob + eb) for (oa, ea), (ob, eb) in zip(a, b))
