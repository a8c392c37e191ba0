"""The two processes of the demo. They share nothing but the store at `url`: the trainer
publishes weight versions there, the sampler follows them and writes its rollouts back.
(With several trainer ranks, `sharded.trainer_rank` stands in for `trainer`.)
Each sends one row of measurements per version to the parent's queue for display."""

import time

import numpy as np
import torch

from weight_teleport.demo.policy import DemoConfig, build_model, make_optimizer, published, rewards, rollout, train_step

POLL_S = 0.005
FINAL_KEY = "reference/final"
"""The trainer's last published weights, uploaded once at the end for the sampler's check."""


def rollout_key(version: int) -> str:
    return f"rollouts/v{version:08d}"


def wait_object(store, key: str, timeout: float) -> bytes:
    from weight_teleport.store.errors import NotFound

    deadline = time.monotonic() + timeout
    while True:
        try:
            return store.get(key)
        except NotFound:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {key} after {timeout:.0f} s: did the sampler stop?") from None
            time.sleep(POLL_S)


def rollout_tokens(store, version: int, cfg: DemoConfig, timeout: float) -> torch.Tensor:
    """The token batch the sampler generated with `version` (waits for it)."""
    data = wait_object(store, rollout_key(version), timeout)
    return torch.from_numpy(np.frombuffer(data, np.int64).reshape(cfg.batch, -1).copy())


def _changed(old: dict, new: dict) -> int:
    return sum(int((old[k].view(torch.int16) != new[k].view(torch.int16)).sum()) for k in old)


def trainer(url: str, token: str, cfg: DemoConfig, rows, timeout: float = 120.0) -> None:
    """Train on the sampler's rollouts; publish every new version."""
    from weight_teleport.codec import tensor_digest
    from weight_teleport.pipeline import PublisherConfig
    from weight_teleport.publish import Publisher
    from weight_teleport.store import StoreConfig, open_store

    torch.set_num_threads(1)
    master = build_model(cfg, torch.float32)
    opt = make_optimizer(master, cfg)
    store = open_store(url, StoreConfig(token=token))
    config = PublisherConfig(anchor_every=1000, resume=False, threads=1, store=StoreConfig(token=token))
    with Publisher(url, config) as publisher:
        rows.put(
            (
                "note",
                None,
                "trainer: model built; publishing version 0, the first anchor "
                "(the whole weights; every later version is a delta)",
            )
        )
        weights = published(master)
        for version in range(cfg.steps + 1):
            result = publisher.publish(weights, version=version).wait()
            rows.put(
                (
                    "trainer",
                    version,
                    {
                        "wire": result.wire_bytes,
                        "full": result.raw_bytes,
                        "encode_ms": result.encode_s * 1e3,
                        "published_at": time.time(),
                        "published": {k: tensor_digest(v) for k, v in weights.items()},
                    },
                )
            )
            if version == cfg.steps:
                break
            train_step(master, opt, rollout_tokens(store, version, cfg, timeout), cfg)
            new = published(master)
            rows.put(("trainer", version + 1, {"changed": _changed(weights, new)}))
            weights = new
    from safetensors.torch import save

    store.put(FINAL_KEY, save(weights))
    store.close()


def sampler(url: str, token: str, cfg: DemoConfig, rows, engine: str = "hf", timeout: float = 300.0) -> None:
    """Follow the published versions; generate rollouts with each one; at the end check the
    live weights against the trainer's."""
    from weight_teleport.demo.engines import ENGINES
    from weight_teleport.pipeline import SubscriberConfig
    from weight_teleport.subscribe import Subscriber
    from weight_teleport.store import StoreConfig, open_store

    torch.set_num_threads(1)
    eng = ENGINES[engine](cfg)
    store = open_store(url, StoreConfig(token=token))
    rows.put(("note", None, f"sampler: {engine} engine ready; following the origin for version 0"))
    with Subscriber(url, eng.target, SubscriberConfig(threads=1)) as sub:
        for version in range(cfg.steps + 1):
            stage_before, fetch_before = sub.stats.stage_s, sub.stats.fetch_s
            if not sub.wait(timeout):
                raise TimeoutError(f"version {version} never became ready")
            ready_at = time.time()
            report = sub.apply()
            if report.version != version:
                raise RuntimeError(f"expected version {version}, the subscriber applied {report.versions}")
            row = {
                "pause_ms": report.pause_s * 1e3,
                "stage_ms": (sub.stats.stage_s - stage_before) * 1e3,
                "fetch_ms": (sub.stats.fetch_s - fetch_before) * 1e3,
                "ready_at": ready_at,
                "resynced": report.resynced,
                "digests": _digests(eng),
            }
            if version < cfg.steps:
                tokens = eng.rollout(version)
                store.put(rollout_key(version), tokens.numpy().astype(np.int64).tobytes())
                row["reward"] = float(rewards(tokens, cfg).mean())
            rows.put(("sampler", version, row))
    if cfg.trainer_ranks == 1:
        from safetensors.torch import load

        final = load(wait_object(store, FINAL_KEY, timeout))
        rows.put(("check", cfg.steps, {"matches_trainer": _matches(eng, final)}))
    else:  # no trainer rank holds the whole weights: the colocated run checks every version
        rows.put(("check", cfg.steps, {"matches_trainer": None}))
    eng.close()
    store.close()


def _digests(eng) -> dict[str, str]:
    """Digests of the live weights in checkpoint layout (HF only: vLLM keeps its own layout,
    checked against vLLM's loader at the end instead)."""
    from weight_teleport.codec import tensor_digest

    if not hasattr(eng, "weights"):
        return {}
    return {k: tensor_digest(v) for k, v in eng.weights().items()}


def _matches(eng, final: dict[str, torch.Tensor]) -> bool:
    if hasattr(eng, "matches_loader"):
        return eng.matches_loader(final)
    live = eng.weights()
    return set(live) == set(final) and all(
        torch.equal(live[k].view(torch.int16), final[k].view(torch.int16)) for k in final
    )


def colocated(cfg: DemoConfig) -> list[dict[str, str]]:
    """The same run in one process without any transport: the digests of the sampler's
    weights at every version, for the bit-exactness check."""
    from weight_teleport.codec import tensor_digest

    torch.set_num_threads(1)
    master = build_model(cfg, torch.float32)
    model = build_model(cfg, torch.bfloat16)
    opt = make_optimizer(master, cfg)
    digests = []
    for version in range(cfg.steps + 1):
        model.load_state_dict(published(master))
        digests.append({k: tensor_digest(v) for k, v in model.state_dict().items()})
        if version < cfg.steps:
            train_step(master, opt, rollout(model, cfg, version), cfg)
    return digests
