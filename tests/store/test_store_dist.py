"""`dist://`: one source rank broadcasts to the others over gloo, in real processes."""

from __future__ import annotations

import multiprocessing as mp
import traceback

import pytest

from services import free_port
from weight_teleport.store import ManifestChanged, StoreError, TooLarge, manifest_etag, open_store

WORLD = 3
OBJECTS = {f"v/{i}": bytes([i]) * (1000 * i + 1) for i in range(1, 6)}


def _rank_main(rank: int, port: int, errors: "mp.Queue", backend: str = "gloo", world: int = WORLD) -> None:
    import torch
    import torch.distributed as dist

    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        store = open_store(f"dist://?src=0&backend={backend}")
        if rank == 0:
            for key, data in OBJECTS.items():
                store.put(key, data)
            store.delete("v/5")
            store.put_manifest(b"latest=3", if_match=None)
            with pytest.raises(ManifestChanged):
                store.put_manifest(b"stale", if_match=None)
            store.put_manifest(b"latest=4", if_match=manifest_etag(b"latest=3"))
        else:
            assert store.watch(manifest_etag(b"latest=3"), timeout=60) == b"latest=4"
            with pytest.raises(TooLarge):
                store.get("v/3", max_bytes=len(OBJECTS["v/3"]) - 1)
            assert store.list() == sorted(set(OBJECTS) - {"v/5"})
            for key in store.list():
                assert store.get(key) == OBJECTS[key]
            assert store.get_range("v/3", 10, 20) == OBJECTS["v/3"][10:20]
            with pytest.raises(StoreError, match="only rank 0"):
                store.put("v/9", b"x")
        store.close()
        assert store.watch(manifest_etag(b"latest=4"), timeout=0) is None
        dist.destroy_process_group()
    except BaseException:
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        raise


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.parametrize(
    "backend",
    [
        "gloo",
        pytest.param(
            "nccl",
            marks=[pytest.mark.cuda, pytest.mark.skipif(_cuda_devices() < 2, reason="NCCL needs two CUDA devices")],
        ),
    ],
)
def test_broadcast_to_every_rank(backend: str) -> None:
    ctx = mp.get_context("spawn")
    errors, port = ctx.Queue(), free_port()
    world = WORLD if backend == "gloo" else 2
    procs = [ctx.Process(target=_rank_main, args=(r, port, errors, backend, world)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout=60)
        failures = []
        while not errors.empty():
            failures.append(errors.get())
        assert not failures, "\n".join(failures)
        assert [p.exitcode for p in procs] == [0] * world
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
