"""The demo's trainer as a group of ranks (`weight-teleport demo --trainer-ranks N`):
torch.distributed over gloo, the fp32 master weights sharded by FSDP2 (`fully_shard`), each
rank publishing its own shard of every version with a `PublisherGroup`. No rank gathers the
weights: a version is the ranks' parts, visible once all are stored. Every rank trains on
the same rollouts (read from the store), so the run is the unsharded run, bit for bit; rank 0
reports each version's row for all of them."""

import time
from datetime import timedelta

import torch

from weight_teleport.demo.policy import DemoConfig, build_model, make_optimizer, published, train_step
from weight_teleport.demo.roles import rollout_tokens


def _local(state: dict) -> dict:
    return {k: v.to_local() if hasattr(v, "to_local") else v for k, v in state.items()}


def _changed(old: dict, new: dict) -> int:
    old, new = _local(old), _local(new)
    return sum(int((old[k].view(torch.int16) != new[k].view(torch.int16)).sum()) for k in old)


def _sharded_master(cfg: DemoConfig, world: int) -> torch.nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    master = build_model(cfg, torch.float32)
    mesh = init_device_mesh("cpu", (world,))
    for layer in master.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(master, mesh=mesh)
    return master


def trainer_rank(
    rank: int, world: int, port: int, url: str, token: str, cfg: DemoConfig, rows, timeout: float = 120.0
) -> None:
    """Rank `rank` of `world` trainer ranks: train on the sampler's rollouts, publish this
    rank's shard of every version."""
    import torch.distributed as dist

    from weight_teleport.pipeline import PublisherConfig
    from weight_teleport.publish import PublisherGroup
    from weight_teleport.publish.ranks import Ranks
    from weight_teleport.store import StoreConfig, open_store

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=timeout)
    )
    master = _sharded_master(cfg, world)
    opt = make_optimizer(master, cfg)
    store = open_store(url, StoreConfig(token=token))
    config = PublisherConfig(anchor_every=1000, resume=False, threads=1, store=StoreConfig(token=token))
    # the demo's own gathers run on a group it ends (`Ranks`): the last collective before
    # exit must not be on the default group, which FSDP2's mesh keeps to the end
    ranks = Ranks()
    try:
        with PublisherGroup(url, config) as group:
            if rank == 0:
                rows.put(
                    (
                        "note",
                        None,
                        f"trainer ranks: {world} FSDP2 shards built; publishing version 0, "
                        "the first anchor (one part per rank)",
                    )
                )
            weights = published(master)  # DTensors: each rank's box of every tensor
            for version in range(cfg.steps + 1):
                r = group.publish(weights, version)
                kind = r.kinds[0]
                sizes = ranks.gather((r.part_bytes[kind], r.raw_bytes, r.encode_s))
                if rank == 0:
                    rows.put(
                        (
                            "trainer",
                            version,
                            {
                                "wire": sum(s[0] for s in sizes),
                                "full": sum(s[1] for s in sizes),
                                "encode_ms": max(s[2] for s in sizes) * 1e3,
                                "published_at": time.time(),
                                "published": None,
                            },
                        )
                    )
                if version == cfg.steps:
                    break
                train_step(master, opt, rollout_tokens(store, version, cfg, timeout), cfg)
                new = published(master)
                changed = ranks.gather(_changed(weights, new))
                if rank == 0:
                    rows.put(("trainer", version + 1, {"changed": sum(changed)}))
                weights = new
    finally:
        ranks.close()
    store.close()
    dist.destroy_process_group()
