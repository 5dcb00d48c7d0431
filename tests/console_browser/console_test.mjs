// The console in a real browser (docs/console.md, "Tests"): starts provider-sim
// and ratelimiterd with limits, a gateway and traffic, opens /ui in headless
// Chromium and checks what an operator sees: a wrong token refused, the limits
// table filled, a value that changes after a reservation, a paused model shown
// as paused, a capacity changed from the page with the server's error shown
// for a bad one, the classes panel with both classes' calls counted and the
// tenants' classes, the tenants and keys panel (keys_test.mjs), and the
// budgets panel and spend chart (budgets_test.mjs), the budgets in dollars in
// the limits and tenants tables, the loading states (loading_test.mjs), and
// that every panel fits 1400 px (layout_test.mjs). Keeps
// screenshots in $ARTIFACTS_DIR, the whole page once every panel has its data
// as console-full.png; with UPDATE_CONSOLE_PNG=1 that one also replaces
// docs/console.png (so a run on a read-only checkout never writes the tree).
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { Browser } from "./cdp.mjs";
import { ADMIN_TOKEN, TENANT_KEYS, UPSTREAM_KEY, admin, check, freePort, json, startServer, startSim, stopAll, ulid } from "./harness.mjs";
import { checkKeysPanel } from "./keys_test.mjs";
import { checkBudgetsPanel } from "./budgets_test.mjs";
import { checkLayout } from "./layout_test.mjs";
import { checkLoading } from "./loading_test.mjs";

const ARTIFACTS = process.env.ARTIFACTS_DIR || join(process.cwd(), "target", "artifacts");
const DEMO_KEY = "console:demo:rpm";
/** The window of the test and of docs/console.png. */
const WIDE = { width: 1600, height: 1000 };
/** The picture of the console the documentation shows (README.md, docs/console.md). */
const DOCS_PNG = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "docs", "console.png");

function config(apiPort, gatewayPort, simUrl, dir) {
  return `server:
  listen_addr: "127.0.0.1:${apiPort}"
  admin_token: "${ADMIN_TOKEN}"
registry:
  path: "${join(dir, "limits.json")}"
gateway:
  listen_addr: "127.0.0.1:${gatewayPort}"
  budgets: [{usd: 1, period: day}]
  upstreams:
    - name: openai
      kind: openai
      base_url: "${simUrl}"
      api_key_env: SIM_UPSTREAM_KEY
  models:
    - name: gpt-4o-mini
      upstream: openai
      rpm: 600
      tpm: 1000000
      concurrency: 20
      max_output_tokens_default: 64
    - name: gpt-4o
      upstream: openai
      rpm: 300
      tpm: 200000
      max_output_tokens_default: 64
  classes:
    - name: interactive
      share: 4
      headroom: 0.10
    - name: batch
      share: 1
  tenants:
    - name: acme
      api_key_env: ACME_GATEWAY_KEY
      daily_tokens: 20000
      rpm: 100
      class: interactive
      budgets: [{usd: 0.5, period: day}]
    - name: globex
      api_key_env: GLOBEX_GATEWAY_KEY
      daily_tokens: 50000
      class: batch
`;
}

async function chat(gateway, tenant, model) {
  return json(`${gateway}/v1/chat/completions`, {
    method: "POST",
    headers: { Authorization: `Bearer ${TENANT_KEYS[tenant]}`, "Content-Type": "application/json" },
    body: JSON.stringify({ model, max_tokens: 16, messages: [{ role: "user", content: "Say hello to the console." }] }),
  });
}

async function traffic(api, gateway, simUrl) {
  for (const [key, kind, capacity] of [[DEMO_KEY, "rolling", 100], ["console:demo:concurrency", "concurrency", 8]]) {
    const definition = kind === "rolling"
      ? { key, kind, capacity, window_seconds: 60, unit: "requests" }
      : { key, kind, capacity, timeout_seconds: 60, unit: "calls" };
    const put = await admin(api, "/v1/admin/limits", "PUT", definition);
    check(put.status === 200, `defining ${key}: ${put.text}`);
  }
  for (let i = 0; i < 6; i++) {
    const answer = await chat(gateway, i % 2 ? "acme" : "globex", "gpt-4o-mini");
    check(answer.status === 200, `gateway call ${i}: ${answer.status} ${answer.text}`);
  }
  // The provider refuses the next gpt-4o call with a long hint: the gateway pauses the model.
  const fault = await json(`${simUrl}/sim/faults`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ mode: "status", status: 429, retry_after_ms: 300000, count: 1, model: "gpt-4o" }),
  });
  check(fault.status < 300, `arming the fault: ${fault.text}`);
  const refused = await chat(gateway, "acme", "gpt-4o");
  check(refused.status === 429, `the provider's 429 comes back: ${refused.status} ${refused.text}`);
}

async function checkEndpoints(api) {
  const none = await json(`${api}/ui/api/state`);
  check(none.status === 401, `no token: ${none.status}`);
  const wrong = await json(`${api}/ui/api/state`, { headers: { Authorization: "Bearer not-the-admin-token-at-all" } });
  check(wrong.status === 401, `wrong token: ${wrong.status}`);
  const page = await fetch(`${api}/ui`);
  check(page.status === 200, `the page loads: ${page.status}`);
  check((page.headers.get("content-security-policy") || "").includes("default-src 'none'"), "the page has a strict CSP");
  const state = await json(`${api}/ui/api/state?count=500`, { headers: { Authorization: `Bearer ${ADMIN_TOKEN}` } });
  check(state.status === 200, `the state with the token: ${state.status} ${state.text}`);
  for (const secret of [ADMIN_TOKEN, UPSTREAM_KEY, ...Object.values(TENANT_KEYS)]) {
    check(!state.text.includes(secret), "no key material in the state document");
  }
  const bad = await json(`${api}/ui/api/state?sort=colour`, { headers: { Authorization: `Bearer ${ADMIN_TOKEN}` } });
  check(bad.status === 400 && String(bad.body.error).includes("sort"), `a bad query is a 400 naming it: ${bad.text}`);
}

/** The text of the cell `cls` in the limits row of `key`, or null. */
function cell(key, cls) {
  return `(() => { const row = [...document.querySelectorAll('#limits tbody tr')].find(r => r.dataset.key === ${JSON.stringify(key)});
    return row ? row.querySelector('td.${cls}').textContent : null; })()`;
}

async function run(page, api) {
  await page.goto(`${api}/ui`);
  await page.waitFor(`!document.getElementById('login').hidden`, "the sign-in form");
  // A wrong token is refused and the console stays closed.
  await page.eval(`document.getElementById('token').value = 'wrong-token-0123456789'; document.getElementById('login-submit').click(); true`);
  await page.waitFor(`document.getElementById('login-error').textContent.includes('refused')`, "the refusal of a wrong token");
  check(await page.eval(`document.getElementById('console').hidden`), "the console stays hidden after a wrong token");
  check((await page.eval(`sessionStorage.getItem('ratelimiterd.adminToken')`)) === null, "a refused token is not kept");
  writeFileSync(join(ARTIFACTS, "console-login-refused.png"), await page.screenshot());

  // The right token opens it; the limits table fills.
  await page.eval(`document.getElementById('token').value = ${JSON.stringify(ADMIN_TOKEN)}; document.getElementById('login-submit').click(); true`);
  await page.waitFor(`!document.getElementById('console').hidden`, "the console after the right token");
  await checkLoading(page, api);
  const rows = await page.waitFor(`document.querySelectorAll('#limits tbody tr[data-key]').length >= 10 && document.querySelectorAll('#limits tbody tr[data-key]').length`, "the limits table");
  check(rows >= 10, `limits rows: ${rows}`);
  await page.waitFor(`${cell(DEMO_KEY, "in-use")} === '0'`, "the demo key at 0 in use");

  // A reservation shows within the page's refresh.
  const reserve = await json(`${api}/v1/reserve`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ lease_id: ulid(), requirements: [{ key: DEMO_KEY, amount: 7 }] }),
  });
  check(reserve.status === 200 && reserve.body.allowed, `reserve: ${reserve.text}`);
  await page.waitFor(`${cell(DEMO_KEY, "in-use")} === '7'`, "the reservation in the table");
  await page.waitFor(`${cell(DEMO_KEY, "release")} !== '—'`, "a time to the next release");

  // The model the provider refused is shown paused; the other is active.
  await page.waitFor(`(document.querySelector('#models tr[data-model="gpt-4o"] td.state') || {}).textContent?.startsWith('paused')`, "gpt-4o shown paused");
  const mini = await page.eval(`document.querySelector('#models tr[data-model="gpt-4o-mini"] td.state').textContent`);
  check(mini === "active", `gpt-4o-mini is active: ${mini}`);
  await page.waitFor(`document.querySelector('#tenants tr[data-tenant="acme"]') !== null`, "the tenant acme");
  await checkClasses(page);
  await checkMoney(page);

  // A bad capacity is refused with the server's error; a good one applies.
  const openEdit = `document.querySelector('#limits tr[data-key="${DEMO_KEY}"] button.edit').click(); true`;
  await page.eval(openEdit);
  await page.waitFor(`document.getElementById('edit').open`, "the capacity dialog");
  await page.eval(`document.getElementById('edit-capacity').value = '0'; document.getElementById('edit-apply').click(); true`);
  const error = await page.waitFor(`document.getElementById('edit-error').textContent`, "the server's error for capacity 0");
  check(error.includes("invalid_request"), `the error shown: ${error}`);
  await page.eval(`document.getElementById('edit-capacity').value = '250'; document.getElementById('edit-apply').click(); true`);
  await page.waitFor(`!document.getElementById('edit').open`, "the dialog to close");
  await page.waitFor(`${cell(DEMO_KEY, "capacity")} === '250✎'`, "the new capacity in the table");
  const stored = await admin(api, `/v1/admin/limits/${DEMO_KEY}`);
  check(stored.body.capacity === 250 && stored.body.unit === "requests", `the server holds it: ${stored.text}`);

  // Sorting by key puts the concurrency key first among the demo keys.
  await page.eval(`document.querySelector('#limits th[data-sort="key"]').click(); true`);
  // (The classes' ceiling keys, class:..., come before them.)
  await page.waitFor(`[...document.querySelectorAll('#limits tbody tr[data-key]')].map(r => r.dataset.key).filter(k => k.startsWith('console:'))[0] === 'console:demo:concurrency'
    && document.querySelector('#limits tbody tr[data-key]').dataset.key.startsWith('class:')`, "sorted by key");
  await page.eval(`document.querySelector('#limits th[data-sort="utilization"]').click(); true`);
  await page.waitFor(`document.querySelector('#limits th[data-sort="utilization"]').classList.contains('sorted-desc')`, "sorted by utilization");
  await checkKeysPanel(page, api, showcase.gateway, ARTIFACTS);
  await checkBudgetsPanel(page, ARTIFACTS);
  await checkBudgetEdit(page, api);
  await checkLayout(page, ARTIFACTS, WIDE);
  await new Promise((r) => setTimeout(r, 1500));
  await showcase(api);
  check(page.errors.length === 0, `no script errors: ${page.errors.join("; ")}`);
  writeFileSync(join(ARTIFACTS, "console.png"), await page.screenshot());
  await saveFullPage(page);
}

/** The whole page, every panel with its data (the keys and budgets panels were
 *  checked above), scrolled back to the top: into the artifacts, and into
 *  docs/console.png when UPDATE_CONSOLE_PNG=1. */
async function saveFullPage(page) {
  await page.eval(`window.scrollTo(0, 0); true`);
  for (const panel of ["#limits tbody tr[data-key]", "#models tr[data-model]", "#tenants tr[data-tenant]",
    "#classes tr[data-class]", "#dir-tenants tbody tr", "#keys tbody tr", "#budgets tr[data-budget]", "svg.spend-chart"]) {
    await page.waitFor(`document.querySelector(${JSON.stringify(panel)}) !== null`, `${panel} before the full-page picture`);
  }
  const picture = await page.fullPageScreenshot();
  writeFileSync(join(ARTIFACTS, "console-full.png"), picture);
  if (process.env.UPDATE_CONSOLE_PNG === "1") {
    writeFileSync(DOCS_PNG, picture);
    console.log(`console browser test: ${DOCS_PNG} updated`);
  }
}

/** Budgets in dollars with their period wherever they show, and a tenant's
 *  daily tokens never called its budget. */
async function checkMoney(page) {
  for (const [key, shown] of [["gateway:usd:day", "$1.00 / day"], ["tenant:acme:usd:day", "$0.50 / day"]]) {
    await page.eval(`document.getElementById('filter').value = ${JSON.stringify(key)}; document.getElementById('filter').dispatchEvent(new Event('input')); true`);
    await page.waitFor(`(${cell(key, "capacity")} || '').startsWith(${JSON.stringify(shown)})`, `${key} as ${shown} in the limits table`);
    const held = await page.eval(cell(key, "in-use"));
    check(/^\$\d+\.\d{2,6}$/.test(held), `${key}: what it holds in dollars: ${held}`);
  }
  await page.eval(`document.getElementById('filter').value = ''; document.getElementById('filter').dispatchEvent(new Event('input')); true`);
  await page.waitFor(`${cell(DEMO_KEY, "capacity")} !== null`, "every limit again once the filter is cleared");
  const acme = await page.eval(text('#tenants tr[data-tenant="acme"] td.budgets'));
  check(acme.includes("of $0.50 / day"), `acme's budget in dollars in the tenants table: ${acme}`);
  const tokens = await page.eval(text('#tenants tr[data-tenant="acme"] td.daily-tokens'));
  check(/ \d[\d.,k]* \/ 20(\.0)?k$/.test(tokens), `acme's daily tokens as tokens: ${tokens}`);
  const globex = await page.eval(text('#tenants tr[data-tenant="globex"] td.budgets'));
  check(globex === "no budget", `globex has daily tokens and no budget: ${globex}`);
  const headers = await page.eval(`[...document.querySelectorAll('#tenants th')].map((th) => th.textContent).join('|')`);
  check(headers.includes("Daily tokens") && headers.includes("Budgets") && !/budget used/i.test(headers), `the tenants table's columns: ${headers}`);
}

/** A budget changed from the page in dollars, its period kept; then lowered
 *  back (applied, or pending while the period holds spend). */
async function checkBudgetEdit(page, api) {
  const key = "gateway:usd:day";
  const filter = (q) => page.eval(`document.getElementById('filter').value = ${JSON.stringify(q)}; document.getElementById('filter').dispatchEvent(new Event('input')); true`);
  await filter(key);
  for (const [typed, micro, shown] of [["2.5", 2500000, "$2.50 / day✎"], ["$1", 1000000, "$1.00 / day✎"]]) {
    await page.waitFor(`document.querySelector('#limits tr[data-key="${key}"] button.edit') !== null`, `${key}'s ✎`);
    await page.eval(`document.querySelector('#limits tr[data-key="${key}"] button.edit').click(); true`);
    await page.waitFor(`document.getElementById('edit').open`, "the budget dialog");
    const label = await page.eval(`document.getElementById('edit-label').textContent`);
    check(label === "New budget in USD (per day)", `the dialog asks for dollars: ${label}`);
    await page.eval(`document.getElementById('edit-capacity').value = 'forty'; document.getElementById('edit-apply').click(); true`);
    const error = await page.waitFor(`document.getElementById('edit-error').textContent`, "a bad amount refused in the page");
    check(error.includes("dollars"), `the error names dollars: ${error}`);
    await page.eval(`document.getElementById('edit-capacity').value = ${JSON.stringify(typed)}; document.getElementById('edit-apply').click(); true`);
    await page.waitFor(`!document.getElementById('edit').open`, "the budget dialog to close");
    const stored = await admin(api, `/v1/admin/limits/${key}`);
    // A lower budget waits while the period holds spend (a pending decrease), as any limit.
    const target = stored.body.status === "decreasing" ? stored.body.pending_decrease_to : stored.body.capacity;
    check(target === micro && stored.body.period === "day", `the budget in micro-dollars, its period kept: ${stored.text}`);
    const seen = stored.body.status === "decreasing"
      ? `(document.querySelector('#limits tr[data-key="${key}"] .pill.decreasing') || {}).textContent === ${JSON.stringify("→ " + shown.split(" ")[0])}`
      : `${cell(key, "capacity")} === ${JSON.stringify(shown)}`;
    await page.waitFor(seen, `${shown} in the table`);
  }
  await filter("");
}

/** The text of `selector` in the page, or null. */
function text(selector) {
  return `(document.querySelector(${JSON.stringify(selector)}) || {}).textContent ?? null`;
}

/** The classes panel after the traffic: each class with its tenants and its
 *  calls counted per model, batch's ceiling in use, the tenants' classes. */
async function checkClasses(page) {
  // acme (interactive) made 3 gpt-4o-mini calls and one gpt-4o call; globex (batch) 3 gpt-4o-mini calls.
  await page.waitFor(`${text('#classes tr[data-class-model="batch/gpt-4o-mini"] td.small')} === '3 admitted last min'`,
    "batch's three calls in the classes panel");
  await page.waitFor(`${text('#classes tr[data-class-model="interactive/gpt-4o-mini"] td.small')} === '3 admitted last min'`,
    "interactive's three calls in the classes panel");
  const interactive = await page.eval(text('#classes tr[data-class="interactive"] td.tenants'));
  check(interactive === "acme", `interactive's tenants: ${interactive}`);
  const batch = await page.eval(text('#classes tr[data-class="batch"] td.tenants'));
  check(batch === "globex", `batch's tenants: ${batch}`);
  const headroom = await page.eval(text('#classes tr[data-class="interactive"] td:nth-child(3)'));
  check(headroom === "10% / 100%", `interactive's headroom and what it may hold: ${headroom}`);
  const ceiling = await page.eval(text('#classes tr[data-class="batch"] td.util'));
  check(/^\d/.test(ceiling) && ceiling.includes("%"), `batch's ceiling use is a bar: ${ceiling}`);
  const top = await page.eval(text('#classes tr[data-class="interactive"] td.util'));
  check(top.startsWith("no ceiling"), `the top class has no ceiling: ${top}`);
  const acme = await page.eval(text('#tenants tr[data-tenant="acme"] td.key'));
  check(acme === "acme · interactive", `acme's class in the tenants table: ${acme}`);
  // Sorting by admissions keeps every class row.
  await page.eval(`document.querySelector('#classes th[data-sort="admitted_per_s"]').click(); true`);
  await page.waitFor(`document.querySelector('#classes th[data-sort="admitted_per_s"]').classList.contains('sorted-desc')`, "classes sorted by admissions");
  const classRows = await page.eval(`document.querySelectorAll('#classes tbody tr[data-class]').length`);
  check(classRows === 2, `two class rows: ${classRows}`);
}

/** With CONSOLE_SHOWCASE_MS, keeps traffic going that long before the last
 *  screenshot, so that the sparklines have history (how docs/console.png is made). */
async function showcase(api) {
  const until = Date.now() + Number(process.env.CONSOLE_SHOWCASE_MS || 0);
  let i = 0;
  while (Date.now() < until) {
    const tenant = i % 3 ? "acme" : "globex";
    await chat(showcase.gateway, tenant, "gpt-4o-mini");
    const amount = 1 + Math.floor(4 * (1 + Math.sin(i / 15)));
    await json(`${api}/v1/reserve`, { method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ lease_id: ulid(), requirements: [{ key: DEMO_KEY, amount }] }) });
    i += 1;
    await new Promise((r) => setTimeout(r, 400));
  }
}

async function main() {
  mkdirSync(ARTIFACTS, { recursive: true });
  const dir = mkdtempSync(join(tmpdir(), "console-test-"));
  let browser;
  try {
    const simUrl = await startSim(dir);
    const [apiPort, gatewayPort] = [await freePort(), await freePort()];
    await startServer(dir, config(apiPort, gatewayPort, simUrl, dir), apiPort);
    const api = `http://127.0.0.1:${apiPort}`;
    showcase.gateway = `http://127.0.0.1:${gatewayPort}`;
    await traffic(api, showcase.gateway, simUrl);
    await checkEndpoints(api);
    browser = await Browser.launch();
    const page = await browser.newPage();
    await run(page, api);
    console.log(`console browser test: passed; screenshots in ${ARTIFACTS}`);
  } finally {
    if (browser) await browser.close();
    await stopAll();
    if (!process.env.KEEP_TEST_DIR) rmSync(dir, { recursive: true, force: true });
  }
}

main().catch((e) => {
  console.error("console browser test: FAILED:", e.message);
  process.exitCode = 1;
});
