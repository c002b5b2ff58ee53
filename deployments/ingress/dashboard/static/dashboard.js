// The live edge map: polls /admin/dashboard-data every second with the admin key, draws colos
// on the world outline (/dashboard/world.json), runs fault drills through /admin/colos/*; the
// request log and usage (/admin/logs, /admin/usage) every few seconds.
// The key lives in sessionStorage (this tab only) or arrives in the URL fragment (#key=...),
// which browsers never send to the server.
"use strict";

const KEY_STORE = "ray-edge-ai.admin-key";
const POLL_MS = 1000;
const ADMIN_OFF_POLL_MS = 5000;
const STATE_POLL_MS = 5000;
const LOG_PAGE_ROWS = 50;
const USAGE_DAYS = 7;
const NEW_EVENT_S = 10;
const SVG = "http://www.w3.org/2000/svg";
const STATE_LABEL = { healthy: "healthy", degraded: "region unhealthy", down: "drilled down" };

const $ = (id) => document.getElementById(id);
let pollTimer = null;
let stateTimer = null;
let drawnColos = "";
let logBefore = null; // the shown page's before_id (null: the newest rows)
let logNext = null; // the next older page's before_id (null: none)

function adminKey() {
  return sessionStorage.getItem(KEY_STORE);
}

function takeKeyFromFragment() {
  const match = location.hash.match(/(?:^#|&)key=([^&]*)/);
  if (match) {
    sessionStorage.setItem(KEY_STORE, decodeURIComponent(match[1]));
    history.replaceState(null, "", location.pathname + location.search); // out of the address bar
  }
}

function el(tag, attributes = {}, text = null, namespace = null) {
  const node = namespace ? document.createElementNS(namespace, tag) : document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value !== null && value !== undefined) node.setAttribute(name, value);
  }
  if (text !== null) node.textContent = text;
  return node;
}

async function api(method, path, body) {
  const headers = { authorization: "Bearer " + (adminKey() || "") };
  if (body !== undefined) headers["content-type"] = "application/json";
  return fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
}

function show(view) {
  $("admin-off").hidden = view !== "off";
  $("key-form").hidden = view !== "key";
  $("board").hidden = view !== "board";
}

function setStatus(text, stale = false) {
  $("status").textContent = text;
  $("status").classList.toggle("stale", stale);
}

// ---- map ----------------------------------------------------------------------------------

async function drawWorld() {
  const response = await fetch("/dashboard/world.json");
  const world = await response.json();
  $("map").setAttribute("viewBox", world.view_box);
  const group = $("countries");
  for (const country of world.countries) {
    const path = el("path", { d: country.d, "data-country": country.id }, null, SVG);
    path.appendChild(el("title", {}, country.name, SVG));
    group.appendChild(path);
  }
}

function drawColos(colos) {
  const ids = colos.map((c) => c.id).join(",");
  const group = $("colos");
  if (ids !== drawnColos) { // the topology changed (or first data): rebuild markers and the select
    group.replaceChildren();
    const select = $("drill-colo");
    const selected = select.value;
    select.replaceChildren();
    for (const colo of colos) {
      const marker = el("circle", { id: "colo-" + colo.id, class: "colo", cx: colo.lon, cy: -colo.lat,
        r: 2.2, "data-colo": colo.id }, null, SVG);
      marker.appendChild(el("title", {}, "", SVG));
      marker.addEventListener("click", () => { select.value = colo.id; highlightSelected(); });
      group.appendChild(marker);
      group.appendChild(el("text", { class: "colo-label", x: colo.lon + 2.8, y: -colo.lat + 1 }, colo.id, SVG));
      select.appendChild(el("option", { value: colo.id }, `${colo.id} ${colo.city || ""}`));
    }
    if (selected) select.value = selected;
    drawnColos = ids;
  }
  for (const colo of colos) {
    const marker = $("colo-" + colo.id);
    marker.setAttribute("data-state", colo.state);
    marker.setAttribute("class", `colo state-${colo.state}` + (colo.drill && !colo.drill.down ? " drilled" : ""));
    const drill = colo.drill ? " · drill: " + describeDrill(colo.drill) : "";
    const region = colo.region ? `, region ${colo.region}` : "";
    marker.firstChild.textContent = `${colo.id} ${colo.city || ""}: ${STATE_LABEL[colo.state]}${region}${drill}`;
  }
  highlightSelected();
}

function highlightSelected() {
  const chosen = $("drill-colo").value;
  for (const marker of $("colos").querySelectorAll("circle")) {
    marker.classList.toggle("selected", marker.dataset.colo === chosen);
  }
}

function describeDrill(drill) {
  const parts = [];
  if (drill.down) parts.push("down");
  if (drill.added_latency_ms) parts.push(`+${drill.added_latency_ms} ms`);
  if (drill.error_rate) parts.push(`${Math.round(drill.error_rate * 100)}% errors`);
  parts.push(drill.ends_in_s === null ? "until cleared" : `${Math.ceil(drill.ends_in_s)} s left`);
  return parts.join(", ");
}

// ---- panels -------------------------------------------------------------------------------

function drawRegions(regions, models) {
  const table = $("regions");
  const head = el("tr");
  head.appendChild(el("th", {}, "region"));
  for (const model of models) head.appendChild(el("th", {}, model));
  const rows = [head];
  for (const region of regions) {
    const row = el("tr", { "data-region": region.id });
    row.appendChild(el("td", {}, region.id + (region.healthy ? "" : " (unhealthy)")));
    for (const model of models) {
      const count = region.replicas[model] || { running: 0, wanted: 0 };
      const cell = el("td", { class: "num replicas", "data-model": model, "data-running": count.running,
        "data-wanted": count.wanted }, `${count.running}/${count.wanted}`);
      if (count.running < count.wanted) cell.classList.add(count.running === 0 ? "cold" : "short");
      row.appendChild(cell);
    }
    rows.push(row);
  }
  table.replaceChildren(...rows);
}

function seconds(value) {
  if (value === null || value === undefined) return "–";
  return value < 1 ? `${Math.round(value * 1000)} ms` : `${value.toFixed(2)} s`;
}

function drawColdStarts(events, now) {
  const items = events.map((event) => {
    const when = new Date(event.at_unix * 1000).toLocaleTimeString();
    const phases = Object.entries(event.phases || {}).map(([name, s]) => `${name} ${seconds(s)}`).join(", ");
    const item = el("li", { "data-model": event.model },
      `${when} ${event.model} at ${event.place}: waited ${seconds(event.wait_s)}` + (phases ? ` (${phases})` : ""));
    if (now - event.at_unix < NEW_EVENT_S) item.classList.add("new");
    return item;
  });
  if (!items.length) items.push(el("li", { class: "dim" }, "none in the last minutes"));
  $("cold-starts").replaceChildren(...items);
}

function sparkline(series) {
  const width = 120, height = 18, peak = Math.max(1, ...series);
  const step = series.length > 1 ? width / (series.length - 1) : width;
  const points = series.map((v, i) => `${(i * step).toFixed(1)},${(height - (v / peak) * height).toFixed(1)}`);
  const svg = el("svg", { class: "spark", width, height, viewBox: `0 0 ${width} ${height}` }, null, SVG);
  svg.appendChild(el("polyline", { points: points.join(" ") }, null, SVG));
  return svg;
}

function drawTraffic(data) {
  $("window").textContent = `(last ${Math.round(data.window_s / 60)} min; req/s over the last minute)`;
  const head = el("tr");
  for (const title of ["region / colo", "model", "req/s", "p50", "p99", "requests", "5xx", "requests per " + data.bucket_s + " s"]) {
    head.appendChild(el("th", {}, title));
  }
  const rows = [head];
  for (const row of data.traffic) {
    const tr = el("tr", { "data-place": row.place, "data-model": row.model });
    tr.appendChild(el("td", {}, row.place));
    tr.appendChild(el("td", {}, row.model));
    tr.appendChild(el("td", { class: "num" }, row.requests_per_s.toFixed(2)));
    tr.appendChild(el("td", { class: "num" }, seconds(row.p50_s)));
    tr.appendChild(el("td", { class: "num" }, seconds(row.p99_s)));
    tr.appendChild(el("td", { class: "num" }, String(row.requests)));
    tr.appendChild(el("td", { class: "num" }, String(row.errors)));
    const spark = el("td");
    spark.appendChild(sparkline(row.series));
    tr.appendChild(spark);
    rows.push(tr);
  }
  if (rows.length === 1) {
    const empty = el("tr");
    empty.appendChild(el("td", { class: "dim", colspan: 8 }, "no model requests in the window"));
    rows.push(empty);
  }
  $("traffic").replaceChildren(...rows);

  const reasons = Object.entries(data.route_reasons);
  const total = reasons.reduce((sum, [, n]) => sum + n, 0) || 1;
  $("reasons").replaceChildren(...reasons.map(([reason, count]) => {
    const bar = el("div", { class: "bar", "data-reason": reason });
    bar.appendChild(el("span", { class: "name" }, reason));
    const fill = el("span", { class: "fill" });
    fill.style.width = `${Math.max(2, (count / total) * 300)}px`;
    bar.appendChild(fill);
    bar.appendChild(el("span", {}, String(count)));
    return bar;
  }));
}

function drawKeys(keys) {
  const head = el("tr");
  for (const title of ["key", "requests", "input tokens", "output tokens", "cost units"]) {
    head.appendChild(el("th", {}, title));
  }
  const rows = [head, ...keys.map((key) => {
    const tr = el("tr", { "data-key": key.key_id });
    tr.appendChild(el("td", {}, key.key_id));
    for (const value of [key.requests, key.input_tokens, key.output_tokens]) {
      tr.appendChild(el("td", { class: "num" }, String(value)));
    }
    tr.appendChild(el("td", { class: "num" }, key.cost_units.toFixed(4)));
    return tr;
  })];
  if (!keys.length) {
    const empty = el("tr");
    empty.appendChild(el("td", { class: "dim", colspan: 5 }, "no authenticated requests in the window"));
    rows.push(empty);
  }
  $("keys").replaceChildren(...rows);
}

// ---- request log and usage -----------------------------------------------------------------

const LOG_COLUMNS = [
  ["time", (r) => new Date(r.ts * 1000).toLocaleTimeString()], ["key", (r) => r.key_id],
  ["model", (r) => r.model], ["status", (r) => String(r.status)], ["colo", (r) => r.colo],
  ["region", (r) => r.region], ["route", (r) => r.route_reason],
  ["tokens in/out", (r) => `${r.input_tokens}/${r.output_tokens}`],
  ["cost", (r) => r.cost_units.toFixed(6)], ["latency", (r) => `${Math.round(r.latency_ms)} ms`],
  ["cache", (r) => r.cache], ["request id", (r) => r.request_id],
];

function logPath() {
  const query = new URLSearchParams({ limit: String(LOG_PAGE_ROWS) });
  for (const [name, id] of [["key_id", "log-key"], ["model", "log-model"], ["status", "log-status"]]) {
    const value = $(id).value.trim();
    if (value) query.set(name, value);
  }
  if (logBefore !== null) query.set("before_id", String(logBefore));
  return "/admin/logs?" + query;
}

function stateNote(text) {
  $("state-note").textContent = text || "";
  $("state-note").hidden = !text;
}

function drawLog(rows) {
  const head = el("tr");
  for (const [title] of LOG_COLUMNS) head.appendChild(el("th", {}, title));
  const drawn = [head, ...rows.map((row) => {
    const tr = el("tr", { "data-id": row.id, "data-request-id": row.request_id });
    for (const [title, value] of LOG_COLUMNS) {
      const cell = el("td", {}, value(row) ?? "");
      if (title === "status" && row.status >= 400) cell.classList.add("error-status");
      tr.appendChild(cell);
    }
    return tr;
  })];
  if (!rows.length) {
    const empty = el("tr");
    empty.appendChild(el("td", { class: "dim", colspan: LOG_COLUMNS.length }, "no request matches"));
    drawn.push(empty);
  }
  $("log-rows").replaceChildren(...drawn);
}

function drawUsage(rows) {
  const head = el("tr");
  for (const title of ["day", "key", "model", "requests", "input tokens", "output tokens", "cost units"]) {
    head.appendChild(el("th", {}, title));
  }
  const drawn = [head, ...rows.map((row) => {
    const tr = el("tr", { "data-day": row.day, "data-key": row.key_id, "data-model": row.model });
    for (const value of [row.day, row.key_id, row.model]) tr.appendChild(el("td", {}, value ?? ""));
    for (const value of [row.requests, row.input_tokens, row.output_tokens]) {
      tr.appendChild(el("td", { class: "num" }, String(value)));
    }
    tr.appendChild(el("td", { class: "num" }, row.cost_units.toFixed(6)));
    return tr;
  })];
  $("usage").replaceChildren(...drawn);
}

async function refreshState() {
  clearTimeout(stateTimer);
  stateTimer = setTimeout(refreshState, STATE_POLL_MS);
  if (!adminKey() || $("board").hidden) return;
  const since = Date.now() / 1000 - USAGE_DAYS * 86400;
  let logs, usage;
  try {
    [logs, usage] = await Promise.all([api("GET", logPath()), api("GET", `/admin/usage?since=${since}`)]);
  } catch (error) {
    stateNote(`request log unreachable (${error.message})`);
    return;
  }
  if (!logs.ok || !usage.ok) {
    const failed = logs.ok ? usage : logs;
    const answer = await failed.json().catch(() => ({}));
    stateNote((answer.error && answer.error.message) || `HTTP ${failed.status}`);
    return;
  }
  const page = await logs.json();
  stateNote(null);
  logNext = page.next_cursor;
  $("log-older").disabled = logNext === null;
  drawLog(page.data);
  drawUsage((await usage.json()).data);
}

// ---- polling and drills -------------------------------------------------------------------

function schedule(ms) {
  clearTimeout(pollTimer);
  pollTimer = setTimeout(refresh, ms);
}

async function refresh() {
  if (!adminKey()) { show("key"); return; }
  let response;
  try {
    response = await api("GET", "/admin/dashboard-data");
  } catch (error) {
    setStatus(`router unreachable (${error.message}); retrying`, true);
    schedule(POLL_MS);
    return;
  }
  if (response.status === 404) { show("off"); setStatus("admin API off"); schedule(ADMIN_OFF_POLL_MS); return; }
  if (response.status === 401 || response.status === 403) {
    sessionStorage.removeItem(KEY_STORE);
    $("key-error").textContent = "That key was refused: it must be the router's EDGE_ADMIN_KEY.";
    $("key-error").hidden = false;
    show("key");
    return;
  }
  if (!response.ok) { setStatus(`dashboard data failed: HTTP ${response.status}`, true); schedule(POLL_MS); return; }
  const data = await response.json();
  show("board");
  drawColos(data.colos);
  drawRegions(data.regions, data.models);
  drawColdStarts(data.cold_starts, data.generated_at_unix);
  drawTraffic(data);
  drawKeys(data.keys);
  setStatus(`updated ${new Date(data.generated_at_unix * 1000).toLocaleTimeString()}`);
  document.body.dataset.updatedAt = String(data.generated_at_unix);
  if (stateTimer === null) refreshState(); // the board is up: its request log too
  schedule(POLL_MS);
}

function drillBody() {
  const kind = $("drill-kind").value;
  const value = Number($("drill-value").value);
  const duration = $("drill-duration").value;
  const body = duration ? { duration_s: Number(duration) } : {};
  if (kind === "down") body.down = true;
  if (kind === "latency") body.added_latency_ms = value;
  if (kind === "errors") body.error_rate = Math.min(1, value / 100);
  return body;
}

async function drill(method) {
  const colo = $("drill-colo").value;
  const response = await api(method, `/admin/colos/${encodeURIComponent(colo)}/faults`,
    method === "POST" ? drillBody() : undefined);
  const answer = await response.json().catch(() => ({}));
  $("drill-result").textContent = response.ok
    ? `${colo}: ${method === "POST" ? "drill started" : "cleared"}`
    : `${colo}: ${(answer.error && answer.error.message) || "HTTP " + response.status}`;
  await refresh();
}

function start() {
  takeKeyFromFragment();
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY_STORE, $("key-input").value.trim());
    $("key-input").value = "";
    $("key-error").hidden = true;
    refresh();
  });
  $("drill-form").addEventListener("submit", (event) => { event.preventDefault(); drill("POST"); });
  $("drill-clear").addEventListener("click", () => drill("DELETE"));
  $("drill-colo").addEventListener("change", highlightSelected);
  $("log-filter").addEventListener("submit", (event) => {
    event.preventDefault();
    logBefore = null;
    refreshState();
  });
  $("log-newest").addEventListener("click", () => { logBefore = null; refreshState(); });
  $("log-older").addEventListener("click", () => { logBefore = logNext; refreshState(); });
  drawWorld().catch((error) => setStatus(`world map failed: ${error.message}`, true));
  refresh();
}

document.addEventListener("DOMContentLoaded", start);
