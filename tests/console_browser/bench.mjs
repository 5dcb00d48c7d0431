// The console's benchmark (BENCHMARKS.md, "The console"): a server with 50
// limits (one page) and one with 10,000, measured in the same run.
// - Server: the time of the page's per-second read, GET /ui/api/state (one
//   page of 50 rows with their history), against the reference GET
//   /v1/admin/limits (every limit, the admin API's list) on the same server.
// - Browser: time to first render (navigation to the first filled table) and
//   the per-second refresh's cost in the page (fetch and render), 10,000 keys
//   against 50.
// Prints a JSON summary; no timing is asserted (2 shared noisy cores).
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Browser } from "./cdp.mjs";
import { ADMIN_TOKEN, freePort, startServer, stopAll, ulid } from "./harness.mjs";

/** The reference: one full page of limits (and tenants), so the page renders
 *  as many rows as with 10,000 and the ratio is the cost of the keys beyond it. */
const REFERENCE_LIMITS = 50;
const READS = Number(process.env.BENCH_READS || 40);
const REFRESHES = Number(process.env.BENCH_REFRESHES || 8);
const auth = { Authorization: `Bearer ${ADMIN_TOKEN}` };

function registry(n) {
  const states = [];
  for (let i = 0; i < n; i++) {
    const tenant = `t${String(i % 1000).padStart(4, "0")}`;
    states.push({ key: `tenant:${tenant}:bench:k${String(i).padStart(5, "0")}`, kind: "rolling", capacity: 1000 + (i % 97),
      window_seconds: 60, unit: "requests", description: "", overage: "none", status: "active", pending_decrease_to: 0 });
  }
  return JSON.stringify(states);
}

async function timed(url, headers) {
  const started = performance.now();
  const response = await fetch(url, { headers });
  const body = await response.arrayBuffer();
  if (!response.ok) throw new Error(`${url}: ${response.status}`);
  return { ms: performance.now() - started, bytes: body.byteLength };
}

function median(values) {
  const sorted = values.slice().sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)];
}

async function serverSide(api) {
  const state = [];
  const list = [];
  let stateBytes = 0;
  let listBytes = 0;
  for (let i = 0; i < READS; i++) {
    const s = await timed(`${api}/ui/api/state?count=50`, auth);
    const l = await timed(`${api}/v1/admin/limits`, auth);
    state.push(s.ms);
    list.push(l.ms);
    stateBytes = s.bytes;
    listBytes = l.bytes;
  }
  return { state_ms: median(state), admin_list_ms: median(list), state_bytes: stateBytes, admin_list_bytes: listBytes };
}

async function browserSide(browser, api) {
  const page = await browser.newPage();
  await page.goto(`${api}/ui`);
  await page.eval(`sessionStorage.setItem('ratelimiterd.adminToken', ${JSON.stringify(ADMIN_TOKEN)}); true`);
  await page.goto(`${api}/ui`);
  await page.waitFor(`window.__consoleStats.firstRenderMs !== null`, "the first render", 60_000);
  const first = await page.eval(`window.__consoleStats.firstRenderMs`);
  const start = await page.eval(`window.__consoleStats.refreshes`);
  await page.waitFor(`window.__consoleStats.refreshes >= ${start + REFRESHES}`, "refreshes", 60_000);
  const stats = await page.eval(`window.__consoleStats`);
  const heap = (await page.send("Runtime.getHeapUsage")).usedSize;
  await page.send("Page.close").catch(() => {});
  return {
    first_render_ms: first,
    refresh_fetch_ms: stats.fetchMsTotal / stats.refreshes,
    refresh_render_ms: stats.renderMsTotal / stats.refreshes,
    js_heap_bytes: heap,
  };
}

async function serverWith(n) {
  const dir = mkdtempSync(join(tmpdir(), `console-bench-${n}-`));
  writeFileSync(join(dir, "limits.json"), registry(n));
  const port = await freePort();
  await startServer(dir, `server:\n  listen_addr: "127.0.0.1:${port}"\n  admin_token: "${ADMIN_TOKEN}"\nregistry:\n  path: "${join(dir, "limits.json")}"\n`, port);
  const api = `http://127.0.0.1:${port}`;
  // Some usage, so that rows differ: one reservation on every tenth key.
  for (let i = 0; i < n; i += 10) {
    const key = `tenant:t${String(i % 1000).padStart(4, "0")}:bench:k${String(i).padStart(5, "0")}`;
    await fetch(`${api}/v1/reserve`, { method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ lease_id: ulid(), requirements: [{ key, amount: 1 + (i % 900) }] }) });
  }
  return { api, dir };
}

async function main() {
  const results = {};
  let browser;
  const dirs = [];
  try {
    const small = await serverWith(REFERENCE_LIMITS);
    const large = await serverWith(10_000);
    dirs.push(small.dir, large.dir);
    // Two sampler passes, so the history is part of what is read.
    await new Promise((r) => setTimeout(r, 6_000));
    results.server_reference = await serverSide(small.api);
    results.server_10000 = await serverSide(large.api);
    browser = await Browser.launch();
    results.browser_reference = await browserSide(browser, small.api);
    results.browser_10000 = await browserSide(browser, large.api);
    const r = (a, b) => Number((a / b).toFixed(2));
    results.ratios = {
      server_state_over_admin_list_10000: r(results.server_10000.state_ms, results.server_10000.admin_list_ms),
      server_state_10000_over_reference: r(results.server_10000.state_ms, results.server_reference.state_ms),
      browser_first_render_10000_over_reference: r(results.browser_10000.first_render_ms, results.browser_reference.first_render_ms),
      browser_refresh_10000_over_reference: r(
        results.browser_10000.refresh_fetch_ms + results.browser_10000.refresh_render_ms,
        results.browser_reference.refresh_fetch_ms + results.browser_reference.refresh_render_ms),
    };
    console.log(JSON.stringify(results, null, 2));
  } finally {
    if (browser) await browser.close();
    await stopAll();
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
  }
}

main().catch((e) => {
  console.error("console bench: FAILED:", e.message);
  process.exitCode = 1;
});
