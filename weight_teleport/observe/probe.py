"""The objects a manifest names, probed in their store: what `status` shows as broken."""

from __future__ import annotations

from weight_teleport.format.manifest import Manifest
from weight_teleport.store import NotFound, Store


def object_problems(store: Store, manifest: Manifest) -> dict[str, str]:
    """What is wrong with the objects `manifest` names, by key: missing, or not the size
    its entry says (truncated or overwritten). Two bytes are read at each object's end, so
    the check is cheap; a corruption that keeps the size shows only when the object is
    fetched (its content hash)."""
    sizes: dict[str, int] = {}
    for e in manifest.entries:
        for key, size in [(p.key, p.size) for p in e.parts] or [(e.key, e.size)]:
            sizes[key] = size
        sizes.update((f.key, f.size) for f in e.files)  # side files: shared by anchors
    problems = {}
    for key, size in sizes.items():
        want = min(size, 1)  # the bytes of [size - 1, size + 1) an intact object has
        try:
            came = len(store.get_range(key, size - want, size + 1))
        except NotFound:
            problems[key] = "missing"
            continue
        if came < want:
            problems[key] = f"shorter than the {size} bytes the manifest says (truncated)"
        elif came > want:
            problems[key] = f"longer than the {size} bytes the manifest says (overwritten)"
    return problems
