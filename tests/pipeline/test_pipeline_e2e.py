"""End to end in real processes: one publisher, several subscribers, over every transport.

Each subscriber checks every version it applies bit for bit against the trainer's
weights (rebuilt from the seed in its own process). A late joiner starts from an anchor;
a subscriber that stops and restarts with its saved weights resumes the chain."""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback
import uuid
from pathlib import Path

from services import S3_BUCKET, TOKEN, free_port, nginx, origin, s3_config, seaweed_s3  # noqa: F401
from weight_teleport.store import StoreConfig

VERSIONS = 10
LAST = VERSIONS - 1
TIMEOUT_S = 60


def _publisher_main(url: str, store: StoreConfig, halfway, go, early: int, errors) -> None:
    from weight_versions import expected
    from weight_teleport.pipeline import PublisherConfig, RetentionConfig
    from weight_teleport.publish import Publisher

    try:
        config = PublisherConfig(anchor_every=4, retention=RetentionConfig(keep_anchors=2), store=store, threads=1)
        with Publisher(url, config) as pub:
            for _ in range(early):
                assert go.acquire(timeout=TIMEOUT_S), "subscribers did not start"
            for v in range(VERSIONS):
                pub.publish(expected(v), v).wait(TIMEOUT_S)
                if v == VERSIONS // 2:
                    halfway.set()
                time.sleep(0.1)
    except BaseException:
        errors.put(f"publisher: {traceback.format_exc()}")
        raise


def _follow(url: str, store: StoreConfig, name: str, stop_at: int, saved: str | None, restarted: bool, go) -> list[int]:
    import torch

    from weight_versions import expected, same_bits
    from weight_teleport.pipeline import SubscriberConfig
    from weight_teleport.subscribe import Subscriber
    from weight_teleport.targets.torch import TorchTarget

    initial, live = torch.load(saved) if restarted else (None, {k: torch.zeros_like(t) for k, t in expected(0).items()})
    config = SubscriberConfig(initial_version=initial, watch_timeout_s=1.0, store=store, threads=1)
    applied, deadline = [], time.monotonic() + TIMEOUT_S
    with Subscriber(url, TorchTarget(live), config) as sub:
        if go is not None:
            go.release()
        while sub.version is None or sub.version < stop_at:
            assert time.monotonic() < deadline, f"{name} stuck at version {sub.version}"
            if sub.wait(0.5):
                report = sub.apply()
                assert same_bits(live, report.version), f"{name}: version {report.version} differs"
                applied += report.versions
    if saved is not None and not restarted:
        torch.save((sub.version, live), saved)
    return applied


def _subscriber_main(
    url: str,
    store: StoreConfig,
    name: str,
    errors,
    results,
    go=None,
    stop_at: int = LAST,
    saved: str | None = None,
    restarted: bool = False,
) -> None:
    try:
        results.put((name, _follow(url, store, name, stop_at, saved, restarted, go)))
    except BaseException:
        errors.put(f"{name}: {traceback.format_exc()}")
        raise


def _finish(procs, errors, results, n_results: int) -> dict:
    """Join the processes, fail with every error they reported, and collect n_results
    (name, versions applied) pairs; kill whatever is still running."""
    try:
        for p in procs:
            p.join(TIMEOUT_S)
        failures = []
        while not errors.empty():
            failures.append(errors.get())
        assert not failures, "\n".join(failures)
        assert [p.exitcode for p in procs] == [0] * len(procs)
        return dict(results.get(timeout=5) for _ in range(n_results))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()


def _run_fleet(
    pub_url: str, sub_url: str, pub_store: StoreConfig, sub_store: StoreConfig, tmp_path: Path, restart: bool = False
) -> dict[str, list[int]]:
    ctx = mp.get_context("spawn")
    errors, results, halfway, go = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Semaphore(0)

    def start(target, *args, **kwargs):
        p = ctx.Process(target=target, args=args, kwargs=kwargs)
        p.start()
        return p

    saved = str(tmp_path / "restart.pt")
    early = 2 + restart
    procs = [start(_publisher_main, pub_url, pub_store, halfway, go, early, errors)]
    procs += [start(_subscriber_main, sub_url, sub_store, f"early{i}", errors, results, go) for i in range(2)]
    if restart:
        first = start(
            _subscriber_main, sub_url, sub_store, "before-restart", errors, results, go, stop_at=2, saved=saved
        )
        first.join(TIMEOUT_S)
        procs += [
            first,
            start(_subscriber_main, sub_url, sub_store, "restarted", errors, results, saved=saved, restarted=True),
        ]
    assert halfway.wait(TIMEOUT_S), "the publisher did not get halfway"
    procs.append(start(_subscriber_main, sub_url, sub_store, "late", errors, results))
    applied = _finish(procs, errors, results, len(procs) - 1)
    assert all(v[-1] == LAST for k, v in applied.items() if k != "before-restart")
    assert applied["late"][0] >= 4, "a late subscriber starts from a later anchor"
    return applied


def test_file_store(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    applied = _run_fleet(url, url, StoreConfig(), StoreConfig(), tmp_path, restart=True)
    stopped = applied["before-restart"][-1]
    assert stopped < LAST and applied["restarted"][0] > stopped


def test_http_origin(origin, tmp_path: Path) -> None:  # noqa: F811
    url = f"http://127.0.0.1:{origin.port}"
    _run_fleet(url, url, StoreConfig(token=TOKEN), StoreConfig(), tmp_path)


def test_http_through_nginx_cache(origin, nginx, tmp_path: Path) -> None:  # noqa: F811
    _run_fleet(f"http://127.0.0.1:{origin.port}", nginx.url, StoreConfig(token=TOKEN), StoreConfig(), tmp_path)
    log = (Path(tmp_path) / "nginx" / "access.log").read_text()
    assert "/b/" in log


def test_s3_seaweedfs(seaweed_s3, tmp_path: Path) -> None:  # noqa: F811
    url = f"s3://{S3_BUCKET}/pipeline-{uuid.uuid4().hex[:8]}"
    config = s3_config(seaweed_s3)
    _run_fleet(url, url, config, config, tmp_path)


def _rank_main(rank: int, world: int, port: int, errors, results) -> None:
    import torch.distributed as dist

    from weight_teleport.store import open_store

    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        store = open_store("dist://?src=0")
        if rank == 0:
            from weight_versions import expected
            from weight_teleport.pipeline import PublisherConfig
            from weight_teleport.publish import Publisher

            with Publisher("dist://", PublisherConfig(anchor_every=4, threads=1), store=store) as pub:
                for v in range(VERSIONS):
                    pub.publish(expected(v), v)
            store.close()
        else:
            results.put((rank, _follow_store(store, rank)))
            store.close()  # waits for the source's close: the group must outlive its broadcasts
        dist.destroy_process_group()
    except BaseException:
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        raise


def _follow_store(store, rank: int) -> list[int]:
    import torch

    from weight_versions import expected, same_bits
    from weight_teleport.pipeline import SubscriberConfig
    from weight_teleport.subscribe import Subscriber
    from weight_teleport.targets.torch import TorchTarget

    live = {k: torch.zeros_like(t) for k, t in expected(0).items()}
    applied, deadline = [], time.monotonic() + TIMEOUT_S
    with Subscriber("dist://", TorchTarget(live), SubscriberConfig(watch_timeout_s=0.5, threads=1), store=store) as sub:
        while sub.version != LAST:
            assert time.monotonic() < deadline, f"rank {rank} stuck at {sub.version}"
            if sub.wait(0.5):
                report = sub.apply()
                assert same_bits(live, report.version), f"rank {rank}: version {report.version}"
                applied += report.versions
    return applied


def test_dist_gloo() -> None:
    ctx, world = mp.get_context("spawn"), 3
    errors, results, port = ctx.Queue(), ctx.Queue(), free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, errors, results)) for r in range(world)]
    for p in procs:
        p.start()
    applied = _finish(procs, errors, results, world - 1)
    assert all(v[-1] == LAST for v in applied.values())
