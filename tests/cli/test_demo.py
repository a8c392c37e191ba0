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
    rc = main(
        ["demo", "--trainer-ranks", "2", "--steps", "2", "--hidden", "64", "--batch", "8", "--out-dir", str(tmp_path)]
    )
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
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "weight_teleport.cli",
            "demo",
            "--engine",
            "vllm",
            "--steps",
            "3",
            "--hidden",
            "128",
            "--batch",
            "4",
            "--out-dir",
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "equal vLLM's own loader of the trainer's, bit for bit: yes" in run.stdout


def test_the_demo_says_what_it_does_before_the_first_row(capsys):
    """Its first row comes after the processes start, build, compile and publish: until
    then what they report is printed, each line as it comes, then the table."""
    import queue

    from weight_teleport.demo.policy import DemoConfig
    from weight_teleport.demo.run import HEADER, _collect

    rows = queue.Queue()
    for message in [
        ("note", None, "trainer: model built; publishing version 0"),
        ("note", None, "sampler: hf engine ready"),
        ("trainer", 0, {"wire": 10, "full": 20, "encode_ms": 1.0, "published_at": 0.0, "published": {"w": "d"}}),
        (
            "sampler",
            0,
            {
                "pause_ms": 0.1,
                "stage_ms": 1.0,
                "fetch_ms": 1.0,
                "ready_at": 1.0,
                "resynced": False,
                "digests": {"w": "d"},
            },
        ),
        ("check", 0, {"matches_trainer": True}),
    ]:
        rows.put(message)
    _collect(DemoConfig(steps=0), rows, [], numel=10)
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == ["trainer: model built; publishing version 0", "sampler: hf engine ready", HEADER]
    assert lines[3].split()[0] == "0" and " ok " in lines[3]
