"""Load: 16 subscriber processes follow one publisher through a real HTTP origin.

The publisher publishes a version, then waits until every subscriber has applied it, so
each subscriber applies every version, and checks its weights bit for bit (integer
views) against the publisher's at each one. Processes are forked from a forkserver that
imported torch once, so sixteen of them start in seconds on two cores."""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback

from services import TOKEN, origin  # noqa: F401
from weight_teleport.store import StoreConfig

SUBSCRIBERS = 16
VERSIONS = 5
LAST = VERSIONS - 1
TIMEOUT_S = 120.0
"""A bound on each wait, far above what the test takes (about 20 s on two busy cores)."""


def _subscriber_main(url: str, index: int, ready, progress, errors, results) -> None:
    try:
        import torch

        torch.set_num_threads(1)
        results.put(_follow(url, index, ready, progress))
    except BaseException:
        errors.put(f"subscriber {index}: {traceback.format_exc()}")


def _follow(url: str, index: int, ready, progress) -> tuple:
    import torch

    from weight_versions import expected, same_bits
    from weight_teleport.pipeline import SubscriberConfig
    from weight_teleport.subscribe import Subscriber
    from weight_teleport.targets.torch import TorchTarget

    live = {k: torch.zeros_like(t) for k, t in expected(0).items()}
    config = SubscriberConfig(
        watch_timeout_s=2.0, threads=1, retry_backoff_s=0.05, retry_backoff_max_s=0.5, give_up_after_s=TIMEOUT_S
    )
    applied, deadline = [], time.monotonic() + TIMEOUT_S
    with Subscriber(url, TorchTarget(live), config) as sub:
        ready.release()
        while sub.version != LAST:
            assert time.monotonic() < deadline, f"stuck at version {sub.version}"
            if sub.wait(0.5):
                report = sub.apply()
                assert same_bits(live, report.version), f"version {report.version} differs"
                applied += report.versions
                progress[index] = report.version
        return index, applied, sub.health.state, sub.stats.objects_rejected, sub.stats.resyncs


def _raise_reported(errors) -> None:
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    assert not failures, "\n".join(failures)


def _await(condition, errors, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        _raise_reported(errors)
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_sixteen_subscribers_through_the_origin(origin) -> None:  # noqa: F811
    from weight_versions import expected
    from weight_teleport.pipeline import PublisherConfig
    from weight_teleport.publish import Publisher

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "weight_teleport.pipeline", "weight_versions"])
    url = f"http://127.0.0.1:{origin.port}"
    errors, results, ready = ctx.Queue(), ctx.Queue(), ctx.Semaphore(0)
    progress = ctx.Array("i", [-1] * SUBSCRIBERS, lock=False)
    t_start = time.perf_counter()
    procs = [
        ctx.Process(target=_subscriber_main, args=(url, i, ready, progress, errors, results))
        for i in range(SUBSCRIBERS)
    ]
    try:
        for p in procs:
            p.start()
        for _ in range(SUBSCRIBERS):
            _await(lambda: ready.acquire(timeout=0.1), errors, "the subscribers to start")
        t_started, spread = time.perf_counter(), []
        config = PublisherConfig(anchor_every=2, threads=1, store=StoreConfig(token=TOKEN))
        with Publisher(url, config) as pub:
            for v in range(VERSIONS):
                t0 = time.perf_counter()
                pub.publish(expected(v), v).wait(TIMEOUT_S)
                _await(lambda: min(progress) >= v, errors, f"every subscriber to apply {v}")
                spread.append(time.perf_counter() - t0)
        outcomes = [results.get(timeout=TIMEOUT_S) for _ in range(SUBSCRIBERS)]
        for p in procs:
            p.join(TIMEOUT_S)
        _raise_reported(errors)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0] * SUBSCRIBERS
    for index, applied, health, rejected, resyncs in outcomes:
        assert applied == list(range(VERSIONS)), (index, applied)
        assert (health, rejected, resyncs) == ("healthy", 0, 0), index
    print(
        f"\n{SUBSCRIBERS} subscribers started in {t_started - t_start:.1f} s; publish -> all "
        f"applied per version: {', '.join(f'{s:.2f}' for s in spread)} s; total "
        f"{time.perf_counter() - t_start:.1f} s"
    )
