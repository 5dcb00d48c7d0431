// ratelimiterd console: reads GET /ui/api/state every second and renders it.
// No framework and no network but this server; the admin token lives in
// sessionStorage, so it is forgotten when the tab closes.
"use strict";

const TOKEN_KEY = "ratelimiterd.adminToken";
const REFRESH_MS = 1000;
const HISTORY_MS = 15 * 60 * 1000;

const view = {
  sort: "utilization",
  order: "desc",
  offset: 0,
  count: 50,
  filter: "",
  modelSort: { key: "name", order: "asc" },
  tenantSort: { key: "daily_tokens", order: "desc" },
  classSort: { key: "order", order: "asc" },
  paused: false,
  timer: null,
  tokenRequired: false,
  last: null,
};

// Timings the benchmark reads (BENCHMARKS.md, "The console").
const stats = { startedAt: performance.now(), firstRenderMs: null, refreshes: 0, lastFetchMs: 0, lastRenderMs: 0,
  fetchMsTotal: 0, renderMsTotal: 0 };
window.__consoleStats = stats;

// ---------- server ----------

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

async function api(path, options = {}) {
  const headers = Object.assign({}, options.headers || {});
  const t = token();
  if (t) headers.Authorization = "Bearer " + t;
  return fetch(path, Object.assign({}, options, { headers, cache: "no-store" }));
}

async function errorText(response) {
  try {
    const body = await response.json();
    return body.error || `HTTP ${response.status}`;
  } catch (_) {
    return `HTTP ${response.status}`;
  }
}

function stateUrl() {
  const q = new URLSearchParams({ sort: view.sort, order: view.order, offset: view.offset, count: view.count });
  if (view.filter) q.set("q", view.filter);
  return "/ui/api/state?" + q.toString();
}

// ---------- screens ----------

function show(screen) {
  for (const id of ["loading", "login", "off", "console"]) $(id).hidden = id !== screen;
  $("logout").hidden = screen !== "console" || !view.tokenRequired;
  $("pause-refresh").hidden = screen !== "console";
}

function showLogin(message) {
  stopRefresh();
  show("login");
  $("login-error").textContent = message || "";
  $("token").value = "";
  $("token").focus();
}

async function refresh() {
  const started = performance.now();
  let response;
  try {
    response = await api(stateUrl());
  } catch (e) {
    $("banner").hidden = false;
    $("banner").textContent = "The server does not answer: " + e.message;
    // Before the first answer the banner is not on screen: the loading note says it.
    $("loading-note").textContent = "The server does not answer: " + e.message + " (trying again)";
    schedule();
    return;
  }
  if (response.status === 401) {
    const had = token() !== "";
    sessionStorage.removeItem(TOKEN_KEY);
    view.tokenRequired = true;
    showLogin(had ? "The token was refused." : "");
    return;
  }
  if (response.status === 404) {
    stopRefresh();
    show("off");
    $("off-reason").textContent = await errorText(response);
    return;
  }
  if (!response.ok) {
    $("banner").hidden = false;
    $("banner").textContent = "The console's read failed: " + (await errorText(response));
    schedule();
    return;
  }
  const data = await response.json();
  const fetched = performance.now();
  if (token() !== "") view.tokenRequired = true;
  show("console");
  $("banner").hidden = true;
  render(data);
  // The tenants and keys panel (keys.js), read every few seconds.
  if (typeof directoryTick === "function") directoryTick();
  // The budgets panel and spend chart (budgets.js), read every few seconds.
  if (typeof budgetsTick === "function") budgetsTick();
  const rendered = performance.now();
  stats.refreshes += 1;
  stats.lastFetchMs = fetched - started;
  stats.lastRenderMs = rendered - fetched;
  stats.fetchMsTotal += stats.lastFetchMs;
  stats.renderMsTotal += stats.lastRenderMs;
  if (stats.firstRenderMs === null) stats.firstRenderMs = rendered - stats.startedAt;
  schedule();
}

function schedule() {
  stopRefresh();
  if (!view.paused) view.timer = setTimeout(refresh, REFRESH_MS);
}
function stopRefresh() {
  if (view.timer !== null) clearTimeout(view.timer);
  view.timer = null;
}
function refreshNow() {
  stopRefresh();
  refresh();
}

// ---------- rendering ----------

function render(data) {
  view.last = data;
  renderHeader(data);
  renderCards(data);
  renderLimits(data.limits, data.sample_interval_ms);
  renderModels(data.gateway);
  renderTenants(data.tenants);
  renderClasses(data.classes);
  renderBackend(data.backend);
}

function renderHeader(data) {
  const b = data.backend;
  const badge = $("backend-badge");
  badge.replaceChildren(el("span", { class: "dot " + (b.healthy ? "ok" : "bad") }),
    b.kind === "tigerbeetle" ? "TigerBeetle" : "Memory", b.healthy ? "" : " · unavailable");
  badge.title = b.healthy ? "The backend answers" : b.error || "";
  $("updated").textContent = "Updated " + new Date(data.now_unix_ms).toLocaleTimeString();
}

function card(label, value, cls) {
  return el("div", { class: "card " + (cls || "") }, el("div", { class: "label", text: label }),
    el("div", { class: "value", text: value }));
}

function renderCards(data) {
  const s = data.limits.summary;
  const models = (data.gateway && data.gateway.models) || [];
  const paused = models.filter((m) => m.paused).length;
  const queued = models.reduce((a, m) => a + m.queue_len, 0);
  const admitted = models.reduce((a, m) => a + (m.admitted_per_s || 0), 0);
  const cards = [
    card("Limits", num(data.limits.total)),
    card("At capacity", num(s.full), s.full > 0 ? "bad" : "good"),
    card("Above 80%", num(s.above_80_percent), s.above_80_percent > 0 ? "warn" : ""),
    card("Decreasing", num(s.decreasing), s.decreasing > 0 ? "warn" : ""),
    card("In debt", num(s.in_debt), s.in_debt > 0 ? "warn" : ""),
  ];
  if (data.gateway) {
    cards.push(card("Calls admitted/s", rate(admitted)));
    cards.push(card("Calls queued", num(queued), queued > 0 ? "warn" : ""));
    cards.push(card("Models paused", num(paused), paused > 0 ? "bad" : "good"));
  }
  $("cards").replaceChildren(...cards);
}

function markSorted(table, key, order) {
  for (const th of table.querySelectorAll("th[data-sort]")) {
    th.classList.toggle("sorted-asc", th.dataset.sort === key && order === "asc");
    th.classList.toggle("sorted-desc", th.dataset.sort === key && order === "desc");
  }
}

function renderLimits(limits, intervalMs) {
  const table = $("limits");
  markSorted(table, view.sort, view.order);
  $("limits-error").hidden = !limits.error;
  $("limits-error").textContent = limits.error ? "The backend could not list the limits: " + limits.error : "";
  const first = limits.matched === 0 ? 0 : limits.offset + 1;
  const last = limits.offset + limits.rows.length;
  $("limits-count").textContent = limits.matched === limits.total
    ? `${num(limits.total)} limits` : `${num(limits.matched)} of ${num(limits.total)} limits match`;
  $("page-info").textContent = `${num(first)}–${num(last)} of ${num(limits.matched)}`;
  $("prev").disabled = limits.offset === 0;
  $("next").disabled = last >= limits.matched;
  if (limits.summary.retired) {
    $("limits-count").textContent += ` · ${num(limits.summary.retired)} of revoked or expired keys, in no card`;
  }
  const slots = Math.round(HISTORY_MS / intervalMs);
  const rows = limits.rows.map((r) => {
    // A budget counts micro-dollars: shown in dollars, with its period.
    const amount = r.budget ? money : num;
    const pending = r.status === "decreasing"
      ? el("span", { class: "pill decreasing", title: "Waiting for usage to fit the lower capacity" }, "→ " + amount(r.pending_decrease_to))
      : "—";
    const capacity = r.budget ? perSpan(r.capacity, r.period, r.window_seconds) : num(r.capacity);
    return el("tr", { "data-key": r.key, class: r.retired ? "retired" : null },
      el("td", { class: "key", title: r.key }, r.key, r.retired
        ? el("span", { class: "pill retired", title: "No working key charges this limit: it refuses no call and counts in no card" }, "key " + r.retired)
        : null),
      el("td", {}, el("span", { class: "kind", text: r.kind })),
      el("td", { class: "num capacity" }, el("span", { class: "cap" }, el("span", { text: capacity }), editButton(r))),
      el("td", { class: "num in-use", text: amount(r.in_use) }),
      el("td", { class: "util" }, bar(r.utilization_bp, Boolean(r.retired))),
      el("td", { class: "num debt", text: r.debt ? amount(r.debt) : "—" }),
      el("td", { class: "num" }, pending),
      el("td", { class: "num release", text: r.next_release_ms === null ? "—" : duration(r.next_release_ms) }),
      el("td", { class: "spark", title: "Utilization, last 15 min" }, sparkline(r.history, slots)));
  });
  const body = table.tBodies[0];
  if (rows.length === 0) {
    body.replaceChildren(el("tr", {}, el("td", { class: "empty", colspan: 9,
      text: limits.total === 0 ? "No limits are defined yet." : "No key matches the filter." })));
  } else {
    body.replaceChildren(...rows);
  }
}

// The ✎ of a row, or, for a budget kept on a tenant's or key's record (made
// through the admin API), a note saying where it changes: the limit alone would
// disagree with the record.
function editButton(r) {
  if (r.budget && r.budget.kept_on === "directory") {
    const where = r.budget.owner === "tenant"
      ? `ratelimiterd tenants update ${r.budget.owner_name} --budget USD/PERIOD`
      : "a new key with its --budget (a key's budgets are set when it is made)";
    return el("span", { class: "muted small kept", title: `Kept on the ${r.budget.owner}'s record: change it with ${where}` }, "ⓘ");
  }
  return el("button", { type: "button", class: "edit", title: r.budget ? "Change budget" : "Change capacity",
    "aria-label": "Change capacity of " + r.key, onclick: () => openEdit(r) }, "✎");
}

function sortRows(rows, sort, valueOf) {
  const dir = sort.order === "asc" ? 1 : -1;
  return rows.slice().sort((a, b) => {
    const x = valueOf(a, sort.key);
    const y = valueOf(b, sort.key);
    if (x === y) return 0;
    if (x === null || x === undefined) return 1;
    if (y === null || y === undefined) return -1;
    return (x < y ? -1 : 1) * dir;
  });
}

function modelState(m) {
  if (m.paused) {
    const left = m.paused_ms_left !== null ? " · " + duration(m.paused_ms_left) : "";
    return el("span", { class: "pill paused", title: "Paused after a provider 429" }, "paused" + left);
  }
  return el("span", { class: "pill ok" }, "active");
}

function renderModels(gateway) {
  const table = $("models");
  const panel = $("gateway-panel");
  if (!gateway) {
    $("gateway-note").textContent = "No gateway runs on this server.";
    table.tBodies[0].replaceChildren();
    panel.classList.add("idle");
    return;
  }
  $("gateway-note").textContent = `${gateway.models.length} models`;
  markSorted(table, view.modelSort.key, view.modelSort.order);
  const models = sortRows(gateway.models, view.modelSort, (m, k) => (k === "state" ? (m.paused ? 1 : 0) : m[k]));
  const rows = [];
  for (const m of models) {
    rows.push(el("tr", { "data-model": m.name, class: m.paused ? "paused" : "" },
      el("td", { class: "key", title: "upstream " + m.upstream }, m.name, el("span", { class: "muted", text: " · " + m.upstream })),
      el("td", { class: "state" }, modelState(m)),
      el("td", { class: "num", text: rate(m.admitted_per_s) }),
      el("td", { class: "num", text: rate(m.denied_per_s) }),
      el("td", { class: "num", text: rate(m.queued_per_s) }),
      el("td", { class: "num", text: num(m.queue_len) }),
      el("td", { class: "num", text: m.wait_p99_ms === null || m.wait_p99_ms === undefined ? "—" : duration(m.wait_p99_ms) }),
      el("td", { class: "num", text: `${num(m.provider_429_last_min)} / ${num(m.provider_429_total)}` }),
      el("td", { class: "num", text: compact(m.tokens_per_min) })));
    for (const d of m.deployments || []) {
      const state = d.paused_ms_left !== null && d.paused_ms_left !== undefined
        ? el("span", { class: "pill paused" }, "paused · " + duration(d.paused_ms_left))
        : el("span", { class: "pill ok" }, d.breaker && d.breaker !== "closed" ? "breaker " + d.breaker : "active");
      rows.push(el("tr", { class: "sub", "data-deployment": d.name },
        el("td", { text: "↳ " + d.name }), el("td", {}, state),
        el("td", { class: "num", colspan: 7,
          text: (d.share !== null && d.share !== undefined ? `share ${(d.share * 100).toFixed(0)}%` : "") +
            (d.breaker ? ` · breaker ${d.breaker}` : "") })));
    }
  }
  table.tBodies[0].replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { class: "empty", colspan: 9, text: "No models configured." }))]));
}

// A tenant's budgets in money, one line each: how full, and what it holds of its budget per span.
function tenantBudgets(budgets) {
  if (!budgets.length) return el("span", { class: "muted", text: "no budget" });
  return el("span", { class: "budget-lines" }, ...budgets.map((b) => el("span", { class: "budget-line", "data-budget-key": b.key,
    title: `${b.key}: ${money(b.used_micro_usd)} held of ${money(b.budget_micro_usd)}, ${money(b.left_micro_usd)} left` },
  bar(b.utilization_bp), el("span", { class: "muted small", text: ` ${money(b.used_micro_usd)} of ${perSpan(b.budget_micro_usd, b.period, b.window_seconds)}` }))));
}

function renderTenants(tenants) {
  const table = $("tenants");
  markSorted(table, view.tenantSort.key, view.tenantSort.order);
  $("tenants-note").textContent = tenants.total > tenants.rows.length
    ? `${tenants.rows.length} of ${num(tenants.total)} shown` : `${num(tenants.total)} tenants`;
  const valueOf = (t, k) => {
    if (k === "daily_tokens") return t.daily_tokens ? t.daily_tokens.utilization_bp : null;
    if (k === "remaining") return t.daily_tokens ? t.daily_tokens.remaining : null;
    if (k === "budgets") return t.budgets.length ? Math.max(...t.budgets.map((b) => b.utilization_bp)) : null;
    return t[k];
  };
  const rows = sortRows(tenants.rows, view.tenantSort, valueOf).map((t) => {
    const tokens = t.daily_tokens;
    const daily = tokens
      ? el("span", { title: `${num(tokens.used)} of ${num(tokens.capacity)} tokens over the rolling day (${tokens.key})` }, bar(tokens.utilization_bp),
        el("span", { class: "muted small", text: ` ${compact(tokens.used)} / ${compact(tokens.capacity)}` }))
      : el("span", { class: "muted", text: "no daily tokens" });
    return el("tr", { "data-tenant": t.name },
      el("td", { class: "key", title: t.class ? "class " + t.class : null }, t.name,
        t.class ? el("span", { class: "muted class", text: " · " + t.class }) : null),
      el("td", { class: "util daily-tokens" }, daily),
      el("td", { class: "num", text: tokens ? compact(tokens.remaining) : "—" }),
      el("td", { class: "budgets" }, tenantBudgets(t.budgets)),
      el("td", { class: "num", text: rate(t.calls_per_min) }),
      el("td", { class: "num", text: compact(t.tokens_per_min === null ? null : Math.round(t.tokens_per_min)) }));
  });
  table.tBodies[0].replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { class: "empty", colspan: 6, text: "No tenants." }))]));
}

function ppm(v) {
  return (v / 10000).toFixed(v % 10000 === 0 ? 0 : 1) + "%";
}

// The fullest ceiling key of a class, or null for a class without ceilings (the top one).
function fullestCeiling(c) {
  return c.ceilings.length ? c.ceilings[0] : null;
}

function ceilingCell(c) {
  const top = fullestCeiling(c);
  if (!top) return el("span", { class: "muted", text: "no ceiling: may take it all" });
  const more = c.ceilings_total > 1 ? ` (+${c.ceilings_total - 1})` : "";
  return el("span", { title: c.ceilings.map((k) => `${k.key}: ${num(k.in_use)} of ${num(k.capacity)} ${k.unit}`).join("\n") },
    bar(top.utilization_bp), el("span", { class: "muted small", text: more }));
}

// Admissions per second, scaled so the busiest second of the minute reaches the top.
function admittedSpark(series) {
  const peak = Math.max(1, ...series);
  const svg = sparkline(series.map((v) => Math.round((v / peak) * 10000)), 60, false);
  svg.setAttribute("aria-label", `peak ${peak} a second`);
  return el("span", { title: `calls admitted each second, last minute; peak ${peak}/s` }, svg);
}

function renderClasses(classes) {
  const table = $("classes");
  const panel = $("classes-panel");
  if (!classes) {
    $("classes-note").textContent = "No gateway runs on this server.";
    table.tBodies[0].replaceChildren();
    panel.classList.add("idle");
    return;
  }
  panel.classList.remove("idle");
  $("classes-note").textContent = `${classes.classes.length} classes, highest first`;
  markSorted(table, view.classSort.key, view.classSort.order);
  const order = new Map(classes.classes.map((c, i) => [c.name, i]));
  const valueOf = (c, k) => {
    if (k === "order") return order.get(c.name);
    if (k === "tenants") return c.tenants.length;
    if (k === "ceiling") return fullestCeiling(c) ? fullestCeiling(c).utilization_bp : null;
    return c[k];
  };
  const rows = [];
  for (const c of sortRows(classes.classes, view.classSort, valueOf)) {
    const tenants = c.tenants.length ? c.tenants.join(", ") : "—";
    rows.push(el("tr", { "data-class": c.name },
      el("td", { class: "key", text: c.name }),
      el("td", { class: "num", text: num(c.share) }),
      el("td", { class: "num", text: `${ppm(c.headroom_ppm)} / ${ppm(c.ceiling_ppm)}` }),
      el("td", { class: "tenants", title: tenants, text: tenants }),
      el("td", { class: "num admitted", text: rate(c.admitted_per_s) }),
      el("td", { class: "num denied", text: rate(c.denied_per_s) }),
      el("td", { class: "num", text: rate(c.queued_per_s) }),
      el("td", { class: "num", text: num(c.queue_len) }),
      el("td", { class: "num", text: c.wait_p99_ms === null || c.wait_p99_ms === undefined ? "—" : duration(c.wait_p99_ms) }),
      el("td", { class: "util" }, ceilingCell(c)),
      el("td", { class: "spark" }, admittedSpark(c.admitted_history || []))));
    for (const m of c.models) {
      rows.push(el("tr", { class: "sub", "data-class-model": `${c.name}/${m.model}` },
        el("td", { text: "↳ " + m.model }), el("td"), el("td"), el("td"),
        el("td", { class: "num admitted", text: rate(m.admitted_per_s) }),
        el("td", { class: "num denied", text: rate(m.denied_per_s) }),
        el("td", { class: "num", text: rate(m.queued_per_s) }),
        el("td", { class: "num", text: num(m.queue_len) }),
        el("td", { class: "num", text: m.wait_p99_ms === null || m.wait_p99_ms === undefined ? "—" : duration(m.wait_p99_ms) }),
        el("td", { class: "muted small", colspan: 2, text: `${num(m.admitted_last_min)} admitted last min` })));
    }
  }
  table.tBodies[0].replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { class: "empty", colspan: 11, text: "No classes." }))]));
}

function renderBackend(b) {
  const health = b.healthy ? "healthy" : "unavailable: " + (b.error || "");
  $("backend-summary").textContent =
    `${b.kind === "tigerbeetle" ? "TigerBeetle cluster" : "Memory (this process)"} · ${health} · ${num(b.limits)} limits · definitions kept by the ${b.definitions_kept_by}`;
  const nowSeconds = Date.now() / 1000;
  const items = b.metrics.map((m) => {
    let v;
    if (typeof m.value !== "number") {
      v = `p99 ${m.value.p99_ms === null ? "—" : duration(m.value.p99_ms)} (${compact(m.value.count)})`;
    } else if (m.name.endsWith("_timestamp_seconds")) {
      v = m.value === 0 ? "never" : duration(Math.max(0, nowSeconds - m.value) * 1000) + " ago";
    } else {
      v = compact(m.value);
    }
    return el("div", { class: "metric", title: m.help }, el("span", { class: "name", text: m.name }), el("span", { class: "v", text: v }));
  });
  $("backend-metrics").replaceChildren(...items);
  renderServers(b.servers);
}

// The servers the cluster saw (TigerBeetle only): null on the memory backend.
function renderServers(servers) {
  const wrap = $("servers-wrap");
  wrap.hidden = servers === null || servers === undefined;
  if (wrap.hidden) return;
  if (!Array.isArray(servers)) {
    $("servers-note").textContent = "unavailable: " + (servers.error || "");
    $("servers").tBodies[0].replaceChildren();
    return;
  }
  $("servers-note").textContent = `${servers.length} seen by the cluster`;
  const ago = (ms) => (ms ? duration(Math.max(0, Date.now() - ms)) + " ago" : "—");
  const rows = servers.map((s) => el("tr", { "data-server": s.address },
    el("td", { class: "key", text: s.name || "(not announced)" }),
    el("td", { class: "key", text: s.address || "—" }),
    el("td", { text: s.version || "—" }),
    el("td", { class: "num", title: new Date(s.first_seen_unix_ms).toISOString(), text: ago(s.first_seen_unix_ms) }),
    el("td", { class: "num", title: new Date(s.last_seen_unix_ms).toISOString(), text: ago(s.last_seen_unix_ms) }),
    el("td", { class: "num", text: num(s.starts) }),
    el("td", { class: "num records", text: num(s.records_written) })));
  $("servers").tBodies[0].replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { class: "empty", colspan: 7, text: "No server has announced itself yet." }))]));
}

// ---------- editing a capacity ----------

let editing = null;

function openEdit(row) {
  editing = row;
  $("edit-key").textContent = row.key;
  // A budget is changed in dollars, its period kept.
  const amount = row.budget ? money : num;
  $("edit-label").textContent = row.budget ? `New budget in USD (per ${spanText(row.period, row.window_seconds)})` : "New capacity";
  $("edit-current").textContent = (row.budget ? `Budget ${perSpan(row.capacity, row.period, row.window_seconds)}, ${money(row.in_use)} held`
    : `Capacity ${num(row.capacity)}${row.unit ? " " + row.unit : ""}, ${num(row.in_use)} in use`) +
    (row.status === "decreasing" ? `, decreasing to ${amount(row.pending_decrease_to)}` : "");
  $("edit-capacity").value = row.budget ? money(row.capacity).slice(1).replace(/,/g, "") : row.capacity;
  $("edit-error").textContent = "";
  $("edit-apply").disabled = false;
  $("edit").showModal();
  $("edit-capacity").select();
}

// The fields of a definition the admin PUT takes; the rest of a report
// (usage, status) is the server's.
// A period limit (a budget per day, week or month) keeps its `period`.
const DEFINITION_FIELDS = ["key", "kind", "capacity", "window_seconds", "window_margin_ms", "timeout_seconds", "unit", "description",
  "overage", "period"];

async function applyEdit(event) {
  event.preventDefault();
  let raw = $("edit-capacity").value.trim();
  if (editing.budget) {
    const micro = dollarsToMicro(raw);
    if (micro === null) {
      $("edit-error").textContent = "The budget is an amount in dollars with at most six decimals (40, 12.50).";
      return;
    }
    raw = String(micro);
  } else if (!/^\d+$/.test(raw)) {
    $("edit-error").textContent = "The capacity is a whole number.";
    return;
  }
  $("edit-apply").disabled = true;
  $("edit-error").textContent = "";
  try {
    const current = await api("/v1/admin/limits/" + encodeURIComponent(editing.key));
    if (!current.ok) throw new Error(await errorText(current));
    const report = await current.json();
    const definition = {};
    for (const f of DEFINITION_FIELDS) if (report[f] !== undefined && report[f] !== null) definition[f] = report[f];
    // Sent as written, so that a capacity too large for the server is its error, not a rounding.
    const body = JSON.stringify(definition).replace(/"capacity":\d+/, `"capacity":${raw}`);
    const put = await api("/v1/admin/limits", { method: "PUT", headers: { "Content-Type": "application/json" }, body });
    if (put.status === 401) {
      $("edit").close();
      sessionStorage.removeItem(TOKEN_KEY);
      showLogin("The token was refused.");
      return;
    }
    if (!put.ok) throw new Error(await errorText(put));
    const state = await put.json();
    $("edit").close();
    const amount = editing.budget ? money : num;
    toast(state.status === "decreasing"
      ? `${state.key}: decreasing to ${amount(state.pending_decrease_to)} once usage fits`
      : `${state.key}: ${editing.budget ? "budget" : "capacity"} ${amount(state.capacity)}`);
    refreshNow();
  } catch (e) {
    $("edit-error").textContent = e.message;
  } finally {
    $("edit-apply").disabled = false;
  }
}

function toast(text) {
  const t = $("toast");
  t.textContent = text;
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => (t.hidden = true), 4000);
}

// ---------- wiring ----------

function wire() {
  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = $("token").value.trim();
    if (!value) return;
    sessionStorage.setItem(TOKEN_KEY, value);
    $("login-error").textContent = "";
    refreshNow();
  });
  $("logout").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin("");
  });
  $("pause-refresh").addEventListener("click", () => {
    view.paused = !view.paused;
    $("pause-refresh").textContent = view.paused ? "Resume" : "Pause";
    if (view.paused) stopRefresh(); else refreshNow();
  });
  let filterTimer = null;
  $("filter").addEventListener("input", () => {
    clearTimeout(filterTimer);
    filterTimer = setTimeout(() => {
      view.filter = $("filter").value.trim();
      view.offset = 0;
      refreshNow();
    }, 200);
  });
  $("prev").addEventListener("click", () => {
    view.offset = Math.max(0, view.offset - view.count);
    refreshNow();
  });
  $("next").addEventListener("click", () => {
    view.offset += view.count;
    refreshNow();
  });
  $("page-size").addEventListener("change", () => {
    view.count = Number($("page-size").value);
    view.offset = 0;
    refreshNow();
  });
  for (const th of $("limits").querySelectorAll("th[data-sort]")) {
    th.addEventListener("click", () => {
      const key = th.dataset.sort;
      view.order = view.sort === key ? (view.order === "asc" ? "desc" : "asc") : key === "key" || key === "kind" ? "asc" : "desc";
      view.sort = key;
      view.offset = 0;
      refreshNow();
    });
  }
  const local = (tableId, sort) => {
    for (const th of $(tableId).querySelectorAll("th[data-sort]")) {
      th.addEventListener("click", () => {
        const key = th.dataset.sort;
        sort.order = sort.key === key ? (sort.order === "asc" ? "desc" : "asc") : ["name", "order", "class"].includes(key) ? "asc" : "desc";
        sort.key = key;
        if (view.last) render(view.last);
      });
    }
  };
  local("models", view.modelSort);
  local("tenants", view.tenantSort);
  local("classes", view.classSort);
  $("edit-form").addEventListener("submit", applyEdit);
  $("edit-cancel").addEventListener("click", () => $("edit").close());
}

wire();
refresh();
