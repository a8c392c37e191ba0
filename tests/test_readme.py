"""The README's commands are what CI runs, and what its examples promise holds."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def _commands(block: str) -> list[str]:
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_ci_runs_exactly_the_readmes_install_and_test_commands():
    readme = _commands(re.search(r"```bash\n(.*?)```", _section("Install, run, test"), re.S)[1])
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert any("pytest" in c for c in readme) and any("pip install" in c for c in readme)
    first = ci.index(readme[0])
    assert ci[first:first + len(readme)] == readme
    # Nothing else installs into, or tests from, the README's environment.
    others = [line for line in ci[:first] + ci[first + len(readme):]
              if re.match(r"\s*(python -m pip|pip|python -m pytest)\b", line)]
    assert others == []


def test_the_test_extra_brings_triton_for_the_interpreter_tests():
    tomllib = pytest.importorskip("tomllib")
    test_extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["test"]
    assert any(re.match(r"triton==3\.6\.0\b", r) for r in test_extra)
