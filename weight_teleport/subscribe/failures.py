"""A follower's ledger of the objects it failed to stage: what plans avoid.

Contracts: an object's failures are counted until it is staged, across attempts; at
`attempts` it is set aside (plans avoid it while another plan exists). An object whose
checked bytes failed to stage is broken for good: its bytes will not change, so no plan
takes it again. Keys that the accepted manifest no longer lists are forgotten."""

from __future__ import annotations

from typing import Callable

from weight_teleport.format.manifest import Entry


class Failures:
    """Failures per object key; each one is also told to `report(why, permanent)`."""

    def __init__(self, attempts: int, report: Callable[[str, bool], None]):
        self.attempts, self.report = attempts, report
        self.strikes: dict[str, int] = {}
        """Failures of each key since it was last staged."""
        self.broken: dict[str, str] = {}
        """Keys that can never be staged here, and why."""

    # What plans avoid.
    def set_aside(self) -> set[str]:
        """Keys that failed `attempts` times since they were last staged."""
        return {k for k, n in self.strikes.items() if n >= self.attempts}

    def note(self) -> str:
        """What is set aside and why, for a message that no plan exists ("" if nothing)."""
        notes = [f"{k} ({why})" for k, why in self.broken.items()]
        notes += [
            f"{k} (failed {n} times)" for k, n in self.strikes.items() if n >= self.attempts and k not in self.broken
        ]
        return f"; set aside: {'; '.join(notes[:3])}" if notes else ""

    def keep_listed(self, listed: set[str]) -> None:
        """Forget the keys a newly accepted manifest no longer lists."""
        self.strikes = {k: n for k, n in self.strikes.items() if k in listed}
        self.broken = {k: why for k, why in self.broken.items() if k in listed}

    def forget(self) -> None:
        """Forget every failure (the store was reset)."""
        self.strikes, self.broken = {}, {}

    # Outcomes.
    def strike(self, entry: Entry, why: str, staging: bool = False) -> None:
        """Count a failure of `entry`; set it aside at `attempts` (for good if it was
        fetched and checked, yet failed to stage: its bytes will not change)."""
        n = self.strikes[entry.key] = self.strikes.get(entry.key, 0) + 1
        if n >= self.attempts:
            if staging:
                self.broken[entry.key] = why
            why += f" ({n} failure{'s' if n > 1 else ''}: set aside, seeking another plan)"
        self.report(why, False)

    def set_broken(self, entry: Entry, why: str) -> None:
        """Set `entry` aside for good: no plan takes it again."""
        self.broken[entry.key] = why
        self.report(why, True)

    def staged(self, entry: Entry) -> None:
        """`entry` was staged: its failures are forgiven."""
        self.strikes.pop(entry.key, None)
