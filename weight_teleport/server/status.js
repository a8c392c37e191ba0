// The status page's script: poll status.json, render it again (status_page.py renders the
// first copy). Plain DOM, no build step.
"use strict";
let view = {offset: 0, limit: INITIAL.samplers.limit, state: "", q: ""};
const $ = (id) => document.getElementById(id);
const esc = (s) => String(s ?? "-").replace(/[&<>"]/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]));
const bytes = (n) => n == null ? "-" : n >= 1e9 ? (n / 1e9).toFixed(2) + " GB" : n >= 1e6 ? (n / 1e6).toFixed(2) + " MB" : n >= 1e3 ? (n / 1e3).toFixed(2) + " kB" : n + " B";
const secs = (s) => s == null ? "-" : s < 1 ? (s * 1e3).toFixed(1) + " ms" : s < 120 ? s.toFixed(1) + " s" : s < 7200 ? (s / 60).toFixed(0) + " min" : (s / 3600).toFixed(1) + " h";
const td = (v, cls) => `<td${cls ? ` class="${cls}"` : ""}>${esc(v)}</td>`;

function samplerRow(s) {
  return `<tr data-sampler="${esc(s.id)}" data-state="${s.state}" data-version="${s.version ?? ""}">` +
    td(s.id) + td(s.state, s.state) + td(s.version) + td(s.versions_behind) + td(secs(s.lag_s)) +
    td(secs(s.pause_s)) + td(secs(s.ready_s)) + td(secs(s.heard_s_ago) + " ago") + td(s.last_error || "", "err") + "</tr>";
}

function versionRow(v) {
  const kind = v.kinds.join("+") + (v.anchor ? " (anchor)" : "");
  return "<tr>" + td(v.version) + td(kind) + td(v.base) + td(bytes(v.wire_bytes)) + td(bytes(v.raw_bytes)) +
    td(v.ratio == null ? "-" : v.ratio.toFixed(0) + "x") + td(v.age_s == null ? "-" : secs(v.age_s) + " ago") + "</tr>";
}

// A chart of [x, y, dark?] points in an <svg>: bars, or dots on a line.
function chart(svg, points, kind, label) {
  const w = svg.width.baseVal.value, h = svg.height.baseVal.value, pad = 4;
  if (!points.length) { svg.innerHTML = `<text x="8" y="20" fill="#999">no data yet</text>`; return; }
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y1 = Math.max(...ys) || 1;
  const bw = kind === "bars" ? Math.max(1, (w - 2 * pad) / points.length - 1) : 4;
  const X = (x) => pad + bw / 2 + (x1 === x0 ? (w - 2 * pad - bw) / 2 : (x - x0) / (x1 - x0) * (w - 2 * pad - bw));
  const Y = (y) => h - pad - y / y1 * (h - 2 * pad - 12);
  const marks = points.map((p) => kind === "bars"
    ? `<rect x="${X(p[0]) - bw / 2}" y="${Y(p[1])}" width="${bw}" height="${h - pad - Y(p[1])}" fill="${p[2] ? "#335" : "#8ab"}"/>`
    : `<circle cx="${X(p[0])}" cy="${Y(p[1])}" r="2" fill="#c60"/>`).join("");
  svg.innerHTML = marks + `<text x="${w - 6}" y="12" text-anchor="end" font-size="10" fill="#555">max ${label(y1)}</text>`;
}

function render(doc) {
  const s = doc.samplers, store = doc.store;
  const states = Object.entries(s.by_state).filter(([, n]) => n).map(([k, n]) => `${n} ${k}`).join(", ") || "none yet";
  $("summary").innerHTML = `latest version <b>${esc(store.latest ?? "none")}</b> · ${store.versions.length} versions, ` +
    `${bytes(store.stored_bytes)} stored · ${s.total} samplers (${esc(states)})`;
  $("states").innerHTML = Object.entries(s.by_state).map(([k, n]) =>
    `<span class="chip ${k}${view.state === k ? " on" : ""}" data-state="${k}">${k} ${n}</span>`).join("");
  $("by-version").textContent = "by version: " + (Object.entries(s.by_version).map(([v, n]) => `v${v}: ${n}`).join(" · ") || "-");
  $("samplers").innerHTML = s.items.map(samplerRow).join("");
  $("range").textContent = `${s.items.length ? s.offset + 1 : 0}-${s.offset + s.items.length} of ${s.matched}`;
  $("versions").innerHTML = store.versions.slice().reverse().map(versionRow).join("");
  $("retention").textContent = store.retention.note;
  chart($("chart-bytes"), doc.charts.bytes_per_version, "bars", bytes);
  chart($("chart-ready"), doc.charts.ready_per_version, "dots", secs);
  chart($("chart-pause"), doc.charts.pauses, "dots", secs);
}

async function refresh() {
  const q = new URLSearchParams({offset: view.offset, limit: view.limit, state: view.state, q: view.q});
  try {
    const resp = await fetch("status.json?" + q, {cache: "no-store"});
    if (resp.ok) render(await resp.json());
  } catch (e) { /* the origin is away: keep the last view, try again */ }
}

$("states").addEventListener("click", (e) => {
  const st = e.target.dataset.state;
  if (st) { view.state = view.state === st ? "" : st; view.offset = 0; refresh(); }
});
$("q").addEventListener("input", (e) => { view.q = e.target.value; view.offset = 0; refresh(); });
$("prev").addEventListener("click", () => { view.offset = Math.max(0, view.offset - view.limit); refresh(); });
$("next").addEventListener("click", () => { view.offset += view.limit; refresh(); });
render(INITIAL);
setInterval(refresh, REFRESH_MS);
