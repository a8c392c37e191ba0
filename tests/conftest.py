import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

try:
    from hypothesis import settings
except ImportError:  # the vLLM suite's environment runs no property tests
    settings = None

# CI runs the same examples every time; local runs explore new ones.
if settings is not None:
    settings.register_profile("ci", derandomize=True, deadline=None)
    if os.environ.get("CI"):
        settings.load_profile("ci")
