"""The publisher with its baseline on the GPU (CUDA codec backend on a side stream), and
subscribers patching GPU and CPU weights. Skipped without a CUDA device."""

from __future__ import annotations

import pytest
import torch

from weight_teleport.pipeline import Publisher, PublisherConfig, Subscriber, SubscriberConfig
from weight_teleport.targets.torch import TorchTarget

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _versions(n: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    master = {"w": torch.randn(512, 300, device="cuda", generator=g) * 0.02,
              "n": 1 + 0.1 * torch.randn(300, device="cuda", generator=g)}
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
