"""Structured logs: key=value events, quoted where needed; repeats limited to a line per
doubling."""

from __future__ import annotations

import logging

from weight_teleport.observe.logs import Repeats, kv
from weight_teleport.pipeline.health import HealthMonitor


def test_events_are_key_value_lines() -> None:
    assert (
        kv("publish_failed", version=3, error='HTTP 503 "busy"', none=None, s=0.123456)
        == 'event=publish_failed version=3 error="HTTP 503 \\"busy\\"" s=0.1235'
    )
    assert "\n" not in kv("x", error="two\nlines")


def test_repeats_log_once_per_doubling() -> None:
    r = Repeats(quiet_s=1e9)
    assert [n for n in range(1, 70) if r.should_log()] == [1, 2, 4, 8, 16, 32, 64]
    assert r.reset() == 69 and r.should_log()


def test_a_store_down_for_long_logs_a_line_per_doubling(caplog) -> None:
    caplog.set_level(logging.DEBUG, "weight_teleport")
    monitor = HealthMonitor(failing_after=3, give_up_after_s=None)
    for _ in range(300):
        monitor.failure("cannot read the store: connection refused after 0.25 s")
    loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert [m.split()[0] for m in loud] == [
        "event=subscriber_retrying",
        "event=subscriber_failing",
        *["event=subscriber_still_failing"] * 4,
    ]  # 32..256
    assert all("Traceback" not in m for m in loud)
    monitor.progress("version 1 staged")
    assert caplog.records[-1].getMessage().startswith("event=subscriber_recovered failures=300")
