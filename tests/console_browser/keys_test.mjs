// The console's tenants and keys panel in a real browser (docs/console.md,
// "Tenants and keys"): the tenants listed with where they come from, a key
// created in the page and shown once (copied, then gone from the page when its
// dialog closes), used for a gateway call that the panel counts, rotated in the
// page with a grace, and revoked in the page, after which the gateway refuses it;
// and a revoked key's full limit shown retired, out of the "At capacity" card.
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { admin, check, json } from "./harness.mjs";

/** A chat call through the gateway with `key`. */
function chatWith(gateway, key) {
  return json(`${gateway}/v1/chat/completions`, {
    method: "POST",
    headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/json" },
    body: JSON.stringify({ model: "gpt-4o-mini", max_tokens: 16, messages: [{ role: "user", content: "Hello, keys panel." }] }),
  });
}

/** The text of cell `cls` in the keys panel's row of key `id`, or null. */
function keyCell(id, cls) {
  const selector = `#keys tr[data-key-id="${id}"] td.${cls}`;
  return `((document.querySelector(${JSON.stringify(selector)}) || {}).textContent ?? null)`;
}

/** Nothing of `key` anywhere the page keeps things: its DOM and its storage. */
async function checkForgotten(page, key, what) {
  const kept = await page.eval(`(() => { const k = ${JSON.stringify(key)};
    const stores = [sessionStorage, localStorage].flatMap((s) => Object.keys(s).map((n) => s.getItem(n)));
    return document.documentElement.outerHTML.includes(k) || stores.some((v) => (v || '').includes(k)); })()`);
  check(!kept, `${what}: the key is gone from the page once its dialog closed`);
}

/** Reads the key shown once, copies it with the page's button, closes the dialog. */
async function takeShownKey(page, what) {
  await page.waitFor(`document.getElementById('key-shown').open`, `${what}: the dialog showing the key`);
  const key = await page.eval(`document.getElementById('key-secret').textContent`);
  check(/^rlk-/.test(key), `${what}: the key shown has the directory's prefix: ${key.slice(0, 4)}…`);
  await page.eval(`document.getElementById('key-copy').click(); true`);
  await page.waitFor(`document.getElementById('key-copied').textContent === 'Copied'`, `${what}: the copy button`);
  await page.eval(`document.getElementById('key-done').click(); true`);
  await page.waitFor(`!document.getElementById('key-shown').open`, `${what}: the dialog closed`);
  await page.waitFor(`document.getElementById('key-secret').textContent === ''`, `${what}: the dialog emptied`);
  await checkForgotten(page, key, what);
  return key;
}

export async function checkKeysPanel(page, api, gateway, artifacts) {
  // A tenant of the API beside the file's.
  const made = await admin(api, "/v1/admin/gateway/tenants", "POST", { name: "webteam", rpm: 50 });
  check(made.status === 201, `creating the tenant webteam: ${made.text}`);
  await page.waitFor(`(document.querySelector('#dir-tenants tr[data-dir-tenant="webteam"] .kind') || {}).textContent === 'api'`,
    "the API's tenant in the panel", 20_000);
  const acme = await page.eval(`document.querySelector('#dir-tenants tr[data-dir-tenant="acme"] .kind').textContent`);
  check(acme === "config", `acme comes from the file: ${acme}`);

  // Create a key in the page.
  await page.eval(`document.getElementById('key-new').click(); true`);
  await page.waitFor(`document.getElementById('key-create').open`, "the new key dialog");
  await page.eval(`document.getElementById('key-tenant').value = 'webteam';
    document.getElementById('key-name').value = 'browser-key';
    document.getElementById('key-rpm').value = 'five';
    document.getElementById('key-create-submit').click(); true`);
  await page.waitFor(`document.getElementById('key-create-error').textContent.includes('RPM')`, "a bad rpm refused in the page");
  await page.eval(`document.getElementById('key-rpm').value = '5'; document.getElementById('key-create-submit').click(); true`);
  const key = await takeShownKey(page, "created");
  const listed = await admin(api, "/v1/admin/gateway/keys?tenant=webteam");
  check(listed.status === 200 && listed.body.length === 1, `one key of webteam: ${listed.text}`);
  const id = listed.body[0].id;
  check(listed.body[0].name === "browser-key" && listed.body[0].rpm === 5, `the form's fields: ${listed.text}`);

  // The key works at the gateway, and the panel counts its call.
  const first = await chatWith(gateway, key);
  check(first.status === 200, `a call with the key made in the page: ${first.status} ${first.text}`);
  await page.waitFor(`${keyCell(id, "calls")} === '1'`, "the key's call counted in the panel", 20_000);
  const hint = await page.eval(keyCell(id, "hint"));
  check(key.endsWith(hint.slice(1)), `the hint is the key's end: ${hint}`);

  // Rotate in the page with a grace: the new key is shown once; both work during the grace.
  await page.eval(`document.querySelector('#keys tr[data-key-id="${id}"] button.rotate').click(); true`);
  await page.waitFor(`document.getElementById('key-rotate').open`, "the rotate dialog");
  await page.eval(`document.getElementById('key-grace').value = '600'; document.getElementById('key-rotate-submit').click(); true`);
  const rotated = await takeShownKey(page, "rotated");
  check(rotated !== key, "the rotation made a new key");
  check((await chatWith(gateway, rotated)).status === 200, "the new key works");
  check((await chatWith(gateway, key)).status === 200, "the old key works during its grace");
  const keys = await admin(api, "/v1/admin/gateway/keys?tenant=webteam");
  const next = keys.body.find((k) => k.id !== id);
  check(next && keys.body.find((k) => k.id === id).rotated_to === next.id, `the rotation is recorded: ${keys.text}`);

  // Revoke the new key in the page: the gateway refuses it.
  await page.waitFor(`document.querySelector('#keys tr[data-key-id="${next.id}"] button.revoke') !== null`, "the new key in the panel", 20_000);
  await page.eval(`document.querySelector('#keys tr[data-key-id="${next.id}"] button.revoke').click(); true`);
  await page.waitFor(`document.getElementById('key-revoke').open`, "the revoke dialog");
  await page.eval(`document.getElementById('key-revoke-submit').click(); true`);
  await page.waitFor(`${keyCell(next.id, "status")} === 'revoked'`, "the key shown revoked");
  const refused = await chatWith(gateway, rotated);
  check(refused.status === 401, `the revoked key is refused: ${refused.status} ${refused.text}`);
  const actions = await page.eval(`document.querySelectorAll('#keys tr[data-key-id="${next.id}"] button').length`);
  check(actions === 0, "a revoked key offers no action");
  writeFileSync(join(artifacts, "console-keys.png"), await page.screenshot());
  await checkRetired(page, api, gateway);
}

/** The "At capacity" card's count. */
const AT_CAPACITY = `Number([...document.querySelectorAll('#cards .card')].find((c) => c.querySelector('.label').textContent === 'At capacity')
  .querySelector('.value').textContent.replace(/,/g, ''))`;

/** A key whose rpm of 1 is spent counts at capacity; revoked, its limit is
 *  shown retired (grey, marked) and counts no more. */
async function checkRetired(page, api, gateway) {
  const made = await admin(api, "/v1/admin/gateway/keys", "POST", { tenant: "webteam", name: "one-a-minute", rpm: 1 });
  check(made.status === 201, `a key with rpm 1: ${made.text}`);
  const limit = `key:${made.body.id}:llm:rpm`;
  check((await chatWith(gateway, made.body.key)).status === 200, "its one call a minute");
  const row = `document.querySelector('#limits tr[data-key="${limit}"]')`;
  await page.eval(`document.getElementById('filter').value = ''; document.getElementById('filter').dispatchEvent(new Event('input')); true`);
  await page.waitFor(`${row} !== null && ${row}.querySelector('.fill').classList.contains('bad')`, "the key's full rpm limit in red", 20_000);
  const full = await page.eval(AT_CAPACITY);
  check(full >= 1, `the full limit is at capacity: ${full}`);
  const revoked = await admin(api, `/v1/admin/gateway/keys/${made.body.id}`, "DELETE");
  check(revoked.status === 200, `revoking it: ${revoked.text}`);
  await page.waitFor(`${AT_CAPACITY} === ${full - 1}`, "the revoked key's limit out of the At capacity card", 20_000);
  await page.waitFor(`${row}.classList.contains('retired') && ${row}.querySelector('.fill').classList.contains('retired')
    && ${row}.querySelector('.pill.retired').textContent === 'key revoked'`, "the revoked key's limit shown retired");
}
