"""A subscriber without a checkpoint view (shadow mode) hands its target flat row-major
patches even where the pack walks row-parallel tensors by columns (packs cut for sliced
receivers, `PublisherConfig.hints`): the target's weights equal the trainer's, bit for bit."""

import numpy as np
import torch

from helpers import assert_bits_equal
from test_slice_stage import CONFIG, _mutate, _state
from weight_teleport.pipeline import PublisherConfig, SubscriberConfig
from weight_teleport.publish import Publisher
from weight_teleport.subscribe import Subscriber
from weight_teleport.subscribe.target import Target
from weight_teleport.targets.vllm_layout import slice_hints


class FlatTarget(Target):
    """Writes patches by flat row-major index, as the vLLM and SGLang targets do; lends no view."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}

    def load(self, state) -> None:
        self.tensors = {n: t.clone() for n, t in state.items()}

    def apply(self, staged) -> None:
        for t in staged.tensors:
            live = self.tensors.setdefault(t.name, torch.zeros(t.shape, dtype=torch.bfloat16))
            flat = live.view(-1).view(torch.int16)
            for c in t.chunks:
                idx = np.arange(c.values.size) if c.positions is None else c.positions.astype(np.int64)
                flat[torch.from_numpy(idx + c.start)] = torch.from_numpy(c.values.view(np.int16))


def test_shadow_mode_flattens_column_walks(tmp_path):
    assert any(h.order == "cols" for h in slice_hints(CONFIG, [2]).values())
    gen = torch.Generator().manual_seed(0)
    states = [_state(gen)]
    states += [_mutate(states[-1], 0.05, gen) for _ in range(2)]
    url = f"file://{tmp_path}"
    target = FlatTarget()
    with (
        Publisher(url, PublisherConfig(hints=slice_hints(CONFIG, [2]), threads=1)) as pub,
        Subscriber(url, target, SubscriberConfig(watch_timeout_s=0.1, heartbeat_s=None)) as sub,
    ):
        for version, state in enumerate(states):
            pub.publish(state, version=version).wait()
            assert sub.wait(60)
            assert sub.apply().version == version
            assert_bits_equal(target.tensors, state)
