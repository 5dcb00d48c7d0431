// ratelimiterd console, what every panel shares: building the DOM, the
// formatting of counts, rates, durations, percentages and money, and the
// bars and sparklines. Loaded first: console.js, keys.js and budgets.js use
// these. A budget's limit counts micro-dollars (1,000,000 = $1): it is shown
// in dollars with its period, never as a bare count.
"use strict";

const MICRO_USD_PER_USD = 1000000;
const SPARK_W = 120;
const SPARK_H = 24;
const SVG_NS = "http://www.w3.org/2000/svg";

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const intFmt = new Intl.NumberFormat("en-US");
function num(n) {
  if (n === null || n === undefined) return "—";
  return intFmt.format(n);
}
function rate(n) {
  if (n === null || n === undefined) return "—";
  if (n === 0) return "0";
  if (n < 10) return n.toFixed(1);
  return intFmt.format(Math.round(n));
}
function compact(n) {
  if (n === null || n === undefined) return "—";
  n = Math.round(n);
  const abs = Math.abs(n);
  if (abs >= 1e9) return (n / 1e9).toFixed(abs >= 1e10 ? 0 : 1) + "G";
  if (abs >= 1e6) return (n / 1e6).toFixed(abs >= 1e7 ? 0 : 1) + "M";
  if (abs >= 1e4) return (n / 1e3).toFixed(abs >= 1e5 ? 0 : 1) + "k";
  return intFmt.format(n);
}
function duration(ms) {
  if (ms === null || ms === undefined) return "—";
  if (ms < 1000) return Math.round(ms) + " ms";
  const s = ms / 1000;
  if (s < 60) return s.toFixed(s < 10 ? 1 : 0) + " s";
  const m = Math.floor(s / 60);
  if (m < 60) return m + " min " + Math.floor(s % 60) + " s";
  return Math.floor(m / 60) + " h " + (m % 60) + " min";
}
function percent(bp) {
  return (bp / 100).toFixed(bp < 1000 ? 1 : 0) + "%";
}
function level(bp) {
  return bp >= 9000 ? "bad" : bp >= 7000 ? "warn" : "";
}

// Micro-dollars as dollars, exactly: cents at least, more digits only when
// the amount has them ($40.00, $1.50, $0.000123). Integer arithmetic: no float
// rounds a budget.
function money(microUsd) {
  if (microUsd === null || microUsd === undefined) return "—";
  const whole = Math.floor(microUsd / MICRO_USD_PER_USD);
  let fraction = String(microUsd % MICRO_USD_PER_USD).padStart(6, "0").replace(/0+$/, "");
  if (fraction.length < 2) fraction = fraction.padEnd(2, "0");
  return "$" + intFmt.format(whole) + "." + fraction;
}

// What a budget counts over: its calendar period in UTC (`day`, `week`,
// `month`) or its rolling window.
function spanText(period, windowSeconds) {
  if (period) return period;
  return windowSeconds ? `${num(windowSeconds)} s window` : "—";
}

// A budget with its span: "$40.00 / day".
function perSpan(microUsd, period, windowSeconds) {
  return `${money(microUsd)} / ${spanText(period, windowSeconds)}`;
}

// Dollars typed by an operator ("40", "12.5", "0.000125") as whole
// micro-dollars, exactly; null when it is not a plain amount with at most six
// decimals.
function dollarsToMicro(text) {
  const match = /^\$?(\d{1,10})(?:\.(\d{1,6}))?$/.exec(text.trim());
  if (!match) return null;
  return Number(match[1]) * MICRO_USD_PER_USD + Number((match[2] || "").padEnd(6, "0"));
}

// `retired`: a revoked or expired key's limit, which refuses no call: grey, never red.
function bar(bp, retired = false) {
  const fill = el("div", { class: "fill " + (retired ? "retired" : level(bp)) });
  fill.style.width = Math.min(100, bp / 100) + "%";
  return el("span", {}, el("span", { class: "bar" }, fill), el("span", { class: "bar-label", text: percent(bp) }));
}

// `full`: draw the dashed line of a full limit (utilization); off for counts.
function sparkline(history, slots, full = true) {
  const svg = document.createElementNS(SVG_NS, "svg");
  svg.setAttribute("class", "sparkline");
  svg.setAttribute("width", SPARK_W);
  svg.setAttribute("height", SPARK_H);
  svg.setAttribute("viewBox", `0 0 ${SPARK_W} ${SPARK_H}`);
  const values = history || [];
  const known = values.filter((v) => v !== null);
  if (known.length === 0) {
    const t = document.createElementNS(SVG_NS, "text");
    t.setAttribute("class", "none");
    t.setAttribute("x", 2);
    t.setAttribute("y", 15);
    t.textContent = "collecting…";
    svg.append(t);
    return svg;
  }
  const top = Math.max(10000, ...known);
  // A fixed 15-minute axis, newest at the right: a young history fills the right end only.
  const shift = Math.max(0, slots - values.length);
  const step = SPARK_W / Math.max(1, Math.max(slots, values.length) - 1);
  const y = (v) => (SPARK_H - 2 - (v / top) * (SPARK_H - 4)).toFixed(1);
  if (full) {
    const line = document.createElementNS(SVG_NS, "line");
    line.setAttribute("class", "full");
    line.setAttribute("x1", 0);
    line.setAttribute("x2", SPARK_W);
    line.setAttribute("y1", y(10000));
    line.setAttribute("y2", y(10000));
    svg.append(line);
  }
  // One path per run of known samples: a gap is a gap, not a straight line.
  let line = "";
  let area = "";
  let run = [];
  const flush = () => {
    if (run.length === 0) return;
    const x = (i) => ((i + shift) * step).toFixed(1);
    const pts = run.map(([i, v]) => `${x(i)},${y(v)}`);
    line += "M" + pts.join("L");
    area += `M${x(run[0][0])},${SPARK_H}L` + pts.join("L") + `L${x(run[run.length - 1][0])},${SPARK_H}Z`;
    run = [];
  };
  values.forEach((v, i) => (v === null ? flush() : run.push([i, v])));
  flush();
  for (const [cls, d] of [["area", area], ["line", line]]) {
    const p = document.createElementNS(SVG_NS, "path");
    p.setAttribute("class", cls);
    p.setAttribute("d", d);
    svg.append(p);
  }
  // The latest sample as a dot, so that a lone sample shows too.
  const lastIndex = values.length - 1;
  if (values[lastIndex] !== null) {
    const dot = document.createElementNS(SVG_NS, "circle");
    dot.setAttribute("class", "last");
    dot.setAttribute("cx", ((lastIndex + shift) * step).toFixed(1));
    dot.setAttribute("cy", y(values[lastIndex]));
    dot.setAttribute("r", 1.8);
    svg.append(dot);
  }
  return svg;
}

// A panel read apart from the state (keys, budgets) is "Loading…" until its
// first answer, told apart from the "none" that answer may say; a first read
// that fails says so instead of loading for ever.
function loaded(panelId) {
  $(panelId).removeAttribute("aria-busy");
}
function loadFailed(panelId, tbodies) {
  if (!$(panelId).hasAttribute("aria-busy")) return;
  for (const tbody of tbodies) {
    const colspan = tbody.parentElement.tHead.rows[0].cells.length;
    tbody.replaceChildren(el("tr", {}, el("td", { class: "empty", colspan, text: "Not read yet: see the error above." })));
  }
}
