"""`weight-teleport publish | pull`: checkpoints in and out of a store."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from weight_teleport.cli.common import INTERRUPTED, ByteBar, add_store_arguments, store_config


def publish_arguments(p: argparse.ArgumentParser) -> None:
    from weight_teleport.pipeline.config import PublisherConfig as d, RetentionConfig

    p.add_argument("checkpoint", type=Path, help="directory of an HF-style safetensors checkpoint")
    p.add_argument("--to", required=True, dest="url", help="store URL (file://, http://, s3://)")
    p.add_argument("--version", type=int, help="version number (default: the next one)")
    p.add_argument("--anchor-every", type=int, default=d.anchor_every, help="a full snapshot every N versions")
    p.add_argument("--keep-anchors", type=int, default=RetentionConfig.keep_anchors, help="anchors kept (0: keep everything)")
    p.add_argument("--coder", choices=("zstd", "adaptive"), default=d.coder,
                   help="how a delta codes its sparse records (adaptive: smaller, slower on dense steps)")
    add_store_arguments(p)


def pull_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="store URL")
    p.add_argument("--out", required=True, type=Path, help="directory to write model.safetensors to")
    p.add_argument("--version", type=int, help="version to pull (default: the latest)")
    add_store_arguments(p)


def publish_main(args: argparse.Namespace) -> int:
    """Publish CHECKPOINT as a new version (a delta against the store's latest).

    The store's write access is checked before the checkpoint is read. Ctrl-C cancels:
    nothing more is written, and the message says what was left."""
    from weight_teleport.pipeline import Publisher, PublisherConfig, RetentionConfig
    from weight_teleport.pipeline.checkpoint import load_checkpoint, load_side_files

    with ByteBar("upload") as bar:
        store = store_config(args)
        store.upload_progress = bar.update
        config = PublisherConfig(anchor_every=args.anchor_every, store=store, coder=args.coder,
                                 retention=RetentionConfig(keep_anchors=args.keep_anchors))
        publisher = Publisher(args.url, config)
        print(f"weight-teleport publish: {args.checkpoint} to {args.url} (Ctrl-C cancels)",
              file=sys.stderr, flush=True)
        try:
            r = publisher.publish(load_checkpoint(args.checkpoint), args.version,
                                  files=load_side_files(args.checkpoint)).wait()
            publisher.close()  # the anchor in flight, if any
        except KeyboardInterrupt:  # at any point, the version's end included
            bar.close()
            print(f"weight-teleport publish: interrupted; {publisher.cancel()}",
                  file=sys.stderr)
            publisher.close()  # after a cancel: closes the store, writes nothing
            return INTERRUPTED
        except BaseException:
            publisher.close()
            raise
    kinds = "+".join(e.kind for e in r.objects)
    print(f"version {r.version} ({kinds}, base {r.base_version}): {r.wire_bytes / 1e6:.3f} MB "
          f"on the wire for {r.raw_bytes / 1e6:.1f} MB of weights ({r.ratio:.1f}x); "
          f"encode {r.encode_s:.2f} s, upload {r.upload_s:.2f} s")
    return 0


def pull_main(args: argparse.Namespace) -> int:
    """Write a version of the store as OUT/model.safetensors, with the side files its
    anchor carries (config.json, tokenizer files): a checkpoint an engine starts from."""
    from tqdm import tqdm

    from weight_teleport.observe.status import missing_version
    from weight_teleport.pipeline.checkpoint import save_checkpoint, save_side_files
    from weight_teleport.pipeline.errors import NoPlanError
    from weight_teleport.pipeline.fetch import fetch_side_files, materialize
    from weight_teleport.pipeline.plan import plan_catchup
    from weight_teleport.store import open_store

    with open_store(args.url, store_config(args)) as store:
        manifest = read_manifest(store, args.url)
        why = None if args.version is None else missing_version(manifest, args.version)
        if why is not None:
            raise NoPlanError(why)
        plan = plan_catchup(manifest, None, args.version)
        with tqdm(total=plan.nbytes, unit="B", unit_scale=True, desc="pull") as bar:
            state, version = materialize(store, manifest, args.version, progress=bar.update)
        files = fetch_side_files(store, manifest, version)
    path = save_checkpoint(state, args.out, {"weight_teleport_version": str(version)})
    save_side_files(files, args.out)
    extra = f" and {', '.join(sorted(files))}" if files else " (no side files were published)"
    print(f"version {version}: {len(state)} tensors written to {path}{extra} "
          f"({len(plan.steps)} objects, {plan.nbytes / 1e6:.2f} MB fetched)")
    return 0


def read_manifest(store, url: str):
    """The store's parsed manifest; NoPlanError where nothing was published."""
    from weight_teleport.pipeline.errors import NoPlanError
    from weight_teleport.pipeline.manifest import from_json

    raw = store.get_manifest()
    if raw is None:
        raise NoPlanError(f"{url} holds no manifest: nothing was published there yet")
    return from_json(raw)
