"""The status page: plain HTML rendered here from the status document, which the page's
script (status.js) then polls at `status.json` and renders again. No build step."""

from __future__ import annotations

import functools
import json
from html import escape
from importlib import resources

REFRESH_S = 2.0

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;max-width:1200px}
h1{font-size:1.3em;margin:0 0 .2em}h2{font-size:1.05em;margin:1.4em 0 .4em}
table{border-collapse:collapse;width:100%}td,th{padding:2px 8px;text-align:right;
border-bottom:1px solid #eee;white-space:nowrap}th{background:#f6f6f6}
td:first-child,th:first-child,td.err,th:last-child{text-align:left}td.err{white-space:normal;color:#a00}
.healthy{color:#070}.degraded{color:#b60}.failing{color:#c00;font-weight:bold}
.stale{color:#888;font-style:italic}.starting{color:#06c}
.chip{display:inline-block;margin:0 .4em .3em 0;padding:1px 8px;border:1px solid #ccc;
border-radius:9px;cursor:pointer}.chip.on{background:#222;color:#fff}
.charts{display:flex;gap:1em;flex-wrap:wrap}.charts figure{margin:0}
figcaption{font-size:.85em;color:#555}svg{background:#fafafa;border:1px solid #eee}
.muted{color:#777}#pager button{margin:0 .3em}
"""


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def fmt_s(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    if s < 120:
        return f"{s:.1f} s"
    return f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


def _td(value: object, cls: str = "") -> str:
    attr = f' class="{cls}"' if cls else ""
    return f"<td{attr}>{escape('-' if value is None else str(value))}</td>"


def sampler_row(s: dict) -> str:
    return (
        f'<tr data-sampler="{escape(s["id"])}" data-state="{s["state"]}" '
        f'data-version="{"" if s["version"] is None else s["version"]}">'
        + _td(s["id"])
        + _td(s["state"], s["state"])
        + _td(s["version"])
        + _td(s["versions_behind"])
        + _td(fmt_s(s["lag_s"]))
        + _td(fmt_s(s["pause_s"]))
        + _td(fmt_s(s["ready_s"]))
        + _td(fmt_s(s["heard_s_ago"]) + " ago")
        + _td(s["last_error"] or "", "err")
        + "</tr>"
    )


def version_row(v: dict) -> str:
    ratio = "-" if v["ratio"] is None else f"{v['ratio']:.0f}x"
    kind = "+".join(v["kinds"]) + (" (anchor)" if v["anchor"] else "")
    return (
        "<tr>"
        + _td(v["version"])
        + _td(kind)
        + _td(v["base"])
        + _td(fmt_bytes(v["wire_bytes"]))
        + _td(fmt_bytes(v["raw_bytes"]))
        + _td(ratio)
        + _td("-" if v["age_s"] is None else fmt_s(v["age_s"]) + " ago")
        + "</tr>"
    )


def summary(doc: dict) -> str:
    store, samplers = doc["store"], doc["samplers"]
    states = ", ".join(f"{n} {k}" for k, n in samplers["by_state"].items() if n) or "none yet"
    latest = "none" if store["latest"] is None else store["latest"]
    return (
        f"latest version <b>{latest}</b> · {len(store['versions'])} versions, "
        f"{fmt_bytes(store['stored_bytes'])} stored · {samplers['total']} samplers "
        f"({escape(states)})"
    )


@functools.lru_cache(maxsize=1)
def _script() -> str:
    return resources.files(__package__).joinpath("status.js").read_text()


def render(doc: dict) -> str:
    """The page, with `doc` (the status document) rendered in and embedded for the script."""
    samplers, store = doc["samplers"], doc["store"]
    chips = "".join(f'<span class="chip {k}" data-state="{k}">{k} {n}</span>' for k, n in samplers["by_state"].items())
    versions = " · ".join(f"v{escape(k)}: {n}" for k, n in samplers["by_version"].items())
    first, last = samplers["offset"] + 1, samplers["offset"] + len(samplers["items"])
    error = f'<p class="failing">{escape(store["error"])}</p>' if store.get("error") else ""
    state = json.dumps(doc).replace("</", "<\\/")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>weight-teleport status</title>
<meta name="viewport" content="width=device-width"><style>{_STYLE}</style></head>
<body>
<h1>weight-teleport origin</h1>
<p id="summary">{summary(doc)}</p>{error}
<h2>Charts</h2>
<div class="charts">
<figure><svg id="chart-bytes" width="360" height="120"></svg><figcaption>wire bytes per version
(anchors dark)</figcaption></figure>
<figure><svg id="chart-ready" width="360" height="120"></svg><figcaption>publish &rarr; ready per
version (median of samplers)</figcaption></figure>
<figure><svg id="chart-pause" width="360" height="120"></svg><figcaption>pauses over time</figcaption></figure>
</div>
<h2>Samplers</h2>
<div id="states">{chips}</div>
<p id="by-version" class="muted">by version: {versions or "-"}</p>
<p><input id="q" placeholder="filter by sampler id" size="30">
<span id="pager"><button id="prev">&larr;</button><span id="range">{first if last else 0}-{last} of
{samplers["matched"]}</span><button id="next">&rarr;</button></span></p>
<table><thead><tr><th>sampler</th><th>state</th><th>version</th><th>behind</th><th>lag</th>
<th>last pause</th><th>publish&rarr;ready</th><th>heard</th><th>last error</th></tr></thead>
<tbody id="samplers">{"".join(map(sampler_row, samplers["items"]))}</tbody></table>
<h2>Versions in the store</h2>
<p id="retention" class="muted">{escape(store["retention"]["note"])}</p>
<table><thead><tr><th>version</th><th>kind</th><th>base</th><th>wire bytes</th><th>weights</th>
<th>ratio</th><th>age</th></tr></thead>
<tbody id="versions">{"".join(map(version_row, reversed(store["versions"])))}</tbody></table>
<p class="muted">Refreshes every {REFRESH_S:g} s from <a href="status.json">status.json</a>;
metrics at <a href="metrics">metrics</a>.</p>
<script>const INITIAL = {state}; const REFRESH_MS = {int(REFRESH_S * 1000)};</script>
<script>{_script()}</script>
</body></html>
"""
