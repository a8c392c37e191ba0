"""Version arithmetic: catch-up plans and retention. Plain Python, no torch, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, replace

from weight_teleport.pipeline.errors import NoPlanError
from weight_teleport.format.manifest import Entry, Manifest, Retention


@dataclass(frozen=True)
class Plan:
    """The objects to fetch and apply, in order, to reach `target`."""

    steps: tuple[Entry, ...]
    target: int | None
    from_anchor: bool
    """The plan starts from a snapshot (the receiver's weights are not needed)."""
    chain_broken: bool
    """The receiver had a version but no chain of deltas leads from it to `target`."""

    @property
    def nbytes(self) -> int:
        """Bytes to fetch."""
        return sum(e.size for e in self.steps)


def plan_catchup(
    manifest: Manifest, current: int | None, target: int | None = None, exclude: frozenset[str] | set[str] = frozenset()
) -> Plan:
    """The cheapest plan (fewest bytes, then fewest steps) from `current` (None: no usable
    weights) to `target` (None: the latest version), skipping keys in `exclude`.

    A plan applies the chain of deltas from `current`, or jumps to an anchor and applies
    the deltas after it, whichever fetches less. Raise NoPlanError if nothing reaches
    `target`."""
    target = manifest.latest if target is None else target
    if target is None or current == target:
        return Plan((), target, False, False)
    if current is not None and current > target:
        current = None  # ahead of the store (it was reset): start again from an anchor
    best = _cheapest(manifest, current, target, exclude)
    if target not in best:
        raise NoPlanError(
            f"no anchor or chain of deltas in the store reaches version {target} "
            f"(from {current}); publish a new anchor or pick another version"
        )
    steps = best[target]
    from_anchor = steps[0].kind == "snapshot"
    broken = current is not None and from_anchor and not _chain_exists(manifest, current, target, exclude)
    return Plan(steps, target, from_anchor, broken)


def _cheapest(manifest: Manifest, current: int | None, target: int, exclude) -> dict[int | None, tuple[Entry, ...]]:
    """The cheapest steps from `current` to every version up to `target` that a plan
    avoiding `exclude` reaches (`current` itself in no steps)."""
    best: dict[int | None, tuple[int, int, tuple[Entry, ...]]] = {}
    if current is not None:
        best[current] = (0, 0, ())
    for e in manifest.entries:
        if e.version > target or (current is not None and e.version <= current) or e.key in exclude:
            continue
        candidate: tuple[int, int, tuple[Entry, ...]]
        if e.kind == "snapshot":
            candidate = (e.size, 1, (e,))
        elif e.base in best:
            cost, n, steps = best[e.base]
            candidate = (cost + e.size, n + 1, steps + (e,))
        else:
            continue
        if e.version not in best or candidate[:2] < best[e.version][:2]:
            best[e.version] = candidate
    return {v: steps for v, (_, _, steps) in best.items()}


def plan_avoiding(manifest: Manifest, current: int | None, set_aside: set[str], broken: set[str]) -> Plan:
    """The plan to follow from `current`: the cheapest to the latest version that avoids
    the `set_aside` keys; failing that, the cheapest to the newest version that such a plan
    reaches (its `target` is then older than the latest: what can be applied is, while the
    latest cannot be reached); failing that, one to the latest that tries set-aside keys
    again, except `broken` ones (a store can be repaired, an object that cannot be staged
    stays what it is). Raise NoPlanError if none exists."""
    try:
        return plan_catchup(manifest, current, exclude=set_aside)
    except NoPlanError:
        nearer = _newest_reachable(manifest, current, set_aside)
        if nearer is not None:
            return plan_catchup(manifest, current, nearer, set_aside)
        return plan_catchup(manifest, current, exclude=broken)


def _newest_reachable(manifest: Manifest, current: int | None, exclude) -> int | None:
    """The newest version after `current` that a plan avoiding `exclude` reaches (None if
    there is none)."""
    latest = manifest.latest
    if latest is None:
        return None
    if current is not None and current > latest:
        current = None  # ahead of the store: as plan_catchup
    newer = [
        v for v in _cheapest(manifest, current, latest, exclude) if v is not None and (current is None or v > current)
    ]
    return max(newer, default=None)


def _chain_exists(manifest: Manifest, current: int, target: int, exclude) -> bool:
    reached = {current}
    for e in manifest.entries:
        if e.kind == "delta" and e.base in reached and e.version <= target and e.key not in exclude:
            reached.add(e.version)
    return target in reached


def plan_retention(manifest: Manifest, keep_anchors: int) -> tuple[Manifest, list[Entry]]:
    """Split `manifest` into what to keep and the entries to delete: everything older
    than the `keep_anchors`-th newest anchor goes (0 keeps everything), except the boot
    version's anchor and the newest catch-up delta (the deltas after it are kept: they
    are newer than that anchor, or older than it and kept with it); an older catch-up
    delta goes, whatever `keep_anchors`, and all go once the manifest has no boot version.
    The manifest kept records the rule and the newest version removed (`Manifest.retention`)."""
    removed = manifest.retention.removed_through if manifest.retention else None
    catchups = manifest.catchup_deltas()
    newest = {catchups[-1].key} if catchups and manifest.boot is not None else set()
    superseded = {e.key for e in catchups} - newest
    anchors = manifest.anchors
    oldest = anchors[-keep_anchors].version if 0 < keep_anchors < len(anchors) else None
    boot_anchor = manifest.boot

    def kept_entry(e: Entry) -> bool:
        if e.key in superseded:
            return False
        if e.key in newest or (e.version == boot_anchor and e.kind == "snapshot"):
            return True
        return oldest is None or e.version >= oldest

    kept = tuple(e for e in manifest.entries if kept_entry(e))
    dropped = [e for e in manifest.entries if not kept_entry(e)]
    gone = [e.version for e in dropped if e.key not in superseded]  # a superseded delta removes no version
    if gone:
        removed = max(gone) if removed is None else max(removed, *gone)
    return replace(manifest, entries=kept, retention=Retention(max(0, keep_anchors), removed)), dropped


def unreferenced_keys(kept: Manifest, dropped: list[Entry]) -> list[str]:
    """The keys to delete once `dropped` left the manifest: their objects, and the side
    files no kept entry lists (anchors share the files that did not change)."""
    still = {f.key for e in kept.entries for f in e.files}
    files = {f.key for e in dropped for f in e.files} - still
    return [k for e in dropped for k in e.keys] + sorted(files)


def needs_anchor(last_anchor: int | None, version: int, anchor_every: int) -> bool:
    """Whether `version` gets a snapshot: no anchor yet (`last_anchor` None), or
    `anchor_every` versions since the last one."""
    return last_anchor is None or version - last_anchor >= anchor_every
