"""The README's commands are what CI runs, and what its examples promise holds."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from services import TOKEN, origin  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parents[2]


def _section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def _commands(block: str) -> list[str]:
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_ci_runs_exactly_the_readmes_install_and_test_commands():
    readme = _commands(re.search(r"```bash\n(.*?)```", _section("Install, run, test"), re.S)[1])
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert any("pytest" in c for c in readme) and any("pip install" in c for c in readme)
    first = ci.index(readme[0])
    assert ci[first : first + len(readme)] == readme
    # Nothing else installs into, or tests from, the README's environment.
    others = [
        line
        for line in ci[:first] + ci[first + len(readme) :]
        if re.match(r"\s*(python -m pip|pip|python -m pytest)\b", line)
    ]
    assert others == []


def test_the_test_extra_brings_triton_for_the_interpreter_tests():
    tomllib = pytest.importorskip("tomllib")
    test_extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    assert any(re.match(r"triton==3\.6\.0\b", r) for r in test_extra)


def _python_blocks(title: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", _section(title), re.S)


def test_the_top_level_lists_the_public_surface():
    import weight_teleport as wt

    surface = {
        "Publisher",
        "Subscriber",
        "PublisherGroup",
        "PublisherConfig",
        "SubscriberConfig",
        "RetentionConfig",
        "StoreConfig",
        "TorchTarget",
        "encode_delta",
        "encode_snapshot",
        "decode_snapshot",
        "stage_delta",
        "apply_staged",
        "apply_delta",
        "errors",
    }
    assert set(wt.__all__) == surface
    assert set(dir(wt)) == surface | {"__version__"}
    for name in surface:
        assert getattr(wt, name) is not None


def test_the_pipeline_example_follows_to_the_newest_version_run_after_run(origin, tmp_path):  # noqa: F811
    """The README's publisher and subscriber, as written but for the origin's address: a
    second run goes on after the first's versions, and its sampler still gets the newest."""
    example = _python_blocks("Quick start")[1].replace("http://127.0.0.1:8000", origin.url)
    (tmp_path / "upload.token").write_text(TOKEN)
    for run in range(2):
        out = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.splitlines()[-1].startswith(f"version {4 * run + 3}:"), out.stdout
