"""Puts every test folder on `sys.path`, so a test module imports another's helpers by name
from any folder: in pytest (conftest.py), and in the processes tests start (`PYTHONPATH`
below)."""

import os
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
FOLDERS = [str(TESTS), *sorted(str(p) for p in TESTS.iterdir() if p.is_dir() and p.name.isidentifier())]

for _folder in FOLDERS:
    if _folder not in sys.path:
        sys.path.insert(1, _folder)


def pythonpath() -> str:
    """`PYTHONPATH` for a process a test starts: every test folder, then the caller's own."""
    return os.pathsep.join([*FOLDERS, *filter(None, [os.environ.get("PYTHONPATH")])])
