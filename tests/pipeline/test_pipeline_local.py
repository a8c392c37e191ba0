"""Publisher and Subscriber in one process over memory:// and file:// stores: targets,
catch-up, resync, back-pressure, rejection of bad objects, configuration errors."""

from __future__ import annotations

import json
import time

import pytest
import torch
from torch import nn

from weight_versions import FAST, expected, follow, memory_url, publish, same_bits
from weight_teleport.codec import StagedPatch
from weight_teleport.pipeline import PublisherConfig, RetentionConfig, SubscriberConfig
from weight_teleport.publish import Publisher
from weight_teleport.subscribe import Subscriber
from weight_teleport.pipeline.errors import ConfigError
from weight_teleport.subscribe.target import Target
from weight_teleport.targets.torch import TorchTarget


class TinyCausalLM(nn.Module):
    """HF-like names: model.* decoder, lm_head tied to the embedding, unpublished buffers."""

    def __init__(self):
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(96, 32, dtype=torch.bfloat16)
        layer = nn.Module()
        layer.mlp = nn.Module()
        layer.mlp.up_proj = nn.Linear(32, 64, bias=False, dtype=torch.bfloat16)
        layer.mlp.down_proj = nn.Linear(64, 32, bias=False, dtype=torch.bfloat16)
        self.model.layers = nn.ModuleList([layer])
        self.model.norm = nn.Module()
        self.model.norm.weight = nn.Parameter(torch.ones(32))
        self.model.register_buffer("inv_freq", torch.arange(8.0), persistent=False)
        self.model.register_buffer("scale", torch.full((4,), 3.0))
        self.lm_head = nn.Linear(32, 96, bias=False, dtype=torch.bfloat16)
        self.lm_head.weight = self.model.embed_tokens.weight


def test_module_target_with_tied_weights_and_buffers() -> None:
    url, module = memory_url(), TinyCausalLM()
    with Publisher(url, PublisherConfig(anchor_every=3)) as pub, Subscriber(url, TorchTarget(module), FAST) as sub:
        for v in range(5):
            publish(pub, [v])
            follow(sub, v)
            assert same_bits(module.state_dict(), v)
            assert module.lm_head.weight is module.model.embed_tokens.weight
            assert torch.equal(module.model.inv_freq, torch.arange(8.0))
            assert torch.equal(module.model.scale, torch.full((4,), 3.0))


def test_prefix_maps_checkpoint_names() -> None:
    url, module = memory_url(), TinyCausalLM()
    with Publisher(url) as pub, Subscriber(url, TorchTarget(module.model, prefix="model."), FAST) as sub:
        publish(pub, [0, 1])
        follow(sub, 1)
        assert same_bits(module.state_dict(), 1)


class ShadowedTarget(Target):
    """A target that lends no checkpoint view (as one on a GPU or in an engine)."""

    def __init__(self):
        self.weights = {k: torch.zeros_like(t) for k, t in expected(0).items()}
        self.inner = TorchTarget(self.weights)

    def load(self, state) -> None:
        self.inner.load(state)

    def apply(self, staged: StagedPatch) -> None:
        self.inner.apply(staged)


def test_shadow_mode_stages_several_versions_for_one_pause() -> None:
    url, target = memory_url(), ShadowedTarget()
    with Publisher(url) as pub, Subscriber(url, target, FAST) as sub:
        publish(pub, range(4))
        deadline = time.monotonic() + 20
        while sub._follower.head != 3:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        report = sub.apply()
        assert report.versions == [0, 1, 2, 3] and report.version == 3 and report.pause_s > 0
        assert same_bits(target.weights, 3)


def test_view_mode_catches_up_one_version_per_apply() -> None:
    url, live = memory_url(), {k: torch.zeros_like(t) for k, t in expected(0).items()}
    with Publisher(url, PublisherConfig(anchor_every=100)) as pub:
        publish(pub, range(5))
        with Subscriber(url, TorchTarget(live), FAST) as sub:
            reports = follow(sub, 4)
            assert [v for r in reports for v in r.versions] == [0, 1, 2, 3, 4]
            assert same_bits(live, 4) and sub.stats.objects_rejected == 0


def test_restart_with_known_version_applies_the_chain_only() -> None:
    url = memory_url()
    with Publisher(url, PublisherConfig(anchor_every=100)) as pub:
        publish(pub, range(5))
    live = {k: t.clone() for k, t in expected(2).items()}
    with Subscriber(url, TorchTarget(live), SubscriberConfig(initial_version=2, watch_timeout_s=0.2)) as sub:
        reports = follow(sub, 4)
    assert [v for r in reports for v in r.versions] == [3, 4] and not any(r.resynced for r in reports)
    assert same_bits(live, 4)


def test_wrong_version_claim_resyncs_from_an_anchor() -> None:
    url = memory_url()
    with Publisher(url, PublisherConfig(anchor_every=2)) as pub:
        publish(pub, range(6))
    live = {k: t.clone() for k, t in expected(1).items()}
    with Subscriber(url, TorchTarget(live), SubscriberConfig(initial_version=3, watch_timeout_s=0.2)) as sub:
        reports = follow(sub, 5)
    assert reports[0].resynced and any("resync" in e for e in reports[0].events)
    assert same_bits(live, 5) and sub.stats.resyncs == 1


def test_modified_live_weights_resync() -> None:
    url, live = memory_url(), {k: torch.zeros_like(t) for k, t in expected(0).items()}
    with Publisher(url, PublisherConfig(anchor_every=2)) as pub, Subscriber(url, TorchTarget(live), FAST) as sub:
        publish(pub, range(3))
        follow(sub, 2)
        live["model.norm.weight"].view(torch.int32)[0] ^= 1  # the sampler scribbles on it
        publish(pub, [3])
        reports = follow(sub, 3)
        assert any(r.resynced for r in reports) and same_bits(live, 3)


def test_retention_breaks_a_lagging_chain_and_the_subscriber_resyncs() -> None:
    url, live = memory_url(), {k: torch.zeros_like(t) for k, t in expected(0).items()}
    config = PublisherConfig(anchor_every=2, retention=RetentionConfig(keep_anchors=1))
    with Publisher(url, config) as pub, Subscriber(url, TorchTarget(live), FAST) as sub:
        publish(pub, [0, 1])
        follow(sub, 1)
        publish(pub, range(2, 8))
        reports = follow(sub, 7)
        assert any(r.resynced for r in reports) and same_bits(live, 7)


def test_skip_backpressure_drops_intermediate_versions() -> None:
    url, live = memory_url(), {k: torch.zeros_like(t) for k, t in expected(0).items()}
    config = PublisherConfig(max_pending=1, backpressure="skip", anchor_every=100)
    with Publisher(url, config) as pub:
        handles = [pub.publish(expected(v), v) for v in range(12)]
        results = [h.wait(30) for h in handles]
        assert results[-1].version == 11 and not results[-1].skipped
        published = [r for r in results if not r.skipped]
        assert [r.base_version for r in published[1:]] == [r.version for r in published[:-1]]
        with Subscriber(url, TorchTarget(live), FAST) as sub:
            follow(sub, 11)
    assert same_bits(live, 11)


def test_resumed_publisher_continues_the_chain(tmp_path) -> None:
    url = f"file://{tmp_path}/store"
    with Publisher(url) as pub:
        publish(pub, [0, 1])
    with Publisher(url) as pub:
        r = pub.publish(expected(2)).wait(30)
    assert (r.version, r.base_version, [e.kind for e in r.objects]) == (2, 1, ["delta"])
    live = {k: torch.zeros_like(t) for k, t in expected(0).items()}
    with Subscriber(url, TorchTarget(live), FAST) as sub:
        follow(sub, 2)
    assert same_bits(live, 2) and r.ratio > 5 and r.encode_s > 0


def test_configuration_errors_say_what_to_change() -> None:
    with pytest.raises(ConfigError, match="baseline_device"):
        Publisher(memory_url(), PublisherConfig(baseline_device="cuda"))
    with pytest.raises(ConfigError, match="backpressure"):
        Publisher(memory_url(), PublisherConfig(backpressure="drop"))
    with Publisher(memory_url(), PublisherConfig(memory_budget_bytes=1000)) as pub:
        with pytest.raises(ConfigError, match="memory_budget_bytes"):
            pub.publish(expected(0))
    with Publisher(memory_url()) as pub:
        pub.publish(expected(0), 5).wait(30)
        with pytest.raises(ValueError, match="versions only grow"):
            pub.publish(expected(1), 5)


def test_cli_publish_pull_status_round_trip(tmp_path, capsys) -> None:
    from safetensors.torch import load_file, save_file

    from weight_teleport.cli import main

    url = f"file://{tmp_path}/store"
    for v in range(3):
        save_file(expected(v), str(tmp_path / "model.safetensors"))
        assert main(["publish", str(tmp_path), "--to", url, "--anchor-every", "2"]) == 0
    assert main(["status", url, "--manifest"]) == 0
    doc = json.loads(capsys.readouterr().out.split("\n", 3)[3])
    assert doc["latest"] == 2 and [e["kind"] for e in doc["entries"]] == ["snapshot", "delta", "delta", "snapshot"]
    for v in (1, 2):
        assert main(["pull", url, "--out", str(tmp_path / f"out{v}"), "--version", str(v)]) == 0
        assert same_bits(load_file(tmp_path / f"out{v}" / "model.safetensors"), v)


def test_an_anchor_upload_pauses_while_a_delta_uploads() -> None:
    """`DeltasFirst`: the anchor's upload waits between its pieces while a delta is in
    flight, and goes on once it is announced (or after `max_wait_s`, whatever holds it)."""
    import threading

    from weight_teleport.publish.anchors import DeltasFirst

    gate, passed = DeltasFirst(max_wait_s=600), threading.Event()
    anchor = threading.Thread(target=lambda: (gate.wait_turn(), passed.set()))
    with gate.uploading():
        anchor.start()
        assert not passed.wait(0.2), "the anchor went on while a delta was uploading"
    assert passed.wait(60)
    anchor.join()
    impatient = DeltasFirst(max_wait_s=0.01)
    with impatient.uploading():
        impatient.wait_turn()  # returns: a stuck delta does not stall the anchor for good


def test_anchor_follows_its_delta_and_a_cold_start_uses_it() -> None:
    """A version that carries an anchor is announced with its delta alone; the anchor is
    stored and announced after it, in version order, and a new subscriber starts from it."""
    url = memory_url()
    with Publisher(url, PublisherConfig(anchor_every=4, threads=1)) as pub:
        results = [pub.publish(expected(v), v).wait(30) for v in range(6)]
        assert pub.flush(30)
        manifest = json.loads(pub._store.get_manifest())
    assert results[4].objects[0].kind == "delta"
    assert results[4].anchor_encode_s > 0 and results[4].anchor_s > 0
    assert [e.kind for e in results[4].objects] == ["delta", "snapshot"]
    order = [(e["version"], e["kind"]) for e in manifest["entries"]]
    assert order == sorted(order, key=lambda vk: (vk[0], vk[1] == "snapshot"))
    assert (4, "snapshot") in order and (0, "snapshot") in order
    live = {k: torch.zeros_like(v) for k, v in expected(0).items()}
    with Subscriber(url, TorchTarget(live), FAST) as sub:
        reports = follow(sub, 5)
    assert same_bits(live, 5)
    assert reports[0].versions[0] == 4, "the cold start should take the newest anchor"


@pytest.mark.parametrize("mode", ["view", "shadow"])
def test_each_pack_header_is_parsed_once(monkeypatch, mode) -> None:
    """The subscriber parses a pack's header once, when it checks the fetched object; the
    stage takes that header (a snapshot and deltas, against the view or a shadow)."""
    from weight_teleport.codec import api
    from weight_teleport.pipeline import fetch as F

    url = memory_url()
    with Publisher(url, PublisherConfig(anchor_every=100)) as pub:
        publish(pub, range(3))
        parsed = []
        for mod in (api, F):
            real = mod.read_header
            monkeypatch.setattr(mod, "read_header", lambda *a, real=real, **k: parsed.append(1) or real(*a, **k))
        target = (
            ShadowedTarget()
            if mode == "shadow"
            else TorchTarget({k: torch.zeros_like(t) for k, t in expected(0).items()})
        )
        with Subscriber(url, target, FAST) as sub:
            follow(sub, 2)
            assert len(parsed) == sub.stats.objects_fetched == 3
