"""The GPU benchmark scripts under bench/ and bench/investigations/ run only on a GPU; the
functions they time by name must exist on every machine."""

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton is not installed (pip install triton)"
)


@pytest.fixture
def bench(monkeypatch):
    bench = Path(__file__).resolve().parents[2] / "bench"
    monkeypatch.syspath_prepend(str(bench))
    monkeypatch.syspath_prepend(str(bench / "investigations"))
    yield
    for name in ("cuda_bench", "timeline", "stage_host", "kernel_ab", "versions"):
        sys.modules.pop(name, None)


def test_timed_functions_exist(bench):
    import cuda_bench
    import timeline

    spots = [*cuda_bench.encode_spots(), *cuda_bench.stage_spots(), *(s for v in timeline.SPOTS.values() for s in v)]
    missing = [
        f"{getattr(owner, '__name__', owner)}.{name}"
        for owner, name in spots
        if not callable(getattr(owner, name, None))
    ]
    assert not missing, missing
    assert len(spots) > 40


def test_stage_host_bench_runs(bench, monkeypatch, capsys):
    """bench/investigations/stage_host.py (the stage's host path on the CPU) on a small structured pack."""
    import stage_host

    monkeypatch.setattr(sys, "argv", ["stage_host.py", "--scale", "512", "--repeats", "1"])
    stage_host.main()
    out = capsys.readouterr().out
    assert "399 tensors" in out and "StreamsRead.result" in out


def test_kernel_ab_finds_every_kernels_outputs(bench):
    """bench/investigations/kernel_ab.py reads each kernel's output parameters off warp.cu's signatures: each
    is a pointer the kernel may write, and the Python that launches it passes a tensor there."""
    import kernel_ab

    from weight_teleport.codec.cuda.kernels import warp

    source = warp.SOURCE.read_text()
    assert kernel_ab.output_indices(source, "place_lanes") == [14, 15, 16]
    assert kernel_ab.output_indices(source, "class_counts") == [4, 5]
    for kernel in kernel_ab.OUTPUTS:
        params = kernel_ab.parameters(source, kernel)
        for i in kernel_ab.output_indices(source, kernel):
            assert "*" in params[i] and not params[i].startswith("const"), (kernel, params[i])
    assert sorted(k for ks in kernel_ab.CALLS.values() for k in ks) == sorted(kernel_ab.OUTPUTS)
