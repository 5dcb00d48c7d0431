// The console's layout at an operator's laptop width (docs/console.md,
// "Tests"): at a 1400x900 window, once every panel has its data, no panel and
// no table in one is wider than what shows it (no horizontal scrolling, no box
// past the window's right edge).
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { check } from "./harness.mjs";

/** The window every panel must fit: a 14-inch laptop's browser. */
export const NARROW = { width: 1400, height: 900 };

/** What overflows in the page now: one line per box wider than its room. */
const OVERFLOWS = `JSON.stringify((() => {
  const out = [];
  const width = document.documentElement.clientWidth;
  const name = (node) => (node.id ? '#' + node.id : (node.closest('[id]') ? node.closest('[id]').id + ' ' : '') + node.className);
  if (document.documentElement.scrollWidth > width) out.push('the page: ' + document.documentElement.scrollWidth + ' px wide in ' + width);
  for (const node of document.querySelectorAll('header.top, main .cards, main .panel, main .panel .table-wrap, main .panel table')) {
    if (node.offsetParent === null) continue;
    const box = node.getBoundingClientRect();
    if (node.scrollWidth > node.clientWidth + 1 && !(node instanceof HTMLTableElement)) {
      out.push(name(node) + ': ' + node.scrollWidth + ' px of content in ' + node.clientWidth);
    }
    if (box.right > width + 0.5 || box.left < -0.5) out.push(name(node) + ': from ' + box.left + ' to ' + box.right + ' px in ' + width);
  }
  return out;
})())`;

export async function checkLayout(page, artifacts, wideSize) {
  await page.setViewport(NARROW.width, NARROW.height);
  // Two refreshes at the new width, so every table is drawn with its data.
  const refreshes = await page.eval(`window.__consoleStats.refreshes`);
  await page.waitFor(`window.__consoleStats.refreshes >= ${refreshes + 2}`, "two refreshes at 1400 px");
  const overflows = JSON.parse(await page.eval(OVERFLOWS));
  await page.eval(`window.scrollTo(0, 0); true`);
  writeFileSync(join(artifacts, "console-1400.png"), await page.fullPageScreenshot());
  await page.setViewport(wideSize.width, wideSize.height);
  check(overflows.length === 0, `every panel fits ${NARROW.width} px:\n  ${overflows.join("\n  ")}`);
}
