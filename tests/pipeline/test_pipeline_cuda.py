"""The publisher with its baseline on the GPU (CUDA codec backend on a side stream), and
subscribers patching GPU and CPU weights. Skipped without a CUDA device."""

from __future__ import annotations

import time

import pytest
import torch

from weight_teleport.pipeline import PublisherConfig, SubscriberConfig
from weight_teleport.publish import Publisher
from weight_teleport.subscribe import Subscriber
from weight_teleport.store import StoreConfig
from weight_teleport.targets.torch import TorchTarget

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _versions(n: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    master = {
        "w": torch.randn(512, 300, device="cuda", generator=g) * 0.02,
        "n": 1 + 0.1 * torch.randn(300, device="cuda", generator=g),
    }
    out = []
    for _ in range(n):
        out.append({k: v.to(torch.bfloat16) for k, v in master.items()})
        for v in master.values():
            v.add_(3e-6 * torch.randn(v.shape, device="cuda", generator=g))
    return out


def _same(a, b) -> bool:
    return all(torch.equal(a[k].cpu().view(torch.int16), b[k].cpu().view(torch.int16)) for k in a)


@pytest.mark.parametrize("target_device,budget", [("cpu", None), ("cuda", None), ("cuda", 0)])
def test_gpu_baseline_publishes_bit_exact_versions(target_device, budget):
    """budget 0: every staged patch is held in pinned host memory until applied."""
    url = f"memory://cuda-pipeline-{target_device}-{budget}"
    versions = _versions(4)
    live = {k: torch.zeros_like(v, device=target_device) for k, v in versions[0].items()}
    config = PublisherConfig(baseline_device="cuda", anchor_every=100)
    sub_config = SubscriberConfig(watch_timeout_s=0.2, device_staged_bytes=budget)
    with Publisher(url, config) as pub, Subscriber(url, TorchTarget(live), sub_config) as sub:
        for v, state in enumerate(versions):
            result = pub.publish(state, version=v).wait(60)
            assert result.base_version == (None if v == 0 else v - 1)
            while sub.version != v:
                assert sub.wait(30), f"version {v} never staged"
                sub.apply()
            assert _same(live, state), f"version {v} differs"
    assert pub._encoder.baseline["w"].device.type == "cuda"


def _follow(sub, version: int, timeout: float = 60.0) -> list:
    reports = []
    deadline = time.monotonic() + timeout
    while sub.version != version:
        assert time.monotonic() < deadline, f"stuck at {sub.version}, want {version}"
        if sub.wait(0.5):
            reports.append(sub.apply())
    return reports


@pytest.mark.parametrize("transport", ["memory", "http"])
def test_gpu_target_stages_on_its_device_through_anchors_and_resyncs(transport, tmp_path):
    """A TorchTarget over CUDA weights lends them to the subscriber (no shadow copy): every
    version is staged on the GPU, versions that carry an anchor arrive with their delta first,
    a scribbled live weight makes it resync, and a new subscriber cold-starts from the newest
    anchor (staged on the GPU). Bit-exact at every version."""
    from weight_teleport.server import OriginServer, ServerConfig

    versions = _versions(7, seed=3)
    origin = OriginServer(ServerConfig(root=tmp_path, port=0, token="t")).start() if transport == "http" else None
    url = origin.url if origin else f"memory://cuda-gpu-target-{transport}"
    config = PublisherConfig(baseline_device="cuda", anchor_every=2, store=StoreConfig(token="t"))
    live = {k: torch.zeros_like(v) for k, v in versions[0].items()}
    try:
        with (
            Publisher(url, config) as pub,
            Subscriber(url, TorchTarget(live), SubscriberConfig(watch_timeout_s=0.2)) as sub,
        ):
            assert sub._stager.on_cuda and sub._stager.shadow is None
            for v, state in enumerate(versions[:5]):
                result = pub.publish(state, version=v).wait(60)
                assert result.objects[0].kind == ("snapshot" if v == 0 else "delta")
                _follow(sub, v)
                assert _same(live, state), f"version {v} differs"
                if v == 4:
                    live["w"].view(torch.int16)[7, 7] ^= 1  # the sampler scribbles on its weights
            assert pub.flush(60)
            pub.publish(versions[5], version=5).wait(60)
            reports = _follow(sub, 5)
            assert any(r.resynced for r in reports) and _same(live, versions[5])
            pub.publish(versions[6], version=6).wait(60)
            assert pub.flush(60)
        cold = {k: torch.zeros_like(v) for k, v in versions[0].items()}
        with Subscriber(url, TorchTarget(cold), SubscriberConfig(watch_timeout_s=0.2)) as sub:
            reports = _follow(sub, 6)
        assert reports[0].versions[0] == 6 and _same(cold, versions[6]), "the cold start missed the anchor"
    finally:
        if origin:
            origin.stop()


def test_gpu_snapshot_packs_stage_on_the_device_without_a_host_copy(monkeypatch):
    """A snapshot written by the CUDA encoder is staged onto CUDA weights on the device: the
    CPU backend is not called, and the live weights are never copied to the host."""
    import weight_teleport as wt
    from weight_teleport.codec.cpu import backend as cpu

    state = _versions(1, seed=4)[0]
    pack = wt.encode_snapshot(state, version=0, pinned=True)
    monkeypatch.setattr(cpu, "stage", lambda *a, **k: pytest.fail("a GPU snapshot went to the CPU backend"))
    live = {k: torch.zeros_like(v) for k, v in state.items()}
    wt.apply_delta(live, pack)
    assert _same(live, state)


def test_gpu_publisher_makes_catch_up_deltas_from_the_boot_version():
    """The boot version kept on the GPU; a GPU sampler holding it joins with one delta."""
    url = "memory://cuda-pipeline-catchup"
    versions = _versions(7)
    config = PublisherConfig(baseline_device="cuda", anchor_every=100, catchup_every=3)
    with Publisher(url, config) as pub:
        for v, state in enumerate(versions):
            pub.publish(state, version=v)
        assert pub.flush(60)
        assert pub._encoder.boot is not None and pub._encoder.boot["w"].device.type == "cuda"
        assert [e.version for e in pub._encoder.manifest.catchup_deltas()] == [6]
        live = {k: v.clone() for k, v in versions[0].items()}
        sub_config = SubscriberConfig(watch_timeout_s=0.2, initial_version=0)
        with Subscriber(url, TorchTarget(live), sub_config) as sub:
            reports = _follow(sub, 6)
    assert [v for r in reports for v in r.versions] == [6]
    assert _same(live, versions[6])
