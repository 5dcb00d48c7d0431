// What the console's browser test and benchmark share: free ports, the
// simulated provider and ratelimiterd started as child processes from the
// binaries scripts/browser-test.sh built, and small HTTP helpers.
import { spawn } from "node:child_process";
import { createServer } from "node:net";
import { openSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { randomBytes } from "node:crypto";

/** The admin token of every test server (at least 16 bytes, as the server requires). */
export const ADMIN_TOKEN = "console-admin-token-0123456789";
/** The key the gateway sends upstream; the page must never see it. */
export const UPSTREAM_KEY = "sk-console-upstream-key-abcdef0123";
/** Tenant keys; the page must never see them either. */
export const TENANT_KEYS = { acme: "acme-gateway-key-0123456789abcdef", globex: "globex-gateway-key-0123456789abcd" };
/** How long a process may take to start. */
const START_TIMEOUT_MS = 60_000;

export function binary(name) {
  const path = process.env[name];
  if (!path) throw new Error(`${name} is not set (scripts/browser-test.sh sets it)`);
  return path;
}

export function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.on("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Starts `command`, logging to `log`; stopped by `stopAll`. */
const children = [];
function start(command, args, log, env = {}) {
  const out = openSync(log, "w");
  const child = spawn(command, args, { stdio: ["ignore", out, out], env: { ...process.env, ...env } });
  children.push(child);
  return child;
}

export async function stopAll() {
  for (const child of children.reverse()) {
    if (child.exitCode !== null) continue;
    child.kill("SIGTERM");
    const exited = new Promise((resolve) => child.once("exit", resolve));
    await Promise.race([exited, sleep(10_000)]);
    if (child.exitCode === null) child.kill("SIGKILL");
  }
}

/** provider-sim on a free port; returns its base URL. */
export async function startSim(dir) {
  const log = join(dir, "provider-sim.log");
  const child = start(binary("PROVIDER_SIM_BIN"), [
    "--listen", "127.0.0.1:0", "--rpm", "1000000", "--tpm", "1000000000", "--concurrency", "256",
    "--ms-per-output-token", "1", "--api-key-env", "SIM_UPSTREAM_KEY",
  ], log, { SIM_UPSTREAM_KEY: UPSTREAM_KEY });
  const deadline = Date.now() + START_TIMEOUT_MS;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error("provider-sim exited: " + readFileSync(log, "utf8"));
    const found = /serving on (http:\/\/\S+)/.exec(readFileSync(log, "utf8"));
    if (found) return found[1];
    await sleep(50);
  }
  throw new Error("provider-sim did not start in time");
}

/** ratelimiterd with `yaml` as its configuration; waits for /healthz. */
export async function startServer(dir, yaml, apiPort, env = {}) {
  const config = join(dir, "ratelimiterd.yaml");
  writeFileSync(config, yaml);
  const log = join(dir, "ratelimiterd.log");
  const child = start(binary("RATELIMITERD_BIN"), ["--config", config], log, {
    SIM_UPSTREAM_KEY: UPSTREAM_KEY,
    ACME_GATEWAY_KEY: TENANT_KEYS.acme,
    GLOBEX_GATEWAY_KEY: TENANT_KEYS.globex,
    ...env,
  });
  const deadline = Date.now() + START_TIMEOUT_MS;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error("ratelimiterd exited: " + readFileSync(log, "utf8"));
    try {
      if ((await fetch(`http://127.0.0.1:${apiPort}/healthz`)).ok) return log;
    } catch (_) {
      // Not listening yet.
    }
    await sleep(50);
  }
  throw new Error("ratelimiterd did not start in time: " + readFileSync(log, "utf8"));
}

const CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
/** A new ULID: 48 bits of milliseconds, 80 random bits. */
export function ulid() {
  let time = Date.now();
  let head = "";
  for (let i = 0; i < 10; i++) {
    head = CROCKFORD[time % 32] + head;
    time = Math.floor(time / 32);
  }
  const random = randomBytes(16);
  let tail = "";
  for (let i = 0; i < 16; i++) tail += CROCKFORD[random[i] % 32];
  return head + tail;
}

export async function json(url, options = {}) {
  const response = await fetch(url, options);
  const text = await response.text();
  let body = null;
  try {
    body = JSON.parse(text);
  } catch (_) {
    body = text;
  }
  return { status: response.status, headers: response.headers, body, text };
}

export function admin(api, path, method = "GET", body = undefined, token = ADMIN_TOKEN) {
  const headers = { Authorization: `Bearer ${token}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  return json(`${api}${path}`, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
}

export function check(condition, message) {
  if (!condition) throw new Error("check failed: " + message);
}
