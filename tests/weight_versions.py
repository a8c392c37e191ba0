"""Deterministic weight versions for the pipeline tests (shared by test processes).

Version 0 is a small random state; each later version moves ~3% of the float elements by
one ULP (as a tiny-lr RL step does) and a few by more, chosen by a generator seeded with
the version, so any process can rebuild any version on its own."""

from __future__ import annotations

import itertools
import time

import torch

from helpers import bits
from weight_teleport.pipeline import SubscriberConfig
from weight_teleport.publish import Publisher
from weight_teleport.subscribe import Subscriber

SHAPES = {
    "model.embed_tokens.weight": ((96, 32), torch.bfloat16),
    "model.layers.0.mlp.up_proj.weight": ((64, 32), torch.bfloat16),
    "model.layers.0.mlp.down_proj.weight": ((32, 64), torch.bfloat16),
    "model.norm.weight": ((32,), torch.float32),
}


def version_zero(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: (torch.randn(shape, generator=g) * 0.02).to(dtype) for k, (shape, dtype) in SHAPES.items()}


def step(state: dict[str, torch.Tensor], version: int) -> dict[str, torch.Tensor]:
    """The weights of `version` from those of `version - 1`."""
    g = torch.Generator().manual_seed(10_000 + version)
    out = {}
    for k, t in state.items():
        b = bits(t).clone()
        flip = torch.rand(b.shape, generator=g) < 0.03
        ulps = torch.randint(-1, 2, b.shape, generator=g, dtype=b.dtype) * flip
        out[k] = (b + ulps).view(t.dtype)
    return out


def expected(version: int, _cache: dict = {}) -> dict[str, torch.Tensor]:
    """The weights of `version` (memoised)."""
    if version not in _cache:
        _cache[version] = version_zero() if version == 0 else step(expected(version - 1), version)
    return _cache[version]


def same_bits(live, version: int) -> bool:
    """Whether the name -> tensor mapping `live` holds exactly the weights of `version`."""
    want = expected(version)
    return all(torch.equal(bits(live[k]), bits(want[k])) for k in want)


# Following and publishing them in one process.

FAST = SubscriberConfig(watch_timeout_s=0.2, retry_backoff_s=0.02, retry_backoff_max_s=0.1)
_names = itertools.count()


def memory_url() -> str:
    return f"memory://pipeline-{next(_names)}"


def follow(sub: Subscriber, version: int, timeout: float = 20.0) -> list:
    """Apply until the target holds `version`; return the reports."""
    reports, deadline = [], time.monotonic() + timeout
    while sub.version != version:
        assert time.monotonic() < deadline, f"stuck at {sub.version}, want {version}"
        if sub.wait(0.2):
            reports.append(sub.apply())
    return reports


def publish(pub: Publisher, versions) -> None:
    for v in versions:
        pub.publish(expected(v), v)
    assert pub.flush(30)
