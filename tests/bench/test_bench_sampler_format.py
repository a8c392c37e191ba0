"""The delta benchmark with a sampler format: our codec on the same steps quantized."""

import json

from weight_teleport.bench.run import OURS, run_bench


def test_run_bench_measures_the_fp8_block_sampler_format(tmp_path, capsys):
    result = run_bench("tiny", lrs=(1e-5,), steps=1, out_dir=tmp_path, repeats=1, sampler_format="fp8-block")
    (row,) = result["results"]
    assert result["params"]["sampler_format"] == "fp8-block"
    q = row["sampler_format"]
    assert q["name"] == "fp8-block"
    assert 0 < q["density"] <= 1 and len(q["densities"]) == 1
    parts = q["changed_by_part"]
    assert set(parts) == {"fp8", "scales", "unquantized"}
    assert all(p["elements"] > 0 and 0 <= p["changed"] <= p["elements"] for p in parts.values())
    assert parts["fp8"]["changed"] > 0
    assert q["elements"] == sum(p["elements"] for p in parts.values())
    assert q["quantize_ms"] > 0
    assert set(q["codecs"]) == {OURS, f"{OURS}_sparse_ac", f"{OURS}_auto"}
    for name, stats in q["codecs"].items():
        bf16 = row["codecs"][name]
        assert stats["available"] and stats["bytes_per_step"] > 0
        assert stats["bytes_per_step"] < bf16["bytes_per_step"], name  # one byte per weight, not two
        assert stats["bytes_over_bf16"] == stats["bytes_per_step"] / bf16["bytes_per_step"]
        assert stats["encode_ms_incl_quantize"] > stats["encode_ms"] > 0
        assert stats["encode_gbps_incl_quantize"] > 0 and stats["decode_gbps"] > 0
        assert stats["bits_per_changed_element"] > 0
    assert json.loads((tmp_path / "bench.json").read_text())["results"][0]["sampler_format"]["name"] == "fp8-block"
    assert "sampler format fp8-block" in capsys.readouterr().out


def test_run_bench_without_a_sampler_format_has_no_quantized_entries(tmp_path):
    result = run_bench("tiny", lrs=(1e-5,), steps=1, out_dir=tmp_path, repeats=1)
    assert "sampler_format" not in result["results"][0]
    assert result["params"]["sampler_format"] is None
