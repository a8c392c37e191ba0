import os

import folders  # noqa: F401 (every test folder on sys.path)

try:
    from hypothesis import settings
except ImportError:  # the vLLM suite's environment runs no property tests
    settings = None

# CI runs the same examples every time; local runs explore new ones.
if settings is not None:
    settings.register_profile("ci", derandomize=True, deadline=None)
    if os.environ.get("CI"):
        settings.load_profile("ci")
