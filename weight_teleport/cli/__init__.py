"""The `weight-teleport` command: a thin layer over the library.

Every subcommand is registered here, from the table COMMANDS; its code lives in the module
of its group, which imports nothing heavy at the top (torch, numba, aiohttp load inside
the command that runs), so that `--help` answers at once."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from weight_teleport import __version__
from weight_teleport.cli.common import BROKEN_PIPE, INTERRUPTED, HelpFormatter, add_command

COMMANDS = (
    ("demo", "demo", "publish RL steps of a small model and follow them bit-exactly in a sampler process"),
    ("bench", "bench", "compression and speed against peer codecs on simulated or real RL deltas"),
    ("publish", "pipeline", "publish a safetensors checkpoint as the next version"),
    ("pull", "pipeline", "materialise a version as a safetensors checkpoint"),
    ("status", "status", "versions, retention and samplers of a store or origin"),
    ("serve", "serve", "run the HTTP origin server"),
    ("inspect", "codec", "print a pack's header and statistics"),
    ("verify", "codec", "apply a snapshot then deltas, checking every digest"),
)
"""(command, group, summary) of every subcommand, in the order `--help` lists them. The
module `weight_teleport.cli.<group>` holds `<command>_arguments(parser)`, which adds its
options, and `<command>_main(args)`, which runs it and returns the exit status."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="weight-teleport",
        formatter_class=HelpFormatter,
        description="Bit-exact weight deltas from RL trainers to samplers.",
    )
    parser.add_argument("--version", action="version", version=f"weight-teleport {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command, group, summary in COMMANDS:
        module = importlib.import_module(f"weight_teleport.cli.{group}")
        p = add_command(sub, command, summary, getattr(module, f"{command}_main"))
        getattr(module, f"{command}_arguments")(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from weight_teleport.errors import WeightTeleportError
    from weight_teleport.observe.logs import configure

    configure(getattr(args, "log_level", "warning"))

    try:
        status = args.func(args)
        sys.stdout.flush()  # a reader gone shows here, not in the interpreter's exit
        return status
    except BrokenPipeError:  # `status --json | head`: the reader needs no more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE
    except (WeightTeleportError, OSError, ValueError) as e:
        print(f"weight-teleport {args.command}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"weight-teleport {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED


__all__ = ["COMMANDS", "build_parser", "main"]
