"""The `weight-teleport` command: a thin layer over the library."""

import argparse
import json
import sys
from pathlib import Path


def _inspect(args: argparse.Namespace) -> int:
    from weight_teleport.codec import inspect

    info = inspect(Path(args.pack).read_bytes())
    if not args.tensors:
        info = {k: v for k, v in info.items() if k != "tensors"}
    print(json.dumps(info, indent=2))
    return 0


def _verify(args: argparse.Namespace) -> int:
    """Apply a chain of packs (a snapshot, then deltas) and check every digest."""
    from weight_teleport.codec import apply_delta, decode_snapshot

    paths = [Path(p) for p in args.packs]
    state = decode_snapshot(paths[0].read_bytes())
    print(f"{paths[0]}: snapshot ok")
    for p in paths[1:]:
        r = apply_delta(state, p.read_bytes())
        print(f"{p}: version {r.base_version} -> {r.version} ok ({r.elements_changed} elements changed)")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from weight_teleport.server import serve_main

    return serve_main(args)


def build_parser() -> argparse.ArgumentParser:
    from weight_teleport import demo
    from weight_teleport.bench import run as bench
    from weight_teleport.pipeline import cli as pipeline
    from weight_teleport.server import add_serve_arguments

    parser = argparse.ArgumentParser(prog="weight-teleport",
                                     description="Bit-exact weight deltas from RL trainers to samplers.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="publish simulated RL steps and follow them bit-exactly")
    demo.add_arguments(p)
    p.set_defaults(func=demo.main)
    p = sub.add_parser("bench", help="compression and speed against peer codecs on simulated or real RL deltas")
    bench.add_arguments(p)
    p.set_defaults(func=bench.main)
    p = sub.add_parser("inspect", help="print a pack's header and statistics")
    p.add_argument("pack", help="path of a pack file")
    p.add_argument("--tensors", action="store_true", help="list every tensor")
    p.set_defaults(func=_inspect)
    p = sub.add_parser("verify", help="apply a snapshot then deltas, checking every digest")
    p.add_argument("packs", nargs="+", help="snapshot pack, then delta packs in order")
    p.set_defaults(func=_verify)
    p = sub.add_parser("serve", help="run the HTTP origin server")
    add_serve_arguments(p)
    p.set_defaults(func=_serve)
    pipeline.add_subcommands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from weight_teleport.errors import WeightTeleportError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (WeightTeleportError, OSError, ValueError) as e:
        print(f"weight-teleport {args.command}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"weight-teleport {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
