"""The demo end to end: two processes (or two trainer ranks under FSDP2 and a sampler) over a
real HTTP origin, checked against a colocated run bit for bit (a short run with a small
model)."""

import pytest

from weight_teleport.cli import main


@pytest.mark.slow
def test_demo_runs_and_matches_colocated(tmp_path, capsys):
    rc = main(["demo", "--steps", "3", "--hidden", "64", "--batch", "8", "--out-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "bit for bit: yes" in out
    assert (tmp_path / "reward.png").stat().st_size > 0
    assert out.count(" ok ") == 4


@pytest.mark.slow
def test_demo_with_sharded_trainers_matches_the_unsharded_run(tmp_path, capsys):
    rc = main(["demo", "--trainer-ranks", "2", "--steps", "2", "--hidden", "64", "--batch", "8",
               "--out-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "2 trainer ranks (FSDP2, gloo)" in out and out.count(" ok ") == 3
    assert "sampler weights equal a colocated unsharded run's at every version, bit for bit: yes" in out


def test_demo_rejects_bad_options(capsys):
    assert main(["demo", "--hidden", "30"]) == 1
    assert "--hidden" in capsys.readouterr().err
    assert main(["demo", "--trainer-ranks", "2", "--engine", "vllm"]) == 1
    assert "--trainer-ranks" in capsys.readouterr().err


@pytest.mark.vllm
def test_demo_with_a_real_vllm_engine(tmp_path):
    pytest.importorskip("vllm", reason="needs vLLM (the vllm suite's own environment)")
    import os
    import subprocess
    import sys

    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    run = subprocess.run([sys.executable, "-m", "weight_teleport.cli", "demo", "--engine", "vllm",
                          "--steps", "3", "--hidden", "128", "--batch", "4", "--out-dir", str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "equal vLLM's own loader of the trainer's, bit for bit: yes" in run.stdout
