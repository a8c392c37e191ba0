"""`weight-teleport status`: what a store holds."""

from __future__ import annotations

import argparse
import json

from weight_teleport.cli.common import add_command, add_store_arguments, store_config


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "status", "versions, anchors and sizes of a store", status_main)
    p.add_argument("url", help="store URL")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")
    add_store_arguments(p)


def status_main(args: argparse.Namespace) -> int:
    """Print the versions, anchors and object sizes of a store."""
    from weight_teleport.cli.pipeline import read_manifest
    from weight_teleport.store import open_store

    with open_store(args.url, store_config(args)) as store:
        manifest = read_manifest(store, args.url)
    if args.json:
        print(json.dumps(json.loads(manifest.to_json()), indent=2))
        return 0
    versions = manifest.versions
    print(f"{args.url}: {len(versions)} versions ({versions[0]}..{versions[-1]}), latest "
          f"{manifest.latest}, anchors {[e.version for e in manifest.anchors]}")
    print(f"{'version':>8} {'kind':>8} {'base':>6} {'bytes':>12} {'of weights':>10}")
    for e in manifest.entries:
        share = f"{e.size / e.raw_bytes:.2%}" if e.raw_bytes else "-"
        base = "-" if e.base is None else str(e.base)
        print(f"{e.version:>8} {e.kind:>8} {base:>6} {e.size:>12,} {share:>10}")
    total = sum(e.size for e in manifest.entries)
    print(f"{len(manifest.entries)} objects, {total / 1e6:.2f} MB stored")
    return 0
