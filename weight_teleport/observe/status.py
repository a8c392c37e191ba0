"""What `status` shows of a store: its versions, what retention keeps and removed, and
which versions exist. Plain Python over a parsed manifest: the origin's /status.json and
the CLI share it."""

from __future__ import annotations

import time
from typing import Any

from weight_teleport.format.manifest import Manifest


def store_summary(manifest: Manifest | None, now: float | None = None, problems: dict[str, str] | None = None) -> dict:
    """The versions of `manifest` (one row each: kinds, wire bytes, ratio, anchor, age),
    the anchors, the bytes stored, the retention note, and the objects found damaged
    (`problems`: key -> what is wrong, `observe.probe.object_problems`), in words too."""
    now = time.time() if now is None else now
    if manifest is None:
        return {
            "latest": None,
            "versions": [],
            "anchors": [],
            "stored_bytes": 0,
            "retention": {"note": "nothing was published yet"},
            "broken": [],
        }
    rows: dict[int, dict] = {}
    for e in manifest.entries:
        row = rows.setdefault(
            e.version,
            {
                "version": e.version,
                "kinds": [],
                "base": None,
                "wire_bytes": 0,
                "stored_bytes": 0,
                "raw_bytes": e.raw_bytes,
                "anchor": False,
                "files": [],
                "published_at": None,
                "age_s": None,
            },
        )
        row["kinds"].append("catchup" if e.catchup else e.kind)
        row["stored_bytes"] += e.size
        if (e.kind == "delta" and not e.catchup) or not row["wire_bytes"]:
            row["wire_bytes"], row["base"] = e.size, e.base
        if e.kind == "snapshot":
            row["anchor"] = True
            row["files"] = [f.name for f in e.files]
        if e.published_at_ms:
            row["published_at"] = e.published_at_ms / 1000
            row["age_s"] = max(0.0, now - e.published_at_ms / 1000)
    for row in rows.values():
        row["ratio"] = row["raw_bytes"] / row["wire_bytes"] if row["wire_bytes"] else None
    doc: dict[str, Any] = {
        "latest": manifest.latest,
        "versions": [rows[v] for v in sorted(rows)],
        "anchors": [e.version for e in manifest.anchors],
        "boot": manifest.boot,
        "stored_bytes": sum(e.size for e in manifest.entries),
        "retention": retention_summary(manifest),
        "broken": broken_objects(manifest, problems or {}),
    }
    if doc["broken"]:
        doc["error"] = broken_note(doc["broken"])
    return doc


def broken_objects(manifest: Manifest, problems: dict[str, str]) -> list[dict]:
    """One row per damaged object: the version and kind of the entry that names it."""
    rows, seen = [], set()
    for e in manifest.entries:
        for key in e.keys + tuple(f.key for f in e.files):
            if key in problems and key not in seen:
                seen.add(key)
                rows.append({"version": e.version, "kind": e.kind, "key": key, "problem": problems[key]})
    return rows


def broken_note(broken: list[dict]) -> str:
    """The damaged objects in words, with what becomes of them."""
    listed = "; ".join(f"{b['key']} (version {b['version']} {b['kind']}): {b['problem']}" for b in broken)
    return (
        f"{len(broken)} damaged object(s) the manifest names: {listed}. Subscribers "
        f"set them aside and take another path; a publisher that cannot read its "
        f"baseline through them publishes a fresh anchor; retention removes them once "
        f"they are older than the anchors it keeps."
    )


def retention_summary(manifest: Manifest) -> dict:
    """What retention keeps, what it removed, in words too."""
    r = manifest.retention
    versions = manifest.versions
    kept = f"versions {versions[0]}..{versions[-1]}" if versions else "no version"
    if r is None:
        note = f"the store holds {kept}; its publisher did not record its retention"
        return {"keep_anchors": None, "removed_through": None, "note": note}
    rule = (
        "keeps every version"
        if r.keep_anchors == 0
        else f"keeps the {r.keep_anchors} newest anchor(s) and every version after the oldest of them"
    )
    gone = (
        "nothing was removed yet"
        if r.removed_through is None
        else f"versions up to {r.removed_through} were removed by it"
    )
    return {
        "keep_anchors": r.keep_anchors,
        "removed_through": r.removed_through,
        "note": f"the store holds {kept}; retention {rule}: {gone}",
    }


def missing_version(manifest: Manifest, version: int) -> str | None:
    """Why `version` cannot be pulled from `manifest` (None: it is there)."""
    versions = manifest.versions
    if version in versions:
        return None
    held = f"the store holds versions {_ranges(versions)}" if versions else "the store is empty"
    r = manifest.retention
    if r is not None and r.removed_through is not None and version <= r.removed_through:
        why = (
            f"version {version} was removed by retention (it keeps the {r.keep_anchors} "
            f"newest anchor(s) and what follows them)"
        )
    elif versions and version > versions[-1]:
        why = f"version {version} is not published yet (the latest is {versions[-1]})"
    elif versions and version < versions[0]:
        why = f"version {version} is no longer in the store (removed, or never published there)"
    else:
        why = f"version {version} was never published (skipped by the publisher)"
    return f"{why}; {held}"


def _ranges(versions: list[int]) -> str:
    """ "0..3, 5, 7..9" for [0, 1, 2, 3, 5, 7, 8, 9]."""
    out, start = [], None
    for i, v in enumerate(versions):
        if start is None:
            start = v
        if i + 1 == len(versions) or versions[i + 1] != v + 1:
            out.append(str(v) if v == start else f"{start}..{v}")
            start = None
    return ", ".join(out)
