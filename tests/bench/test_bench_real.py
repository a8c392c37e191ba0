"""The real-data benchmark on a tiny GGUF model written here (nothing is downloaded)."""

import numpy as np
import pytest
import torch

pytest.importorskip("gguf")

from weight_teleport.bench import gguf_model  # noqa: E402
from weight_teleport.bench.real import RealConfig  # noqa: E402
from weight_teleport.bench.real_train import TrainConfig  # noqa: E402
from weight_teleport.bench.run import run_bench  # noqa: E402

from tiny_gguf import write_tiny_gguf  # noqa: E402


def test_unpermute_inverts_the_gguf_interleave():
    w = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    heads = 2
    permuted = w.reshape(heads, 2, 2, 3).swapaxes(1, 2).reshape(8, 3)  # how GGUF writers store q/k
    assert np.array_equal(gguf_model.unpermute_rows(permuted, heads), w)


def test_real_mode_trains_caches_and_benches(tmp_path):
    model = tmp_path / "tiny.gguf"
    write_tiny_gguf(model)
    loaded, tokenizer = gguf_model.load(model)
    assert loaded.config.num_hidden_layers == 2 and tokenizer("ab").input_ids
    cfg = RealConfig(
        model=str(model),
        lrs=(1e-3,),
        steps=1,
        finetune_steps=1,
        train=TrainConfig(batch=2, seq=48, group=2, completion=4),
    )
    args = dict(
        out_dir=tmp_path / "out",
        repeats=1,
        data="real",
        real_config=cfg,
        cache_dir=tmp_path / "cache",
        lrs=(1e-3,),
        steps=1,
    )
    first = run_bench(**args)
    rows = first["results"]
    assert [r["loss"] for r in rows] == ["ntl", "pg"]
    assert all(0 < r["density"] < 1 for r in rows)
    assert rows[0]["codecs"]["weight_teleport"]["available"]
    again = run_bench(**args)  # from the cache: the same deltas
    assert [r["densities"] for r in again["results"]] == [r["densities"] for r in rows]
    assert torch.get_num_threads() >= 1
