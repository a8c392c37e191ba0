"""The `weight-teleport` command: a thin layer over the library.

Every subcommand is registered here, from one module per command group; each module
imports nothing heavy at the top (torch, numba, aiohttp load inside the command that
runs), so that `--help` answers at once."""

from __future__ import annotations

import argparse
import importlib
import sys

from weight_teleport import __version__
from weight_teleport.cli.common import INTERRUPTED, HelpFormatter

GROUPS = ("demo", "bench", "pipeline", "status", "serve", "codec")
"""The command groups, in the order `--help` lists their commands: the modules
`weight_teleport.cli.<group>`, each with `register(subparsers)`."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="weight-teleport", formatter_class=HelpFormatter,
                                     description="Bit-exact weight deltas from RL trainers "
                                                 "to samplers.")
    parser.add_argument("--version", action="version", version=f"weight-teleport {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        importlib.import_module(f"weight_teleport.cli.{group}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from weight_teleport.errors import WeightTeleportError
    from weight_teleport.observe.logs import configure

    configure(getattr(args, "log_level", "warning"))

    try:
        return args.func(args)
    except (WeightTeleportError, OSError, ValueError) as e:
        print(f"weight-teleport {args.command}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"weight-teleport {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED


__all__ = ["GROUPS", "build_parser", "main"]
