"""`weight-teleport serve`: the HTTP origin (`weight_teleport.server`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from weight_teleport.cli.common import READ_TOKEN_ENV, TOKEN_ENV, secret


def serve_arguments(p: argparse.ArgumentParser) -> None:
    from weight_teleport.server.config import ServerConfig as d

    p.add_argument("--root", type=Path, required=True, help="directory of objects and manifest (created if missing)")
    p.add_argument("--port", type=int, default=d.port, help="TCP port (0: any free one)")
    p.add_argument("--host", default=d.host, help="address to listen on (0.0.0.0 for every interface)")
    p.add_argument(
        "--token-file",
        type=Path,
        help=f"file holding the upload bearer token (default: the {TOKEN_ENV} "
        f"environment variable; without either, uploads are refused)",
    )
    p.add_argument(
        "--read-token-file",
        type=Path,
        help=f"file holding the bearer token every read must present (default: "
        f"the {READ_TOKEN_ENV} environment variable; without either, anyone "
        f"who reaches the server reads)",
    )
    p.add_argument("--tls-cert", type=Path, help="PEM certificate chain: serve HTTPS (with --tls-key)")
    p.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    p.add_argument(
        "--max-object-bytes", type=int, default=d.max_object_bytes, help="largest upload accepted (413 above)"
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=d.max_connections,
        help="open connections at most: the longest idle one is closed for a "
        "new one, else the oldest long-poll ends, else the new one gets 503",
    )
    p.add_argument(
        "--reserved-connections",
        type=int,
        default=d.reserved_connections,
        help="connection slots kept from reads (every request without the upload "
        "token but /healthz), for writes and health probes (default: a tenth "
        "of --max-connections)",
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=d.header_timeout_s,
        help="seconds a client may take to send a request's headers",
    )
    p.add_argument(
        "--body-timeout",
        type=float,
        default=d.body_timeout_s,
        help="seconds an upload may stall (408), or a response's client pause "
        "its reading (less than 1 MiB read: closed)",
    )
    p.add_argument(
        "--keepalive-timeout", type=float, default=d.keepalive_timeout_s, help="seconds an idle connection is kept open"
    )
    p.add_argument(
        "--sampler-stale",
        type=float,
        default=d.sampler_stale_s,
        help="seconds without a heartbeat after which a sampler shows as stale",
    )
    p.add_argument(
        "--sampler-expiry",
        type=float,
        default=d.sampler_expiry_s,
        help="seconds without a heartbeat after which a sampler is forgotten",
    )
    p.add_argument("--log-level", default="warning", help="logging level; 'info' logs every request")


def serve_main(args: argparse.Namespace) -> int:
    """Run the origin with parsed `args` until interrupted; say where it listens."""
    from weight_teleport.server import ServerConfig, serve_forever

    token = secret(args.token_file, TOKEN_ENV)
    read_token = secret(args.read_token_file, READ_TOKEN_ENV)
    config = ServerConfig(
        root=args.root,
        host=args.host,
        port=args.port,
        token=token,
        read_token=read_token,
        tls_cert_file=args.tls_cert,
        tls_key_file=args.tls_key,
        max_object_bytes=args.max_object_bytes,
        max_connections=args.max_connections,
        reserved_connections=args.reserved_connections,
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        keepalive_timeout_s=args.keepalive_timeout,
        sampler_stale_s=args.sampler_stale,
        sampler_expiry_s=args.sampler_expiry,
    )
    serve_forever(config, on_ready=lambda url: print(describe(config, url), flush=True))
    return 0


def describe(config, url: str) -> str:
    """What an operator needs to know once the origin listens: where, what, who may."""
    uploads = (
        "need the upload token"
        if config.token
        else f"refused (no upload token: --token-file or {TOKEN_ENV}); the origin is read-only"
    )
    reads = (
        "need the read token (or the upload token)"
        if config.read_token
        else "open to anyone who reaches the server (no read token)"
    )
    return (
        f"weight-teleport origin listening on {url}\n"
        f"  root:    {Path(config.root).resolve()}\n"
        f"  uploads: {uploads}\n"
        f"  reads:   {reads}\n"
        f"  status:  {url}/status   metrics: {url}/metrics"
    )
