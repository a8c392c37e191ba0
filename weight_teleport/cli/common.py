"""What the command groups share: help that shows defaults, tokens, store options.

Environment variables are read here, at the entry point, and nowhere in the library."""

from __future__ import annotations

import argparse
import os
import threading
from pathlib import Path
from typing import Any, Callable

TOKEN_ENV = "WEIGHT_TELEPORT_TOKEN"
READ_TOKEN_ENV = "WEIGHT_TELEPORT_READ_TOKEN"
INTERRUPTED = 130  # the exit status of a command stopped by Ctrl-C (128 + SIGINT)
BROKEN_PIPE = 141  # that of one whose output's reader went away, as SIGPIPE gives (128 + 13)


class HelpFormatter(argparse.HelpFormatter):
    """Help that names each option's default (where it has one its help does not
    already state)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if not action.option_strings or "default" in text or action.default in (None, False, argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)"


class ByteBar:
    """A tqdm bar of bytes that shows from its first update on, so that a command that
    fails before sending a byte prints no empty bar. `update` may be called from several
    threads (a version's upload and its anchor's)."""

    def __init__(self, desc: str):
        self.desc, self._lock = desc, threading.Lock()
        self._bar: Any = None  # a tqdm bar once the first bytes come

    def update(self, n: int) -> None:
        with self._lock:
            if self._bar is None:
                from tqdm import tqdm

                self._bar = tqdm(unit="B", unit_scale=True, desc=self.desc)
            self._bar.update(n)

    def close(self) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.close()

    def __enter__(self) -> "ByteBar":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def add_command(
    sub: argparse._SubParsersAction,
    name: str,
    summary: str,
    func: Callable[[argparse.Namespace], int],
    description: str | None = None,
) -> argparse.ArgumentParser:
    """A subcommand whose help shows defaults; `func(args)` runs it."""
    p = sub.add_parser(name, help=summary, description=description or summary, formatter_class=HelpFormatter)
    p.set_defaults(func=func)
    return p


def secret(path: Path | None, env: str) -> str | None:
    """A token from its file, else from the environment variable `env`."""
    return path.read_text().strip() if path else os.environ.get(env) or None


def add_store_arguments(p: argparse.ArgumentParser) -> None:
    """The options of a command that opens a store."""
    p.add_argument("--token-file", type=Path, help=f"file holding the origin's upload token (default: ${TOKEN_ENV})")
    p.add_argument(
        "--read-token-file",
        type=Path,
        help=f"file holding the origin's read token, where it wants one (default: ${READ_TOKEN_ENV})",
    )
    p.add_argument(
        "--ca-file",
        help="PEM certificate of the authority that signed an https:// origin's certificate (default: the system's)",
    )
    p.add_argument("--endpoint-url", help="S3-compatible endpoint for s3:// URLs (default: AWS's)")


def store_config(args: argparse.Namespace):
    """The StoreConfig the store options of `args` describe."""
    from weight_teleport.store import StoreConfig

    return StoreConfig(
        token=secret(args.token_file, TOKEN_ENV),
        read_token=secret(args.read_token_file, READ_TOKEN_ENV),
        ca_file=args.ca_file,
        endpoint_url=args.endpoint_url,
    )
