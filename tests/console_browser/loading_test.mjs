// The console before its data (docs/console.md, "Using the page"): the page
// says it is loading until the state's first answer, and the panels read apart
// from it (tenants and keys, budgets, the spend chart) say "Loading…" until
// theirs, never the "none" their data may say. The test holds those answers
// in the browser (the DevTools protocol's Fetch domain) and lets them go one
// after the other.
import { check } from "./harness.mjs";

/** The console's reads the test holds. */
const HELD = ["*/ui/api/state*", "*/ui/api/directory*", "*/ui/api/budgets*", "*/ui/api/spend*"];

/** What the loading panels show: their tables' first cell and the chart's note. */
const PANELS = `JSON.stringify({
  page: !document.getElementById('loading').hidden && document.getElementById('console').hidden,
  tenants: document.querySelector('#dir-tenants tbody td').textContent,
  keys: document.querySelector('#keys tbody td').textContent,
  budgets: document.querySelector('#budgets tbody td').textContent,
  spend: document.getElementById('spend-charts').textContent,
  busy: ['keys-panel', 'budgets-panel'].filter((id) => document.getElementById(id).getAttribute('aria-busy') === 'true'),
})`;

/** Reloads `api`/ui (signed in) with the console's reads held; checks each loading state. */
export async function checkLoading(page, api) {
  const held = [];
  const listener = (message) => {
    if (message.sessionId === page.sessionId && message.method === "Fetch.requestPaused") held.push(message.params);
  };
  // Away from the console first, so that every read held is the new page's.
  await page.goto("about:blank");
  page.browser.listeners.push(listener);
  await page.send("Fetch.enable", { patterns: HELD.map((urlPattern) => ({ urlPattern, requestStage: "Request" })) });
  try {
    await page.goto(`${api}/ui`);
    await page.waitFor(`document.getElementById('loading') !== null`, "the console's page");
    const waitHeld = async (part, what) => {
      const deadline = Date.now() + 15_000;
      while (!held.some((r) => r.request.url.includes(part))) {
        check(Date.now() < deadline, `the page asked for ${what}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    };
    await waitHeld("/ui/api/state", "the state");
    const before = JSON.parse(await page.eval(PANELS));
    check(before.page, "the page says it is loading before the state's first answer");

    await release(page, held, "/ui/api/state");
    await page.waitFor(`!document.getElementById('console').hidden`, "the console after the state's answer");
    await waitHeld("/ui/api/directory", "the tenants and keys");
    await waitHeld("/ui/api/budgets", "the budgets");
    // The state is read every second: let those through while the panels' reads wait.
    const panels = JSON.parse(await page.eval(PANELS));
    for (const name of ["tenants", "keys", "budgets", "spend"]) {
      check(panels[name] === "Loading…", `the ${name} panel says it is loading before its data: ${JSON.stringify(panels[name])}`);
    }
    check(panels.busy.length === 2, `both panels are marked busy: ${panels.busy}`);
  } finally {
    await page.send("Fetch.disable");
    page.browser.listeners.splice(page.browser.listeners.indexOf(listener), 1);
    await release(page, held, "");
  }
  await page.waitFor(`document.querySelector('#dir-tenants tr[data-dir-tenant]') !== null
    && document.querySelector('#budgets tr[data-budget]') !== null
    && !document.getElementById('keys-panel').hasAttribute('aria-busy')
    && !document.getElementById('budgets-panel').hasAttribute('aria-busy')`, "the panels' data once their reads are let through");
  const keys = await page.eval(`document.querySelector('#keys tbody td').textContent`);
  check(keys !== "Loading…", `the keys panel's answer replaces its loading row: ${keys}`);
}

/** Lets every held request whose URL contains `part` go on to the server. */
async function release(page, held, part) {
  for (const request of held.filter((r) => r.request.url.includes(part))) {
    held.splice(held.indexOf(request), 1);
    try {
      await page.send("Fetch.continueRequest", { requestId: request.requestId });
    } catch (_) {
      // The page went on without it (a reload): nothing to let through.
    }
  }
}
