// The console's budgets panel and spend chart in a real browser (docs/console.md,
// "Budgets and spend"): after the test's gateway calls, the gateway's and a
// tenant's daily budget show what is spent, and left is the budget less what is
// spent and reserved, to the cent's millionth the page shows; the spend chart has
// today's bar for the tenant and for the model.
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { check } from "./harness.mjs";

/** The text of column `field` in the budgets row of `key`, or null. */
function budgetCell(key, field) {
  const selector = `#budgets tr[data-budget="${key}"] td[data-field="${field}"]`;
  return `((document.querySelector(${JSON.stringify(selector)}) || {}).textContent ?? null)`;
}

/** `$1.234567` as whole micro-dollars, exactly (no float). */
function microUsd(text, what) {
  const match = /^\$(\d+)\.(\d{6})$/.exec(text || "");
  check(match !== null, `${what} is dollars with six decimals: ${text}`);
  return BigInt(match[1]) * 1000000n + BigInt(match[2]);
}

/** One budget's row: spent above 0 and left = budget − spent − reserved. */
async function checkBudget(page, key, budgetText) {
  await page.waitFor(`(${budgetCell(key, "spent")} || '$0.000000') !== '$0.000000'`, `${key}: spent above 0`, 20_000);
  // One read of the row's cells: they were rendered together.
  const cells = await page.eval(`JSON.stringify(["budget", "spent", "reserved", "left", "ends"].map((f) =>
    (document.querySelector('#budgets tr[data-budget="${key}"] td[data-field="' + f + '"]') || {}).textContent ?? null))`);
  const [budget, spent, reserved, left, ends] = JSON.parse(cells);
  check(budget === budgetText, `${key}: the budget shown: ${budget}`);
  const [b, s, r, l] = [budget, spent, reserved, left].map((t, i) => microUsd(t, `${key} ${["budget", "spent", "reserved", "left"][i]}`));
  check(s > 0n, `${key}: spent above 0: ${spent}`);
  check(l === b - s - r, `${key}: left ${left} = budget ${budget} − spent ${spent} − reserved ${reserved}`);
  const midnight = new Date(Math.ceil(Date.now() / 86400000) * 86400000).toISOString().replace("T", " ").slice(0, 16) + " UTC";
  check(ends === midnight, `${key}: the period ends at the next midnight UTC: ${ends}`);
}

export async function checkBudgetsPanel(page, artifacts) {
  await page.waitFor(`document.querySelector('#budgets tr[data-budget="gateway:usd:day"]') !== null`, "the gateway's budget in the panel", 20_000);
  await checkBudget(page, "gateway:usd:day", "$1.000000");
  await checkBudget(page, "tenant:acme:usd:day", "$0.500000");
  const owner = await page.eval(`document.querySelector('#budgets tr[data-budget="tenant:acme:usd:day"] td:nth-child(2)').textContent`);
  check(owner === "tenant acme", `the tenant's budget names its owner: ${owner}`);

  const today = new Date().toISOString().slice(0, 10);
  for (const [grouping, series] of [["tenant", "acme"], ["tenant", "globex"], ["model", "gpt-4o-mini"]]) {
    const bar = `svg.spend-chart[data-grouping="${grouping}"] rect[data-series="${series}"][data-day="${today}"]`;
    await page.waitFor(`document.querySelector(${JSON.stringify(bar)}) !== null`, `today's bar of ${series} in the chart by ${grouping}`, 20_000);
    const height = await page.eval(`Number(document.querySelector(${JSON.stringify(bar)}).getAttribute('height'))`);
    check(height > 0, `${series}'s bar has a height: ${height}`);
  }
  const days = await page.eval(`document.querySelectorAll('svg.spend-chart[data-grouping="model"] text.axis').length`);
  check(days >= 7, `the chart labels the days: ${days}`);
  await page.eval(`document.getElementById('budgets-panel').scrollIntoView(); true`);
  writeFileSync(join(artifacts, "console-budgets.png"), await page.screenshot());
}
