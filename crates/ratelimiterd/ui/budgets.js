// ratelimiterd console, the budgets panel and the spend chart: reads
// GET /ui/api/budgets (each budget in money: spent, reserved, left in its
// period) and GET /ui/api/spend (the last 14 days in UTC by tenant and by
// model, from the spend ledger), and draws the days as stacked bars in SVG.
// Uses shared.js's helpers ($, el, num, SVG_NS, loaded) and console.js's (api, errorText).
"use strict";

// How often the panel is read: a budget moves with each completed call, and a
// few seconds' delay costs an operator nothing.
const BUDGETS_REFRESH_MS = 5000;
// The chart's size in SVG units (it scales to the panel's width).
const CHART_W = 560;
const CHART_H = 160;
const CHART_AXIS_H = 18;
// One colour per series, the last for "(other)"; eight, as the endpoint sends at
// most. The legend's swatches are the same colours as classes (console.css,
// `.swatch.c0` ...): the page's policy allows no inline style.
const SERIES_COLOURS = ["#4da3ff", "#3fb68b", "#e0a63a", "#c678dd", "#e5534b", "#56b6c2", "#d19a66", "#8595a8"];

const budgetsView = { lastRead: 0, reading: false };

// Called by console.js after each render of the state: reads the panel when due.
function budgetsTick() {
  if (Date.now() - budgetsView.lastRead >= BUDGETS_REFRESH_MS) readBudgets();
}

async function readJson(path) {
  const response = await api(path);
  if (response.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin("The token was refused.");
    return null;
  }
  if (response.status === 404) return { absent: await errorText(response) };
  if (!response.ok) throw new Error(await errorText(response));
  return response.json();
}

async function readBudgets() {
  if (budgetsView.reading) return;
  budgetsView.reading = true;
  budgetsView.lastRead = Date.now();
  try {
    const [budgets, spend] = await Promise.all([readJson("/ui/api/budgets"), readJson("/ui/api/spend")]);
    if (budgets === null || spend === null) return;
    $("budgets-error").hidden = true;
    renderBudgets(budgets);
    renderSpend(spend);
    loaded("budgets-panel");
  } catch (e) {
    $("budgets-error").hidden = false;
    $("budgets-error").textContent = "The budgets could not be read: " + e.message;
    if ($("budgets-panel").hasAttribute("aria-busy")) $("spend-charts").replaceChildren();
    loadFailed("budgets-panel", [$("budgets").tBodies[0]]);
  } finally {
    budgetsView.reading = false;
  }
}

function dollars(text) {
  return text === null || text === undefined ? "—" : "$" + text;
}

// A chart's dollars: cents from a dollar up, else every micro-dollar (a test's
// calls cost fractions of a cent).
function chartDollars(microUsd) {
  return "$" + (microUsd / 1e6).toFixed(microUsd >= 1e6 ? 2 : 6);
}

function periodEnd(ms) {
  if (ms === null || ms === undefined) return "rolling";
  return new Date(ms).toISOString().replace("T", " ").slice(0, 16) + " UTC";
}

function renderBudgets(data) {
  $("budgets-note").textContent = data.error ? "The limits could not be read: " + data.error
    : `${num(data.total)} budgets` + (data.rows.length < data.total ? `, ${data.rows.length} fullest shown` : "");
  const rows = data.rows.map((b) => el("tr", { "data-budget": b.key },
    el("td", { class: "key", text: b.key }),
    el("td", {}, el("span", { class: "kind", text: b.owner }), " ", b.owner_name || "",
      b.retired ? el("span", { class: "pill retired", title: "No working key charges this budget" }, "key " + b.retired) : null),
    el("td", { text: b.span }),
    el("td", { class: "num", "data-field": "budget", text: dollars(b.budget_usd) }),
    el("td", { class: "num", "data-field": "spent", text: dollars(b.spent_usd),
      title: b.spent_usd === null ? "a rolling window: the ledger's days cannot split it; held: $" + b.held_micro_usd / 1e6 : null }),
    el("td", { class: "num", "data-field": "reserved", text: dollars(b.reserved_usd) }),
    el("td", { class: "num", "data-field": "left", text: dollars(b.left_usd) }),
    el("td", { class: "muted", "data-field": "ends", text: periodEnd(b.period_ends_unix_ms) })));
  $("budgets").tBodies[0].replaceChildren(...(rows.length ? rows
    : [el("tr", {}, el("td", { class: "empty", colspan: 8, text: "No budgets: set budgets on the gateway, a model, a tenant or a key." }))]));
}

function renderSpend(data) {
  if (data.absent) {
    $("spend-note").textContent = "No spend ledger: " + data.absent;
    $("spend-charts").replaceChildren();
    return;
  }
  $("spend-note").textContent = `${data.from} to ${data.to}, UTC`;
  $("spend-charts").replaceChildren(
    spendChart("By tenant", "tenant", data.days, data.by_tenant),
    spendChart("By model", "model", data.days, data.by_model));
}

function svgNode(tag, attrs) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  return node;
}

// Stacked bars, one per day, one colour per series; each bar segment names its
// series and day (the test reads them, and so does a hover).
function spendChart(title, grouping, days, series) {
  const totals = days.map((_, i) => series.reduce((sum, s) => sum + s.micro_usd[i], 0));
  const peak = Math.max(1, ...totals);
  const svg = svgNode("svg", { class: "spend-chart", viewBox: `0 0 ${CHART_W} ${CHART_H}`, "data-grouping": grouping,
    role: "img", "aria-label": `Spend per day ${title.toLowerCase()}` });
  const slot = CHART_W / days.length;
  const plotH = CHART_H - CHART_AXIS_H;
  days.forEach((day, i) => {
    let y = plotH;
    series.forEach((s, n) => {
      const value = s.micro_usd[i];
      if (value === 0) return;
      // At least one unit high: a cent beside a hundred dollars still shows.
      const h = Math.max(1, (value / peak) * (plotH - 4));
      y -= h;
      const bar = svgNode("rect", { x: i * slot + 3, y, width: slot - 6, height: h, fill: SERIES_COLOURS[n % SERIES_COLOURS.length],
        "data-series": s.name, "data-day": day, "data-micro-usd": value });
      bar.append(svgNode("title", {}));
      bar.firstChild.textContent = `${s.name}, ${day}: $${(value / 1e6).toFixed(6)}`;
      svg.append(bar);
    });
    if (i % 2 === days.length % 2 || i === days.length - 1) {
      const label = svgNode("text", { x: i * slot + slot / 2, y: CHART_H - 4, "text-anchor": "middle", class: "axis" });
      label.textContent = day.slice(5);
      svg.append(label);
    }
  });
  const legend = el("div", { class: "legend" }, ...series.map((s, n) => el("span", { class: "legend-item" },
    el("span", { class: `swatch c${n % SERIES_COLOURS.length}` }),
    `${s.name} ${chartDollars(s.micro_usd.reduce((a, b) => a + b, 0))}`)));
  return el("figure", { class: "spend" }, el("figcaption", { text: `${title} · peak ${chartDollars(peak)}/day` }),
    svg, series.length ? legend : el("p", { class: "muted", text: "No spend in these days." }));
}

if (!$("console").hidden) readBudgets();
