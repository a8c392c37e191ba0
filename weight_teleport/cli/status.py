"""`weight-teleport status`: what a store holds, and, from an HTTP origin, where its
samplers are; `--watch` refreshes it, `--json` prints the status document for scripts."""

from __future__ import annotations

import argparse
import json
import sys
import time

from weight_teleport.cli.common import add_store_arguments, store_config

CLEAR = "\x1b[H\x1b[2J"
VERSIONS_SHOWN = 20


def status_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="store URL (an http(s):// origin also lists its samplers)")
    p.add_argument("--json", action="store_true", help="print the status document as JSON (an origin's /status.json)")
    p.add_argument("--manifest", action="store_true", help="print the store's manifest as JSON")
    p.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=2.0,
        metavar="SECONDS",
        help="refresh every SECONDS (2 when given alone) until Ctrl-C",
    )
    p.add_argument("--samplers", type=int, default=20, help="samplers listed, the worst first")
    add_store_arguments(p)


def status_main(args: argparse.Namespace) -> int:
    from weight_teleport.store import open_store

    with open_store(args.url, store_config(args)) as store:
        if args.manifest:
            from weight_teleport.cli.pipeline import read_manifest

            print(read_manifest(store, args.url).to_json().decode())
            return 0
        if args.watch is None:
            doc = status_document(store, args.samplers)
            print(json.dumps(doc, indent=1) if args.json else render(doc, args.url))
            return 1 if doc["store"].get("error") else 0  # unreadable, or damaged objects
        return _watch(store, args)


def _watch(store, args: argparse.Namespace) -> int:
    """Print the status again every `args.watch` seconds; an error is shown, not fatal."""
    from weight_teleport.errors import WeightTeleportError

    try:
        while True:
            try:
                doc = status_document(store, args.samplers)
                text = json.dumps(doc) if args.json else render(doc, args.url)
            except (WeightTeleportError, OSError) as exc:
                text = f"{args.url}: {exc} (retrying)"
            stamp = time.strftime("%H:%M:%S")
            if args.json:
                print(text, flush=True)
            else:
                sys.stdout.write(f"{CLEAR}{text}\n\n{stamp}, every {args.watch:g} s (Ctrl-C ends)\n")
                sys.stdout.flush()
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0


def status_document(store, samplers: int) -> dict:
    """An origin's /status.json, else a document of the same shape from the manifest."""
    from weight_teleport.observe.probe import object_problems
    from weight_teleport.observe.status import store_summary
    from weight_teleport.format.manifest import from_json

    get_status = getattr(store, "get_status", None)
    if get_status is not None:
        doc = get_status(f"limit={max(0, min(samplers, 500))}")
        if doc is not None:
            return doc
    raw = store.get_manifest()
    manifest = None if raw is None else from_json(raw)
    problems = None if manifest is None else object_problems(store, manifest)
    return {"now": time.time(), "store": store_summary(manifest, problems=problems), "samplers": None}


def _s(seconds) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:.1f}ms" if seconds < 1 else f"{seconds:.1f}s"


def render(doc: dict, url: str) -> str:
    """The status document as terminal tables."""
    store, lines = doc["store"], []
    versions = store["versions"]
    if not versions:
        lines.append(f"{url}: nothing was published there yet")
    else:
        boot = "" if store.get("boot") is None else f", boot version {store['boot']} (catch-up deltas from it)"
        lines.append(
            f"{url}: {len(versions)} versions, latest {store['latest']}, anchors "
            f"{store['anchors']}{boot}, {store['stored_bytes'] / 1e6:.2f} MB stored"
        )
    lines.append(store["retention"]["note"])
    if store.get("error"):
        lines.append(store["error"])
    if versions:
        lines.append(f"{'version':>8} {'kind':>16} {'base':>6} {'wire bytes':>12} {'ratio':>7} {'age':>8}")
        for v in versions[-VERSIONS_SHOWN:][::-1]:
            ratio = f"{v['ratio']:.0f}x" if v["ratio"] else "-"
            kind = "+".join(v["kinds"])
            base = "-" if v["base"] is None else v["base"]
            lines.append(
                f"{v['version']:>8} {kind:>16} {base:>6} {v['wire_bytes']:>12,} {ratio:>7} {_s(v['age_s']):>8}"
            )
        if len(versions) > VERSIONS_SHOWN:
            lines.append(f"  ... {len(versions) - VERSIONS_SHOWN} older versions")
    s = doc.get("samplers")
    if s is not None:
        states = ", ".join(f"{n} {k}" for k, n in s["by_state"].items() if n) or "none"
        by_version = ", ".join(f"v{k}: {n}" for k, n in s["by_version"].items()) or "-"
        lines += ["", f"{s['total']} samplers ({states}); by version: {by_version}"]
        if s["items"]:
            lines.append(
                f"{'sampler':<24} {'state':>9} {'version':>8} {'behind':>6} {'lag':>8} "
                f"{'pause':>8} {'ready':>8}  last error"
            )
        for r in s["items"]:
            version = "-" if r["version"] is None else r["version"]
            behind = "-" if r["versions_behind"] is None else r["versions_behind"]
            lines.append(
                f"{r['id'][:24]:<24} {r['state']:>9} {version:>8} {behind:>6} "
                f"{_s(r['lag_s']):>8} {_s(r['pause_s']):>8} {_s(r['ready_s']):>8}  "
                f"{(r['last_error'] or '')[:60]}"
            )
        if s["matched"] > len(s["items"]):
            lines.append(f"  ... {s['matched'] - len(s['items'])} more (--samplers N)")
    return "\n".join(lines)
