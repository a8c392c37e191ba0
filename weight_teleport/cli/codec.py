"""`weight-teleport inspect | verify`: packs on disk."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def inspect_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("pack", help="path of a pack file")
    p.add_argument("--tensors", action="store_true", help="list every tensor")


def verify_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("packs", nargs="+", help="snapshot pack, then delta packs in order")


def inspect_main(args: argparse.Namespace) -> int:
    from weight_teleport.codec import inspect

    with _naming(args.pack):
        info = inspect(Path(args.pack).read_bytes())
    if not args.tensors:
        info = {k: v for k, v in info.items() if k != "tensors"}
    print(json.dumps(info, indent=2))
    return 0


def verify_main(args: argparse.Namespace) -> int:
    """Apply a chain of packs (a snapshot, then deltas) and check every digest."""
    from weight_teleport.codec import apply_delta, decode_snapshot

    paths = [Path(p) for p in args.packs]
    with _naming(paths[0]):
        state = decode_snapshot(paths[0].read_bytes())
    print(f"{paths[0]}: snapshot ok")
    for p in paths[1:]:
        with _naming(p):
            r = apply_delta(state, p.read_bytes())
        print(f"{p}: version {r.base_version} -> {r.version} ok ({r.elements_changed} elements changed)")
    return 0


@contextmanager
def _naming(path) -> Iterator[None]:
    """A pack's error, of the same type, with the file it came from in front."""
    from weight_teleport.errors import WeightTeleportError

    try:
        yield
    except WeightTeleportError as exc:
        raise type(exc)(f"{path}: {exc}") from None
