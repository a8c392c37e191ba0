"""The HTTP origin server (`weight-teleport serve`): content-addressed, cache-friendly.

Needs aiohttp (`pip install "weight-teleport[http]"`); `ServerConfig` does not.
"""

from __future__ import annotations

from .config import ServerConfig


def _runner():
    """The runner module, which needs aiohttp, with an install hint if it is missing."""
    try:
        from . import runner
    except ImportError as exc:
        from ..store.errors import MissingDependency  # an ImportError the CLI reports plainly

        raise MissingDependency(f'the origin server needs {exc.name!r}: pip install "weight-teleport[http]"') from exc
    return runner


def __getattr__(name: str):
    if name in ("OriginServer", "serve_forever"):
        return getattr(_runner(), name)
    raise AttributeError(name)


__all__ = ["ServerConfig", "OriginServer", "serve_forever"]
