"""The HTTP origin server (`weight-teleport serve`): content-addressed, cache-friendly.

Needs aiohttp (`pip install "weight-teleport[http]"`).
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from .config import ServerConfig

TOKEN_ENV = "WEIGHT_TELEPORT_TOKEN"


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of `weight-teleport serve` to `parser`."""
    parser.add_argument("--root", type=Path, required=True,
                        help="directory of objects and manifest (created if missing)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (0: any free)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (0.0.0.0 for every interface)")
    parser.add_argument("--token-file", type=Path,
                        help=f"file holding the upload bearer token (default: the "
                             f"{TOKEN_ENV} environment variable; without either, "
                             f"uploads are refused)")
    parser.add_argument("--max-object-bytes", type=int,
                        default=ServerConfig.max_object_bytes,
                        help="largest upload accepted (413 above)")
    parser.add_argument("--log-level", default="warning",
                        help="logging level; 'info' logs every request")


def serve_main(args: argparse.Namespace) -> int:
    """Run `weight-teleport serve` with parsed `args` until interrupted."""
    token = args.token_file.read_text().strip() if args.token_file else \
        os.environ.get(TOKEN_ENV) or None
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if token is None:
        logging.getLogger(__name__).warning(
            "no upload token (--token-file or %s): the server is read-only", TOKEN_ENV)
    config = ServerConfig(root=args.root, host=args.host, port=args.port, token=token,
                          max_object_bytes=args.max_object_bytes)
    _runner().serve_forever(config)
    return 0


def _runner():
    """The runner module, which needs aiohttp, with an install hint if it is missing."""
    try:
        from . import runner
    except ImportError as exc:
        raise ImportError(f"the origin server needs {exc.name!r}: "
                          f'pip install "weight-teleport[http]"') from exc
    return runner


def __getattr__(name: str):
    if name in ("OriginServer", "serve_forever"):
        return getattr(_runner(), name)
    raise AttributeError(name)


__all__ = ["ServerConfig", "OriginServer", "add_serve_arguments", "serve_main"]
