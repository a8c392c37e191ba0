"""`weight-teleport publish | pull | status`: the pipeline for people and cold starts."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

TOKEN_ENV = "WEIGHT_TELEPORT_TOKEN"
READ_TOKEN_ENV = "WEIGHT_TELEPORT_READ_TOKEN"
INTERRUPTED = 130  # the exit status of a command stopped by Ctrl-C (128 + SIGINT)


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    """Register the pipeline's subcommands on the CLI's subparsers."""
    p = sub.add_parser("publish", help="publish a safetensors checkpoint as the next version")
    p.add_argument("checkpoint", type=Path, help="directory of an HF-style safetensors checkpoint")
    p.add_argument("--to", required=True, dest="url", help="store URL (file://, http://, s3://)")
    p.add_argument("--version", type=int, help="version number (default: the next one)")
    p.add_argument("--anchor-every", type=int, default=16, help="a full snapshot every N versions")
    p.add_argument("--keep-anchors", type=int, default=2, help="anchors kept (0: keep everything)")
    _store_arguments(p)
    p.set_defaults(func=publish_main)
    p = sub.add_parser("pull", help="materialise a version as a safetensors checkpoint")
    p.add_argument("url", help="store URL")
    p.add_argument("--out", required=True, type=Path, help="directory to write model.safetensors to")
    p.add_argument("--version", type=int, help="version to pull (default: the latest)")
    _store_arguments(p)
    p.set_defaults(func=pull_main)
    p = sub.add_parser("status", help="versions, anchors and sizes of a store")
    p.add_argument("url", help="store URL")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")
    _store_arguments(p)
    p.set_defaults(func=status_main)


def _store_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--token-file", type=Path,
                   help=f"file holding the origin's upload token (default: ${TOKEN_ENV})")
    p.add_argument("--read-token-file", type=Path,
                   help=f"file holding the origin's read token, where it wants one "
                        f"(default: ${READ_TOKEN_ENV})")
    p.add_argument("--ca-file", help="PEM certificate of the authority that signed an "
                                     "https:// origin's certificate (default: the system's)")
    p.add_argument("--endpoint-url", help="S3-compatible endpoint for s3:// URLs")


def _secret(path: Path | None, env: str) -> str | None:
    return path.read_text().strip() if path else os.environ.get(env) or None


def _store_config(args: argparse.Namespace):
    from weight_teleport.store import StoreConfig

    return StoreConfig(token=_secret(args.token_file, TOKEN_ENV),
                       read_token=_secret(args.read_token_file, READ_TOKEN_ENV),
                       ca_file=args.ca_file, endpoint_url=args.endpoint_url)


def publish_main(args: argparse.Namespace) -> int:
    """Publish CHECKPOINT as a new version (a delta against the store's latest).

    The store's write access is checked before the checkpoint is read. Ctrl-C cancels:
    nothing more is written, and the message says what was left."""
    from weight_teleport.pipeline import Publisher, PublisherConfig, RetentionConfig
    from weight_teleport.pipeline.checkpoint import load_checkpoint

    from tqdm import tqdm

    with tqdm(unit="B", unit_scale=True, desc="upload") as bar:
        store = _store_config(args)
        store.upload_progress = bar.update
        config = PublisherConfig(anchor_every=args.anchor_every, store=store,
                                 retention=RetentionConfig(keep_anchors=args.keep_anchors))
        publisher = Publisher(args.url, config)
        try:
            r = publisher.publish(load_checkpoint(args.checkpoint), args.version).wait()
        except KeyboardInterrupt:
            bar.close()
            print(f"weight-teleport publish: interrupted; {publisher.cancel()}",
                  file=sys.stderr)
            return INTERRUPTED
        finally:
            publisher.close()
    kinds = "+".join(e.kind for e in r.objects)
    print(f"version {r.version} ({kinds}, base {r.base_version}): {r.wire_bytes / 1e6:.3f} MB "
          f"on the wire for {r.raw_bytes / 1e6:.1f} MB of weights ({r.ratio:.1f}x); "
          f"encode {r.encode_s:.2f} s, upload {r.upload_s:.2f} s")
    return 0


def pull_main(args: argparse.Namespace) -> int:
    """Write a version of the store as OUT/model.safetensors."""
    from tqdm import tqdm

    from weight_teleport.pipeline.checkpoint import save_checkpoint
    from weight_teleport.pipeline.fetch import materialize
    from weight_teleport.pipeline.plan import plan_catchup
    from weight_teleport.store import open_store

    with open_store(args.url, _store_config(args)) as store:
        manifest = _read_manifest(store, args.url)
        plan = plan_catchup(manifest, None, args.version)
        with tqdm(total=plan.nbytes, unit="B", unit_scale=True, desc="pull") as bar:
            state, version = materialize(store, manifest, args.version, progress=bar.update)
    path = save_checkpoint(state, args.out, {"weight_teleport_version": str(version)})
    print(f"version {version}: {len(state)} tensors written to {path} "
          f"({len(plan.steps)} objects, {plan.nbytes / 1e6:.2f} MB fetched)")
    return 0


def _read_manifest(store, url: str):
    from weight_teleport.pipeline.errors import NoPlanError
    from weight_teleport.pipeline.manifest import from_json

    raw = store.get_manifest()
    if raw is None:
        raise NoPlanError(f"{url} holds no manifest: nothing was published there yet")
    return from_json(raw)


def status_main(args: argparse.Namespace) -> int:
    """Print the versions, anchors and object sizes of a store."""
    from weight_teleport.store import open_store

    with open_store(args.url, _store_config(args)) as store:
        manifest = _read_manifest(store, args.url)
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
