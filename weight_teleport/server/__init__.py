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
READ_TOKEN_ENV = "WEIGHT_TELEPORT_READ_TOKEN"


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of `weight-teleport serve` to `parser`."""
    d = ServerConfig
    parser.add_argument("--root", type=Path, required=True,
                        help="directory of objects and manifest (created if missing)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (0: any free)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (0.0.0.0 for every interface)")
    parser.add_argument("--token-file", type=Path,
                        help=f"file holding the upload bearer token (default: the "
                             f"{TOKEN_ENV} environment variable; without either, "
                             f"uploads are refused)")
    parser.add_argument("--read-token-file", type=Path,
                        help=f"file holding the bearer token every read must present "
                             f"(default: the {READ_TOKEN_ENV} environment variable; "
                             f"without either, anyone who reaches the server reads)")
    parser.add_argument("--tls-cert", type=Path,
                        help="PEM certificate chain: serve HTTPS (with --tls-key)")
    parser.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    parser.add_argument("--max-object-bytes", type=int, default=d.max_object_bytes,
                        help="largest upload accepted (413 above)")
    parser.add_argument("--max-connections", type=int, default=d.max_connections,
                        help="open connections at most: the longest idle one is closed "
                             "for a new one, else the new one gets 503")
    parser.add_argument("--header-timeout", type=float, default=d.header_timeout_s,
                        help="seconds a client may take to send a request's headers")
    parser.add_argument("--body-timeout", type=float, default=d.body_timeout_s,
                        help="seconds an upload may stall (408), or a response stay unread")
    parser.add_argument("--keepalive-timeout", type=float, default=d.keepalive_timeout_s,
                        help="seconds an idle connection is kept open")
    parser.add_argument("--log-level", default="warning",
                        help="logging level; 'info' logs every request")


def _secret(path: Path | None, env: str) -> str | None:
    """A token from its file, else from the environment variable `env`."""
    return path.read_text().strip() if path else os.environ.get(env) or None


def serve_main(args: argparse.Namespace) -> int:
    """Run `weight-teleport serve` with parsed `args` until interrupted."""
    token = _secret(args.token_file, TOKEN_ENV)
    read_token = _secret(args.read_token_file, READ_TOKEN_ENV)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if token is None:
        logging.getLogger(__name__).warning(
            "no upload token (--token-file or %s): the server is read-only", TOKEN_ENV)
    config = ServerConfig(root=args.root, host=args.host, port=args.port, token=token,
                          read_token=read_token, tls_cert_file=args.tls_cert,
                          tls_key_file=args.tls_key, max_object_bytes=args.max_object_bytes,
                          max_connections=args.max_connections,
                          header_timeout_s=args.header_timeout,
                          body_timeout_s=args.body_timeout,
                          keepalive_timeout_s=args.keepalive_timeout)
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
