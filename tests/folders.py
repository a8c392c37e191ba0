"""Puts every test folder on `sys.path`, so a test module imports another's helpers by name
from any folder: in pytest (conftest.py) and in the scripts tests run in processes of their
own (which import this module first)."""

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

for _folder in [TESTS, *sorted(p for p in TESTS.iterdir() if p.is_dir() and p.name.isidentifier())]:
    if str(_folder) not in sys.path:
        sys.path.insert(1, str(_folder))
