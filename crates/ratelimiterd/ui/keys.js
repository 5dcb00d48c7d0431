// ratelimiterd console, the tenants and keys panel: reads GET /ui/api/directory
// and changes keys through the admin API (/v1/admin/gateway/keys), with the
// admin token and JSON bodies as every change of the console. A new key's text
// comes only in the 201 that made it: it is written into the dialog that shows
// it, and erased from the page when the dialog closes; no variable keeps it.
// Uses shared.js's helpers ($, el, num, compact, perSpan, loaded) and console.js's
// (api, errorText, toast, view).
"use strict";

// How often the panel is read: keys change by hand, not every second.
const DIRECTORY_REFRESH_MS = 5000;
const KEYS_PAGE = 50;

const keysView = { offset: 0, tenant: "", lastRead: 0, reading: false, tenants: [], rotating: null, revoking: null };

function directoryUrl() {
  const q = new URLSearchParams({ offset: keysView.offset, count: KEYS_PAGE });
  if (keysView.tenant) q.set("tenant", keysView.tenant);
  return "/ui/api/directory?" + q.toString();
}

// Called by console.js after each render of the state: reads the panel when due.
function directoryTick() {
  if (Date.now() - keysView.lastRead >= DIRECTORY_REFRESH_MS) readDirectory();
}

async function readDirectory() {
  if (keysView.reading) return;
  keysView.reading = true;
  keysView.lastRead = Date.now();
  try {
    const response = await api(directoryUrl());
    if (response.status === 401) {
      sessionStorage.removeItem(TOKEN_KEY);
      showLogin("The token was refused.");
      return;
    }
    if (!response.ok) throw new Error(await errorText(response));
    $("keys-error").hidden = true;
    renderDirectory(await response.json());
    loaded("keys-panel");
  } catch (e) {
    $("keys-error").hidden = false;
    $("keys-error").textContent = "The tenants and keys could not be read: " + e.message;
    loadFailed("keys-panel", [$("dir-tenants").tBodies[0], $("keys").tBodies[0]]);
  } finally {
    keysView.reading = false;
  }
}

function readDirectoryNow() {
  keysView.lastRead = 0;
  readDirectory();
}

function limitsText(o) {
  const parts = [];
  if (o.rpm !== null && o.rpm !== undefined) parts.push(`${num(o.rpm)} rpm`);
  if (o.concurrency !== null && o.concurrency !== undefined) parts.push(`${num(o.concurrency)} at once`);
  if (o.daily_tokens !== null && o.daily_tokens !== undefined) parts.push(`${compact(o.daily_tokens)} tokens/day`);
  if (o.budgets && o.budgets.length) parts.push(budgetsText(o.budgets));
  return parts.length ? parts.join(" · ") : "—";
}

// A record's budgets as written (`usd` in dollars, a period or a window):
// "$500.00 / month, $40.00 / day".
function budgetsText(budgets) {
  if (!budgets || !budgets.length) return "—";
  return budgets.map((b) => perSpan(Math.round(b.usd * MICRO_USD_PER_USD), b.period, b.window_seconds)).join(", ");
}

function when(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  return new Date(seconds * 1000).toISOString().replace("T", " ").slice(0, 16) + " UTC";
}

function renderDirectory(data) {
  keysView.tenants = data.tenants.rows;
  $("keys-note").textContent = data.tenants.total > data.tenants.rows.length
    ? `${data.tenants.rows.length} of ${num(data.tenants.total)} tenants shown` : `${num(data.tenants.total)} tenants`;
  const tenantRows = data.tenants.rows.map((t) => el("tr", { "data-dir-tenant": t.name },
    el("td", { class: "key", text: t.name }),
    el("td", {}, el("span", { class: "kind", text: t.source })),
    el("td", { text: t.class || "—" }),
    el("td", { class: "num", text: num(t.rpm) }),
    el("td", { class: "num", text: num(t.concurrency) }),
    el("td", { class: "num", text: t.daily_tokens === null ? "—" : compact(t.daily_tokens) }),
    el("td", { class: "budgets small", text: budgetsText(t.budgets) }),
    el("td", { class: "muted", text: t.models ? t.models.join(", ") : "all" })));
  $("dir-tenants").tBodies[0].replaceChildren(...(tenantRows.length ? tenantRows
    : [el("tr", {}, el("td", { class: "empty", colspan: 8, text: "No tenants: add one in gateway.tenants or with the admin API." }))]));
  renderTenantChoice();
  renderKeys(data.keys);
}

// The keys' tenant filter: every tenant listed, the choice kept.
function renderTenantChoice() {
  const select = $("keys-tenant");
  const options = [el("option", { value: "", text: "all tenants" }),
    ...keysView.tenants.map((t) => el("option", { value: t.name, text: t.name }))];
  select.replaceChildren(...options);
  select.value = keysView.tenant;
}

function keyActions(k) {
  if (k.status !== "active") return null;
  return [
    el("button", { type: "button", class: "ghost rotate", onclick: () => openRotate(k) }, "Rotate"),
    el("button", { type: "button", class: "ghost revoke", onclick: () => openRevoke(k) }, "Revoke"),
  ];
}

function renderKeys(keys) {
  const shown = keys.rows.length;
  $("keys-count").textContent = `${num(keys.matched)} keys` + (keys.tenant ? ` of ${keys.tenant}` : "");
  $("keys-page").textContent = shown ? `${num(keys.offset + 1)}–${num(keys.offset + shown)} of ${num(keys.matched)}, newest first` : "";
  $("keys-prev").disabled = keys.offset === 0;
  $("keys-next").disabled = keys.offset + shown >= keys.matched;
  const rows = keys.rows.map((k) => {
    const fleet = k.tokens_today_from === "fleet_daily_limit";
    return el("tr", { "data-key-id": k.id, class: k.status },
      el("td", { class: "key", title: k.id }, k.name || "(no name)", el("span", { class: "muted", text: " · " + k.id })),
      el("td", { class: "tenant", text: k.tenant }),
      el("td", { class: "muted", text: k.models ? k.models.join(", ") : "tenant's" }),
      el("td", { class: "hint", text: k.hint }),
      el("td", { class: "muted small", text: limitsText(k) }),
      el("td", { class: "small", text: when(k.created_at) }),
      el("td", { class: "small", text: k.expires_at ? when(k.expires_at) : "never" }),
      el("td", { class: "status" }, el("span", { class: "pill " + (k.status === "active" ? "ok" : k.status), text: k.status })),
      el("td", { class: "num calls", text: num(k.calls_today) }),
      el("td", { class: "num tokens", title: fleet ? "fleet-wide, rolling day (its daily_tokens limit)" : "this server, since 00:00 UTC",
        text: compact(k.tokens_today) + (fleet ? " *" : "") }),
      el("td", { class: "actions" }, ...(keyActions(k) || [])));
  });
  $("keys").tBodies[0].replaceChildren(...(rows.length ? rows
    : [el("tr", {}, el("td", { class: "empty", colspan: 11, text: "No keys yet: New key makes one." }))]));
}

// ---------- changes ----------

// A change's answer: its JSON, or an Error with the server's message (a
// refused token sends the page back to sign-in).
async function change(path, method, body) {
  const response = await api(path, { method, headers: { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body) });
  if (response.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin("The token was refused.");
    throw new Error("The token was refused.");
  }
  if (!response.ok) throw new Error(await errorText(response));
  return response.json();
}

// A whole number of a form field, or undefined when empty; throws naming the field.
function wholeOrNone(id, label) {
  const raw = $(id).value.trim();
  if (raw === "") return undefined;
  if (!/^\d+$/.test(raw)) throw new Error(`${label} is a whole number.`);
  return Number(raw);
}

function openCreate() {
  const select = $("key-tenant");
  select.replaceChildren(...keysView.tenants.map((t) => el("option", { value: t.name, text: `${t.name} (${t.source})` })));
  if (keysView.tenant) select.value = keysView.tenant;
  for (const id of ["key-name", "key-models", "key-expires", "key-rpm", "key-concurrency", "key-daily-tokens"]) $(id).value = "";
  $("key-create-error").textContent = keysView.tenants.length ? "" : "No tenant to make a key for.";
  $("key-create-submit").disabled = keysView.tenants.length === 0;
  $("key-create").showModal();
}

async function submitCreate(event) {
  event.preventDefault();
  $("key-create-error").textContent = "";
  try {
    const body = { tenant: $("key-tenant").value };
    const name = $("key-name").value.trim();
    if (name) body.name = name;
    const models = $("key-models").value.split(",").map((m) => m.trim()).filter((m) => m);
    if (models.length) body.models = models;
    for (const [id, field, label] of [["key-expires", "expires_in_seconds", "Expires in"], ["key-rpm", "rpm", "RPM"],
      ["key-concurrency", "concurrency", "Concurrency"], ["key-daily-tokens", "daily_tokens", "Daily tokens"]]) {
      const value = wholeOrNone(id, label);
      if (value !== undefined) body[field] = value;
    }
    $("key-create-submit").disabled = true;
    const created = await change("/v1/admin/gateway/keys", "POST", body);
    $("key-create").close();
    showKeyOnce(created, `Key ${created.id} of ${created.tenant}` + (created.name ? ` (${created.name})` : ""));
  } catch (e) {
    $("key-create-error").textContent = e.message;
  } finally {
    $("key-create-submit").disabled = false;
  }
}

function openRotate(k) {
  keysView.rotating = k.id;
  $("key-rotate-id").textContent = `${k.name || "(no name)"} · ${k.id}`;
  $("key-grace").value = "0";
  $("key-rotate-error").textContent = "";
  $("key-rotate").showModal();
}

async function submitRotate(event) {
  event.preventDefault();
  $("key-rotate-error").textContent = "";
  try {
    const grace = wholeOrNone("key-grace", "The grace") || 0;
    $("key-rotate-submit").disabled = true;
    const created = await change(`/v1/admin/gateway/keys/${encodeURIComponent(keysView.rotating)}/rotate`, "POST", { grace_seconds: grace });
    $("key-rotate").close();
    const until = created.replaces.expires_at ? `until ${when(created.replaces.expires_at)}` : "no longer";
    showKeyOnce(created, `Key ${created.id} replaces ${created.replaces.id}, which works ${until}.`);
  } catch (e) {
    $("key-rotate-error").textContent = e.message;
  } finally {
    $("key-rotate-submit").disabled = false;
  }
}

function openRevoke(k) {
  keysView.revoking = k.id;
  $("key-revoke-id").textContent = `${k.name || "(no name)"} · ${k.id}`;
  $("key-revoke-error").textContent = "";
  $("key-revoke").showModal();
}

async function submitRevoke(event) {
  event.preventDefault();
  $("key-revoke-error").textContent = "";
  try {
    $("key-revoke-submit").disabled = true;
    const revoked = await change(`/v1/admin/gateway/keys/${encodeURIComponent(keysView.revoking)}`, "DELETE");
    $("key-revoke").close();
    toast(`Key ${revoked.id} revoked`);
    readDirectoryNow();
  } catch (e) {
    $("key-revoke-error").textContent = e.message;
  } finally {
    $("key-revoke-submit").disabled = false;
  }
}

// ---------- the key, shown once ----------

function showKeyOnce(created, about) {
  $("key-secret").textContent = created.key;
  $("key-shown-about").textContent = about;
  $("key-copied").textContent = "";
  $("key-shown").showModal();
  readDirectoryNow();
}

async function copyKey() {
  const text = $("key-secret").textContent;
  try {
    await navigator.clipboard.writeText(text);
  } catch (_) {
    // Without the clipboard API (a page not served from loopback over plain HTTP): select and copy.
    const range = document.createRange();
    range.selectNodeContents($("key-secret"));
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    document.execCommand("copy");
  }
  $("key-copied").textContent = "Copied";
}

// The key leaves the page with its dialog, however the dialog closes (Done, Escape).
function forgetKey() {
  $("key-secret").textContent = "";
  $("key-copied").textContent = "";
  window.getSelection().removeAllRanges();
}

function wireKeys() {
  $("key-new").addEventListener("click", openCreate);
  $("key-create-form").addEventListener("submit", submitCreate);
  $("key-create-cancel").addEventListener("click", () => $("key-create").close());
  $("key-rotate-form").addEventListener("submit", submitRotate);
  $("key-rotate-cancel").addEventListener("click", () => $("key-rotate").close());
  $("key-revoke-form").addEventListener("submit", submitRevoke);
  $("key-revoke-cancel").addEventListener("click", () => $("key-revoke").close());
  $("key-copy").addEventListener("click", copyKey);
  $("key-done").addEventListener("click", () => {
    forgetKey();
    $("key-shown").close();
  });
  $("key-shown").addEventListener("close", forgetKey);
  $("keys-tenant").addEventListener("change", () => {
    keysView.tenant = $("keys-tenant").value;
    keysView.offset = 0;
    readDirectoryNow();
  });
  $("keys-prev").addEventListener("click", () => {
    keysView.offset = Math.max(0, keysView.offset - KEYS_PAGE);
    readDirectoryNow();
  });
  $("keys-next").addEventListener("click", () => {
    keysView.offset += KEYS_PAGE;
    readDirectoryNow();
  });
}

wireKeys();
if (!$("console").hidden) readDirectoryNow();
