"""`weight-teleport publish | pull`: checkpoints in and out of a store."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from weight_teleport.cli.common import INTERRUPTED, ByteBar, add_store_arguments, store_config


def publish_arguments(p: argparse.ArgumentParser) -> None:
    from weight_teleport.format.codecs import CHOICES, DEPRECATED_CODERS
    from weight_teleport.pipeline.config import PublisherConfig as d, RetentionConfig
    from weight_teleport.quantize.names import FORMATS

    p.add_argument("checkpoint", type=Path, help="directory of an HF-style safetensors checkpoint")
    p.add_argument("--to", required=True, dest="url", help="store URL (file://, http://, s3://)")
    p.add_argument("--version", type=int, help="version number (default: the next one)")
    p.add_argument("--anchor-every", type=int, default=d.anchor_every, help="a full snapshot every N versions")
    p.add_argument(
        "--catchup-every",
        type=int,
        default=d.catchup_every,
        help="also a delta from the boot version (the store's first) every N versions, for samplers "
        "that start from that checkpoint (0: off)",
    )
    p.add_argument(
        "--keep-anchors", type=int, default=RetentionConfig.keep_anchors, help="anchors kept (0: keep everything)"
    )
    p.add_argument(
        "--codec",
        choices=CHOICES,
        default=d.codec,
        help="the codec of a delta's sparse records (sparse_ac: smaller, slower on dense steps; "
        "auto: sparse_ac for records with at most 1%% changed, sparse for the others)",
    )
    p.add_argument("--coder", choices=tuple(DEPRECATED_CODERS), help=argparse.SUPPRESS)  # deprecated: --codec
    p.add_argument(
        "--sampler-format",
        choices=FORMATS,
        default=None,
        help="publish the checkpoint quantized (fp8-block: block-FP8 linear layers, as DeepSeek-V3's)",
    )
    add_store_arguments(p)


def pull_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="store URL")
    p.add_argument("--out", required=True, type=Path, help="directory to write model.safetensors to")
    p.add_argument("--version", type=int, help="version to pull (default: the latest)")
    p.add_argument(
        "--from",
        dest="from_dir",
        type=Path,
        help="a checkpoint this machine holds at a version of the store (an earlier pull, or the "
        "checkpoint the run began from): fetch the deltas from it where that is less than an anchor",
    )
    p.add_argument(
        "--from-version",
        type=int,
        help="the version --from holds (default: what an earlier pull wrote in it, else the store's boot version)",
    )
    p.add_argument(
        "--follow",
        action="store_true",
        help="then keep OUT at the newest version until Ctrl-C: each version replaces OUT/model.safetensors atomically",
    )
    add_store_arguments(p)


def _codec(args: argparse.Namespace) -> str:
    """`--codec`, or the codec the deprecated `--coder` meant (said on stderr)."""
    from weight_teleport.format.codecs import DEFAULT, DEPRECATED_CODERS

    if args.coder is None:
        return args.codec
    codec = DEPRECATED_CODERS[args.coder]
    if args.codec not in (DEFAULT, codec):
        raise ValueError(f"--coder is deprecated: give --codec {args.codec} alone")
    print(f"weight-teleport publish: --coder {args.coder} is deprecated: use --codec {codec}", file=sys.stderr)
    return codec


def publish_main(args: argparse.Namespace) -> int:
    """Publish CHECKPOINT as a new version (a delta against the store's latest).

    The store's write access is checked before the checkpoint is read. Ctrl-C cancels:
    nothing more is written, and the message says what was left."""
    from weight_teleport.pipeline import PublisherConfig, RetentionConfig
    from weight_teleport.publish import Publisher
    from weight_teleport.publish.checkpoint import load_checkpoint, load_side_files

    codec = _codec(args)
    with ByteBar("upload") as bar:
        store = store_config(args)
        store.upload_progress = bar.update
        config = PublisherConfig(
            anchor_every=args.anchor_every,
            catchup_every=args.catchup_every,
            store=store,
            codec=codec,
            retention=RetentionConfig(keep_anchors=args.keep_anchors),
            sampler_format=args.sampler_format,
        )
        publisher = Publisher(args.url, config)
        print(f"weight-teleport publish: {args.checkpoint} to {args.url} (Ctrl-C cancels)", file=sys.stderr, flush=True)
        try:
            r = publisher.publish(
                load_checkpoint(args.checkpoint), args.version, files=load_side_files(args.checkpoint)
            ).wait()
            publisher.close()  # the anchor in flight, if any
            bar.close()
            kinds = "+".join(e.kind for e in r.objects)
            print(
                f"version {r.version} ({kinds}, base {r.base_version}): {r.wire_bytes / 1e6:.3f} "
                f"MB on the wire for {r.raw_bytes / 1e6:.1f} MB of weights ({r.ratio:.1f}x); "
                f"encode {r.encode_s:.2f} s, upload {r.upload_s:.2f} s",
                flush=True,
            )
        except KeyboardInterrupt:  # at any point, the version's end and its report included
            bar.close()
            print(f"weight-teleport publish: interrupted; {publisher.cancel()}", file=sys.stderr)
            publisher.close()  # after a cancel: closes the store, writes nothing
            return INTERRUPTED
        except BaseException:
            publisher.close()
            raise
    return 0


def pull_main(args: argparse.Namespace) -> int:
    """Write a version of the store as OUT/model.safetensors, with the side files its
    anchor carries (config.json, tokenizer files): a checkpoint an engine starts from.
    With --follow, then apply every newer version to it (a subscriber), until Ctrl-C. With
    --from, start from a checkpoint this machine holds where that fetches less."""
    from weight_teleport.observe.status import missing_version
    from weight_teleport.errors import PackMismatchError
    from weight_teleport.publish.checkpoint import VERSION_KEY, save_checkpoint, save_side_files
    from weight_teleport.pipeline.errors import NoPlanError
    from weight_teleport.pipeline.fetch import fetch_side_files
    from weight_teleport.store import open_store

    if args.follow and args.version is not None:
        raise ValueError("--follow keeps the newest version: drop --version")
    with open_store(args.url, store_config(args)) as store:
        if args.follow and store.get_manifest() is None:
            print(f"{args.url}: nothing published yet; waiting for a first version", file=sys.stderr, flush=True)
            while store.watch(None, 60) is None:
                pass
        manifest = read_manifest(store, args.url)
        why = None if args.version is None else missing_version(manifest, args.version)
        if why is not None:
            raise NoPlanError(why)
        start = _held(args, manifest)
        try:
            plan, state, version = _materialize(store, manifest, args.version, start)
        except PackMismatchError as exc:
            assert start is not None  # only a held checkpoint's weights can mismatch
            print(
                f"weight-teleport pull: {args.from_dir} is not version {start[1]} of {args.url} ({exc}); "
                "pulling from an anchor",
                file=sys.stderr,
                flush=True,
            )
            plan, state, version = _materialize(store, manifest, args.version, None)
        files = fetch_side_files(store, manifest, version)
    path = save_checkpoint(state, args.out, {VERSION_KEY: str(version)})
    save_side_files(files, args.out)
    extra = f" and {', '.join(sorted(files))}" if files else " (no side files were published)"
    print(
        f"version {version}: {len(state)} tensors written to {path}{extra} "
        f"({len(plan.steps)} objects, {plan.nbytes / 1e6:.2f} MB fetched)",
        flush=True,
    )
    return _follow(args, state, version) if args.follow else 0


def _held(args: argparse.Namespace, manifest) -> tuple[dict, int] | None:
    """The weights of `--from` and the version they are (None: no --from)."""
    from weight_teleport.pipeline.errors import ConfigError
    from weight_teleport.publish.checkpoint import checkpoint_version, load_checkpoint

    if args.from_dir is None:
        if args.from_version is not None:
            raise ConfigError("--from-version says which version --from holds: give --from too")
        return None
    version = args.from_version
    if version is None:
        version = checkpoint_version(args.from_dir)
    if version is None:
        version = manifest.boot
    if version is None:
        raise ConfigError(
            f"--from {args.from_dir}: no version is written in it and {args.url} names no boot version; "
            "say which version it holds with --from-version"
        )
    return load_checkpoint(args.from_dir), version


def _materialize(store, manifest, version: int | None, start: tuple[dict, int] | None):
    """(plan, weights, version) of `version` pulled from `start` (or nothing), with a bar."""
    from tqdm import tqdm

    from weight_teleport.pipeline.fetch import materialize
    from weight_teleport.pipeline.plan import plan_catchup

    plan = plan_catchup(manifest, None if start is None else start[1], version)
    with tqdm(total=plan.nbytes, unit="B", unit_scale=True, desc="pull") as bar:
        state, version = materialize(store, manifest, version, progress=bar.update, start=start)
    return plan, state, version


SIDE_FILES_CHECK_S = 5.0
"""How often `pull --follow` looks for new side files while no version comes."""


def _follow(args: argparse.Namespace, state: dict, version: int) -> int:
    """Keep OUT at the store's newest version: a Subscriber patches `state` (the weights of
    `version`, which OUT holds), and each version applied is written out; the side files
    that go with it are written when they change (an anchor may be announced after its
    version's delta: they are looked at again every few seconds)."""
    from weight_teleport.pipeline import SubscriberConfig
    from weight_teleport.subscribe import Subscriber
    from weight_teleport.publish.checkpoint import save_checkpoint, save_side_files
    from weight_teleport.pipeline.fetch import fetch_side_files, side_file_records
    from weight_teleport.store import open_store
    from weight_teleport.targets.torch import TorchTarget

    config = SubscriberConfig(store=store_config(args), initial_version=version)
    with open_store(args.url, config.store) as store:
        sides = side_file_records(read_manifest(store, args.url), version)
        try:
            with Subscriber(args.url, TorchTarget(state), config) as sub:
                while True:
                    if sub.wait(SIDE_FILES_CHECK_S):  # raises SubscriberFailed once it gave up
                        report = sub.apply()
                        version = report.version
                        path = save_checkpoint(state, args.out, {"weight_teleport_version": str(version)})
                        print(
                            f"version {version}: written to {path} ({report.bytes_fetched / 1e6:.3f} "
                            f"MB fetched{', resynced' if report.resynced else ''})",
                            flush=True,
                        )
                    manifest = read_manifest(store, args.url)
                    if side_file_records(manifest, version) != sides:
                        sides = side_file_records(manifest, version)
                        save_side_files(fetch_side_files(store, manifest, version), args.out)
        except KeyboardInterrupt:
            print(f"weight-teleport pull: stopped following; {args.out} holds version {version}", file=sys.stderr)
            return 0


def read_manifest(store, url: str):
    """The store's parsed manifest; NoPlanError where nothing was published."""
    from weight_teleport.pipeline.errors import NoPlanError
    from weight_teleport.format.manifest import from_json

    raw = store.get_manifest()
    if raw is None:
        raise NoPlanError(f"{url} holds no manifest: nothing was published there yet")
    return from_json(raw)
