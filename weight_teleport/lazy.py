"""Packages whose public names are imported on first use (PEP 562): importing the package
loads none of the modules behind them, so plain-Python modules stay light (the CLI's
`--help` reads defaults and choices without numpy or torch)."""

import importlib
from collections.abc import Callable, Mapping


def lazy_exports(package: str, homes: Mapping[str, str]) -> tuple[list[str], Callable, Callable]:
    """(`__all__`, `__getattr__`, `__dir__`) for `package`, each name of `homes` imported
    from its module on first use (`homes`: name -> module, relative to `package` where it
    starts with a dot)."""

    def __getattr__(name: str):
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(home, package), name)

    names = sorted(homes)
    return names, __getattr__, lambda: list(names)
