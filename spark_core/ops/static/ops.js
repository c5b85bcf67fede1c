// The operations page (spark_core/ops/app.py): renders the snapshot events of
// /api/events, and the map from /api/map and /api/coastlines. No framework, no build
// step, nothing from the internet.
"use strict";

const $ = (sel) => document.querySelector(sel);
const fmt = new Intl.NumberFormat("en");

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return e;
}

function num(n) {
  return n === null || n === undefined ? "–" : fmt.format(n);
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "never";
  const s = Math.max(0, Math.round(seconds));
  if (s < 120) return `${s}s ago`;
  if (s < 7200) return `${Math.round(s / 60)}m ago`;
  if (s < 172800) return `${Math.round(s / 3600)}h ago`;
  return `${Math.round(s / 86400)}d ago`;
}

function since(epochS) {
  return epochS ? age(Date.now() / 1000 - epochS) : "–";
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function state(text) {
  return el("span", { class: `state-${text}` }, text ?? "?");
}

// -- sections --------------------------------------------------------------------------

function renderShips(ships) {
  $("#ships-empty").hidden = ships.length > 0;
  fill($("#ships tbody"), ships.map((s) => {
    const sat = s.satellite;
    let satCell = "–";
    if (sat) {
      const pct = sat.percent;
      const bar = el("span", { class: `bar${pct !== null && pct > 100 ? " over" : ""}` },
        el("span", { style: "" }));
      bar.firstChild.style.width = `${Math.min(100, pct ?? 0)}%`;
      satCell = el("span", {}, bar,
        `${bytes(sat.spent_today)} of ${sat.daily_budget ? bytes(sat.daily_budget) : "no budget"}`);
    }
    const pos = s.position ? `${s.position.lat.toFixed(2)}, ${s.position.lon.toFixed(2)}` : "–";
    const behind = el("td", { class: "num backlog", "data-ship": s.ship }, num(s.backlog_records));
    behind.title = s.streams.map((x) =>
      `${x.stream}: ship at ${x.ship_last_seq}, held here ${x.held_last_seq} (${x.behind} behind)`).join("\n");
    return el("tr", { "data-ship": s.ship },
      el("td", {}, s.ship, agentVersion(s)),
      el("td", {}, age(s.last_heard_age_s)),
      el("td", {}, s.via ?? "–"),
      el("td", {}, s.report?.link ?? "–"),
      behind,
      el("td", {}, satCell),
      el("td", {}, pos));
  }));
}

// the version of the agent the ship last reported, under its name: its public part
// (a build between releases as 0.2.1.dev4), the whole in the tooltip
function agentVersion(s) {
  const v = s.report?.agent;
  if (typeof v !== "string" || !v) return "";
  const short = el("span", { class: "muted agent-version", title: `agent ${v}` }, v.split("+")[0]);
  return el("span", {}, el("br"), short);
}

function renderAlerts(alerts) {
  $("#alerts-empty").hidden = alerts.length > 0;
  $("#alerts").replaceChildren(...alerts.map((a) => {
    const when = utc(a.ts_ms);
    const what = typeof a.body === "object" && a.body
      ? (a.body.alarm || a.body.kind || a.body.type || JSON.stringify(a.body))
      : String(a.body);
    return el("li", { class: "alert", "data-origin": a.origin, "data-key": a.key },
      el("strong", {}, a.key), ` ${what} `,
      el("span", { class: "muted" }, `${a.origin} · ${when} UTC · entered at ${a.site}`),
      el("span", { class: "muted hops" }, hops(a)));
  }));
}

// a time (epoch ms) as "YYYY-MM-DD hh:mm:ss"; one no Date can hold (a sensor's clock,
// a hostile record) as "?" instead of an exception that would stop the page
function utc(ms) {
  const d = new Date(ms);
  return Number.isFinite(ms) && !Number.isNaN(d.getTime())
    ? d.toISOString().replace("T", " ").slice(0, 19) : "?";
}

// an alert's way here in wall time: when its entry site's gateway wrote it, then how
// long until this site's merge did (two sites' clocks apart from the entry site)
function hops(a) {
  if (!Number.isFinite(a.entered_ms)) return "";
  const written = new Date(a.entered_ms);
  if (Number.isNaN(written.getTime())) return "";
  let text = ` · written at ${a.site}'s gateway ${written.toISOString().slice(11, 19)} UTC`;
  if (Number.isFinite(a.merged_ms)) {
    text += `, merged here ${((a.merged_ms - a.entered_ms) / 1000).toFixed(1)} s later`;
  }
  return text;
}

function renderReplication(rep) {
  const rows = [];
  for (const n of rep.neighbours) {
    rows.push(el("tr", { "data-neighbour": n.neighbour },
      el("td", {}, el("strong", {}, n.neighbour)), el("td", { class: "muted" }, "link"),
      el("td", {}, state(n.state)), el("td"), el("td"), el("td", {}, since(n.last_ok))));
    for (const s of n.streams) {
      rows.push(el("tr", { "data-neighbour": n.neighbour, "data-stream": s.stream },
        el("td"), el("td", {}, s.stream), el("td", {}, state(s.state)),
        el("td", { class: "num lag-records", "data-neighbour": n.neighbour, "data-stream": s.stream },
          num(s.lag_records)),
        el("td", { class: "num" }, s.lag_s === null || s.lag_s === undefined ? "–" : s.lag_s.toFixed(1)),
        el("td", {}, since(s.last_success))));
    }
  }
  fill($("#replication tbody"), rows);
  renderHoldings(rep.holdings);
  const routes = Object.entries(rep.routes || {});
  $("#routes").textContent = routes.length
    ? "routes: " + routes.map(([e, v]) => (v ? `${e} via ${v}` : `${e}: no route`)).join(", ")
    : "";
}

// repair by identity, in the words `shorelink-spark status` uses (site_view's holdings)
function renderHoldings(h) {
  const box = $("#holdings");
  if (!h) { box.replaceChildren(); return; }
  const details = h.details.length ? [el("ul", {}, ...h.details.map((d) => el("li", {}, d)))] : [];
  box.replaceChildren(el("p", {}, h.headline), ...details);
}

function renderGateway(g) {
  const dl = $("#gateway");
  if (!g) { dl.replaceChildren(el("dd", {}, "no gateway configured ([sites.S.ops] gateway)")); return; }
  const refusals = Object.entries(g.refusals || {});
  const items = [
    ["address", g.url],
    ["ready", g.ready === null ? "–" : (g.ready ? "yes" : "no")],
    ["ships connected", num(g.connected)],
    ["batches written", num(g.batches)],
    ["records written", num(g.records)],
    ["refusals", refusals.length ? refusals.map(([r, n]) => `${r}: ${num(n)}`).join(", ") : "none"],
    ["failed Kafka transactions", num(g.kafka_errors)],
  ];
  if (g.error) items.push(["error", g.error]);
  dl.replaceChildren(...items.flatMap(([k, v]) =>
    [el("dt", {}, k), el("dd", { "data-field": k }, v)]));
}

function renderQueries(queries) {
  fill($("#queries tbody"), queries.map((q) => el("tr", { "data-query": q.query },
    el("td", {}, q.query), el("td", {}, state(q.state)), el("td", { class: "num" }, num(q.batch_id)),
    el("td", { class: "num" }, num(q.processed_rows_per_s)),
    el("td", { class: "num" }, num(q.lag_records)))));
}

function renderRecords(streams) {
  const rows = [];
  for (const s of streams) {
    if (!s.origins.length) {
      rows.push(el("tr", { "data-stream": s.stream }, el("td", {}, s.stream),
        el("td", { class: "muted" }, "nothing yet"), el("td"), el("td"), el("td")));
    }
    for (const o of s.origins) {
      rows.push(el("tr", { "data-stream": s.stream, "data-origin": o.origin },
        el("td", {}, s.stream), el("td", {}, o.origin), el("td", { class: "num" }, num(o.records)),
        el("td", { class: "num" }, num(o.last_seq)), el("td", { class: "num" }, num(o.gaps))));
    }
  }
  fill($("#records tbody"), rows);
}

// the fleet registry's rollouts and each ship's configuration (null: no registry here);
// every name and failure text goes in as text (el), never as markup
function renderFleet(fleet) {
  $("#fleet-section").hidden = !fleet;
  if (!fleet) return;
  $("#fleet-version").textContent = `(registry version ${fleet.version})`;
  $("#rollouts").replaceChildren(...fleet.rollouts.map((r) => {
    const head = `rollout ${r.id}: group ${r.group}, version ${r.config_version}, ` +
      `stage ${r.stage} of ${r.stages.length} (${r.stages.join("/")}), `;
    const then = r.state === "active"
      ? (r.decision ? `${r.decision.action}: ${r.decision.reason}` : "")
      : `by ${r.by ?? "?"} at ${r.ended ?? "?"}${r.reason ? `: ${r.reason}` : ""}`;
    return el("li", { class: "rollout", "data-rollout": String(r.id) },
      head, state(r.state), " ", el("span", { class: "decision" }, then));
  }));
  fill($("#fleet tbody"), fleet.ships.map((s) => {
    const health = el("td", { class: "health" }, state(s.health));
    if (s.failure) health.append(" ", el("span", { class: "failure" }, s.failure));
    return el("tr", { "data-ship": s.ship },
      el("td", {}, s.ship),
      el("td", {}, s.groups.join(", ")),
      el("td", { class: "num" }, s.config ?? "–"),
      el("td", { class: "num" }, s.applied ?? "–"),
      health,
      el("td", {}, age(s.heard_s_ago)));
  }));
}

function renderDead(dead) {
  $("#dead-empty").hidden = dead.length > 0;
  fill($("#dead tbody"), dead.map((d) =>
    el("tr", {}, el("td", {}, d.topic), el("td", {}, d.cause),
      el("td", { class: "num" }, num(d.records)), el("td", { class: "then" }, d.tried_again_when))));
}

function render(snap) {
  const site = snap.site;
  $("#site").textContent = site.site;
  document.title = `shorelink ops: ${site.site}`;
  $("#updated").textContent = `updated ${new Date(site.generated_at * 1000).toLocaleTimeString()}`;
  const failed = [];
  // each section on its own: one that cannot show what it got leaves the others live
  const sections = [
    ["ships", () => renderShips(snap.ships)],
    ["alerts", () => renderAlerts(snap.alerts)],
    ["replication", () => renderReplication(site.replication)],
    ["gateway", () => renderGateway(site.gateway)],
    ["queries", () => renderQueries(site.queries)],
    ["records", () => renderRecords(site.streams)],
    ["dead letters", () => renderDead(site.dead_letters)],
    ["fleet", () => renderFleet(snap.fleet)],
    ["map", () => {
      positions = Object.fromEntries(snap.ships.filter((s) => s.position).map((s) => [s.ship, s.position]));
      drawMap();
    }],
  ];
  for (const [name, draw] of sections) {
    try { draw(); } catch (err) { failed.push(`page: the ${name} section could not be shown (${err})`); }
  }
  $("#problems").replaceChildren(...[...site.problems, ...failed].map((p) => el("li", {}, p)));
}

// -- the map ---------------------------------------------------------------------------

let coast = [];
let tracks = {};
let positions = {};
const COLOURS = ["#0969da", "#bf3989", "#1a7f37", "#9a6700", "#8250df", "#cf222e"];

function bounds() {
  let lats = [], lons = [];
  for (const t of Object.values(tracks)) for (const [, lat, lon] of t) { lats.push(lat); lons.push(lon); }
  for (const p of Object.values(positions)) { lats.push(p.lat); lons.push(p.lon); }
  if (!lats.length) return { w: -180, e: 180, s: -70, n: 80 };
  let w = Math.min(...lons), e = Math.max(...lons), s = Math.min(...lats), n = Math.max(...lats);
  const pad = Math.max(5, (e - w) * 0.15, (n - s) * 0.15);
  w -= pad; e += pad; s -= pad; n += pad;
  return { w: Math.max(-180, w), e: Math.min(180, e), s: Math.max(-85, s), n: Math.min(85, n) };
}

function drawMap() {
  const c = $("#map");
  const ctx = c.getContext("2d");
  const b = bounds();
  // equirectangular, the same scale both ways, centred in the canvas
  const k = Math.min(c.width / (b.e - b.w), c.height / (b.n - b.s));
  const ox = (c.width - k * (b.e - b.w)) / 2, oy = (c.height - k * (b.n - b.s)) / 2;
  const x = (lon) => ox + (lon - b.w) * k;
  const y = (lat) => oy + (b.n - lat) * k;
  ctx.clearRect(0, 0, c.width, c.height);
  ctx.fillStyle = getComputedStyle(document.documentElement).getPropertyValue("--land");
  ctx.strokeStyle = "#a59f8b";
  ctx.lineWidth = 0.7;
  for (const line of coast) {
    ctx.beginPath();
    line.forEach(([lon, lat], i) => (i ? ctx.lineTo(x(lon), y(lat)) : ctx.moveTo(x(lon), y(lat))));
    ctx.closePath();
    ctx.fill();
    ctx.stroke();
  }
  const ships = [...new Set([...Object.keys(tracks), ...Object.keys(positions)])].sort();
  ships.forEach((ship, i) => {
    const colour = COLOURS[i % COLOURS.length];
    const t = tracks[ship] || [];
    ctx.strokeStyle = colour;
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    t.forEach(([, lat, lon], j) => (j ? ctx.lineTo(x(lon), y(lat)) : ctx.moveTo(x(lon), y(lat))));
    ctx.stroke();
    const last = positions[ship] || (t.length ? { lat: t[t.length - 1][1], lon: t[t.length - 1][2] } : null);
    if (last) {
      ctx.fillStyle = colour;
      ctx.beginPath();
      ctx.arc(x(last.lon), y(last.lat), 4, 0, 2 * Math.PI);
      ctx.fill();
      ctx.font = "12px system-ui, sans-serif";
      ctx.fillText(ship, x(last.lon) + 6, y(last.lat) - 6);
    }
  });
  $("#map-note").textContent = ships.length
    ? `${ships.length} ship${ships.length > 1 ? "s" : ""}; coastlines: ${coastSource}`
    : `no positions yet; coastlines: ${coastSource}`;
}

let coastSource = "loading";

async function loadCoast() {
  try {
    const r = await fetch("/api/coastlines");
    const body = await r.json();
    coast = body.lines;
    coastSource = body.source || body.problem || "none";
  } catch (e) {
    coastSource = `unavailable (${e})`;
  }
  drawMap();
}

async function loadTracks() {
  try {
    const r = await fetch("/api/map");
    tracks = (await r.json()).tracks;
    drawMap();
  } catch (e) {
    // the event stream shows the connection's state; the next round tries again
  }
}

// -- live updates ----------------------------------------------------------------------

function connect() {
  const source = new EventSource("/api/events");
  source.addEventListener("open", () => {
    $("#live").textContent = "live";
    $("#live").className = "badge on";
  });
  source.addEventListener("error", () => {
    $("#live").textContent = "reconnecting";
    $("#live").className = "badge off";
  });
  source.addEventListener("snapshot", (ev) => {
    try {
      render(JSON.parse(ev.data));
    } catch (err) {  // never "live" over figures that stopped changing
      $("#live").textContent = "not updating";
      $("#live").className = "badge off";
      console.error(err);
    }
  });
}

loadCoast();
loadTracks();
setInterval(loadTracks, 5000);
connect();
