// The prefixroute fleet page: polls dashboard/state.json once a second and draws tables and
// SVG charts. No library: the page must work on an offline cluster. Every string from the
// server goes in through textContent, never as HTML.
"use strict";

const POLL_MS = 1000;
const WINDOW_S = 300; // the charts' time span, seconds
const COLORS = ["#6ea8fe", "#4cc38a", "#d6a23a", "#e5534b", "#b58cf0", "#3ec5c5",
                "#f08cc0", "#a3c94f", "#f0a35e", "#8a96a3"];
const SVG_NS = "http://www.w3.org/2000/svg";

let samples = []; // chart samples, oldest first: {time, replicas: {id: numbers}}
let lastSampleTime = null;
const colorOf = new Map(); // replica id -> color, stable for the page's life

function color(id) {
  if (!colorOf.has(id)) colorOf.set(id, COLORS[colorOf.size % COLORS.length]);
  return colorOf.get(id);
}

function $(id) { return document.getElementById(id); }

function fmtInt(v) { return v == null ? "-" : Math.round(v).toLocaleString("en-US"); }
function fmtNum(v, digits) { return v == null ? "-" : Number(v).toFixed(digits); }
function pct(part, whole) { return whole > 0 ? (100 * part / whole).toFixed(1) + "%" : "-"; }

function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}

// A speed the replica has not taught the router yet is marked, as `prefixroute top` marks it:
// a replica sent nothing shows its fleet's estimates, which look learned but are not its own.
const UNLEARNED_TITLE = {
  fleet: "its fleet's learned speed: too few of its own requests timed yet",
  prior: "the configured prior: too few of its own requests timed yet",
  given: "the priors given for this replica: too few of its own requests timed yet",
};

function unlearned(speed) {
  return (speed.estimates_from || "learned") === "learned" ? "" : "*";
}

function renderReplicas(replicas) {
  const body = $("replicas").querySelector("tbody");
  body.replaceChildren();
  for (const r of replicas) {
    const tr = document.createElement("tr");
    tr.dataset.replica = r.id;
    const name = cell(tr, "");
    const sw = document.createElement("span");
    sw.className = "swatch";
    sw.style.background = color(r.id);
    name.append(sw, document.createTextNode(r.id));
    name.title = r.name;
    cell(tr, r.status, r.status);
    cell(tr, fmtInt(r.in_flight), "n in-flight");
    cell(tr, fmtInt(r.prefilling), "n");
    cell(tr, fmtInt(r.queued_prefill_tokens), "n");
    cell(tr, fmtNum(r.queued_prefill_s, 3), "n");
    const rate = cell(tr, fmtInt(r.speed.prefill_tokens_per_s) + unlearned(r.speed), "n rate");
    if (unlearned(r.speed)) rate.title = UNLEARNED_TITLE[r.speed.estimates_from];
    cell(tr, fmtNum(1000 * r.speed.decode_step_s, 2), "n");
    cell(tr, `${r.speed.prefill_observations} / ${r.speed.decode_observations}`, "n");
    cell(tr, fmtInt(r.index_blocks), "n");
    cell(tr, fmtInt(r.requests), "n requests");
    cell(tr, pct(r.predicted_cached, r.prompt_tokens), "n");
    cell(tr, pct(r.actual_cached, r.prompt_tokens), "n");
    body.appendChild(tr);
  }
}

function renderDecisions(decisions) {
  const body = $("decisions").querySelector("tbody");
  body.replaceChildren();
  for (const d of decisions) {
    const tr = document.createElement("tr");
    cell(tr, new Date(d.time * 1000).toLocaleTimeString("en-GB", { hour12: false }));
    const name = cell(tr, "");
    const sw = document.createElement("span");
    sw.className = "swatch";
    sw.style.background = color(d.replica);
    name.append(sw, document.createTextNode(d.replica));
    cell(tr, d.reason, "reason");
    cell(tr, String(d.status), d.status >= 400 ? "n bad" : "n");
    cell(tr, d.predicted_cached == null ? "-" : fmtInt(d.predicted_cached), "n");
    cell(tr, d.path);
    body.appendChild(tr);
  }
}

// Per-interval rates between consecutive samples: [{t, value}] per replica.
function rateSeries(ids, key) {
  const out = new Map(ids.map((id) => [id, []]));
  for (let i = 1; i < samples.length; i++) {
    const a = samples[i - 1], b = samples[i];
    const dt = b.time - a.time;
    if (dt <= 0) continue;
    for (const id of ids) {
      const x = a.replicas[id], y = b.replicas[id];
      if (x && y) out.get(id).push([b.time, Math.max(0, (y[key] - x[key]) / dt)]);
    }
  }
  return out;
}

function levelSeries(ids, key) {
  const out = new Map(ids.map((id) => [id, []]));
  for (const s of samples) {
    for (const id of ids) {
      const v = s.replicas[id];
      if (v) out.get(id).push([s.time, v[key]]);
    }
  }
  return out;
}

// Fleet hit rate per interval: predicted and actual cached over prompt tokens, percent.
function hitSeries() {
  const pred = [], actual = [];
  for (let i = 1; i < samples.length; i++) {
    let dp = 0, dpred = 0, dact = 0;
    for (const [id, y] of Object.entries(samples[i].replicas)) {
      const x = samples[i - 1].replicas[id];
      if (!x) continue;
      dp += y.prompt_tokens - x.prompt_tokens;
      dpred += y.predicted_cached - x.predicted_cached;
      dact += y.actual_cached - x.actual_cached;
    }
    if (dp > 0) {
      pred.push([samples[i].time, 100 * dpred / dp]);
      actual.push([samples[i].time, 100 * dact / dp]);
    }
  }
  return new Map([["predicted", pred], ["actual", actual]]);
}

function svg(tag, attrs) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  return el;
}

function drawChart(el, series, colors, now, fixedMax) {
  const w = Math.max(200, el.clientWidth || 480), h = 160;
  const left = 44, right = 6, top = 6, bottom = 18;
  el.setAttribute("viewBox", `0 0 ${w} ${h}`);
  el.replaceChildren();
  let max = fixedMax || 0;
  if (!fixedMax) for (const pts of series.values()) for (const [, v] of pts) max = Math.max(max, v);
  if (max <= 0) max = 1;
  else if (!fixedMax) max *= 1.1;
  // The span shown: what has been sampled, from 30 s up to the whole window.
  const first = samples.length ? samples[0].time : now;
  const span = Math.min(WINDOW_S, Math.max(30, now - first));
  const t0 = now - span;
  const x = (t) => left + (w - left - right) * (t - t0) / span;
  const y = (v) => top + (h - top - bottom) * (1 - v / max);
  el.appendChild(svg("line", { x1: left, y1: y(0), x2: w - right, y2: y(0), class: "axis" }));
  el.appendChild(svg("line", { x1: left, y1: top, x2: left, y2: y(0), class: "axis" }));
  for (const f of [0, 0.5, 1]) {
    const label = svg("text", { x: left - 4, y: y(f * max) + 3, "text-anchor": "end", class: "tick" });
    const v = f * max;
    label.textContent = v >= 100 ? Math.round(v).toString() : v.toFixed(v >= 10 ? 0 : 2);
    el.appendChild(label);
  }
  const spanLabel = span >= 120 ? `-${Math.round(span / 60)} min` : `-${Math.round(span)} s`;
  for (const [label, ago] of [[spanLabel, span], ["now", 0]]) {
    const t = svg("text", { x: x(now - ago), y: h - 4, "text-anchor": ago ? "start" : "end", class: "tick" });
    t.textContent = label;
    el.appendChild(t);
  }
  for (const [id, pts] of series) {
    const visible = pts.filter(([t]) => t >= t0);
    if (!visible.length) continue;
    const line = svg("polyline", {
      points: visible.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" "),
      stroke: colors(id),
    });
    line.dataset.series = id;
    el.appendChild(line);
  }
}

function render(state) {
  $("policy").textContent = `policy ${state.policy}`;
  $("mode").textContent = `${state.mode} mode`;
  const t = state.totals;
  $("requests-total").textContent = fmtInt(t.requests);
  $("in-flight-total").textContent = fmtInt(t.in_flight);
  $("hit-actual").textContent = pct(t.actual_cached, t.prompt_tokens);
  $("hit-predicted").textContent = pct(t.predicted_cached, t.prompt_tokens);
  $("index-entries").textContent = fmtInt(t.index_entries);
  renderReplicas(state.replicas);
  renderDecisions(state.decisions);
  const ids = state.replicas.map((r) => r.id);
  const rates = rateSeries(ids, "requests");
  let total = 0;
  for (const pts of rates.values()) if (pts.length) total += pts[pts.length - 1][1];
  $("rate-total").textContent = samples.length > 1 ? `${total.toFixed(1)} / s` : "";
  drawChart($("chart-inflight"), levelSeries(ids, "in_flight"), color, state.time);
  drawChart($("chart-rate"), rates, color, state.time);
  drawChart($("chart-queued"), levelSeries(ids, "queued_prefill_s"), color, state.time);
  const hitColors = (id) => (id === "predicted" ? "#d6a23a" : "#4cc38a");
  drawChart($("chart-hit"), hitSeries(), hitColors, state.time, 100);
  $("updated").textContent = "updated " + new Date(state.time * 1000).toLocaleTimeString("en-GB", { hour12: false });
}

function setStatus(text, cls) {
  const el = $("status");
  el.textContent = text;
  el.className = "status " + cls;
}

async function poll() {
  const url = "dashboard/state.json" + (lastSampleTime == null ? "" : `?since=${lastSampleTime}`);
  try {
    const response = await fetch(url, { cache: "no-store", credentials: "same-origin" });
    if (!response.ok) {
      setStatus(response.status === 401 ? "token required" : `HTTP ${response.status}`, "error");
    } else {
      const state = await response.json();
      for (const s of state.history) samples.push(s);
      if (samples.length) lastSampleTime = samples[samples.length - 1].time;
      samples = samples.filter((s) => s.time >= state.time - WINDOW_S);
      render(state);
      setStatus("live", "live");
    }
  } catch (err) {
    setStatus("gateway unreachable", "error");
  }
  setTimeout(poll, POLL_MS);
}

document.addEventListener("DOMContentLoaded", poll);
