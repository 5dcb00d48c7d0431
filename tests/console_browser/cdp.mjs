// A minimal Chrome DevTools Protocol client over --remote-debugging-pipe
// (fd 3: commands to the browser, fd 4: its answers, NUL-terminated JSON), so
// the console's browser test needs Node and Debian's chromium only: no npm
// package, no download.
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

/** The flags of every run: headless, no network of its own, a fresh profile. */
export const CHROMIUM_FLAGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--disable-dev-shm-usage",
  "--remote-debugging-pipe",
];

/** How long one protocol command may take before the test fails. */
const COMMAND_TIMEOUT_MS = 30_000;

export class Browser {
  static async launch(binary = process.env.CHROMIUM_BIN || "/usr/bin/chromium", windowSize = "1600,1000") {
    const profile = mkdtempSync(join(tmpdir(), "console-chromium-"));
    const child = spawn(binary, [...CHROMIUM_FLAGS, `--user-data-dir=${profile}`, `--window-size=${windowSize}`, "about:blank"], {
      stdio: ["ignore", "ignore", "pipe", "pipe", "pipe"],
    });
    let stderr = "";
    child.stderr.on("data", (d) => (stderr = (stderr + d).slice(-4000)));
    const browser = new Browser(child, profile, () => stderr);
    await browser.send("Target.setDiscoverTargets", { discover: true });
    return browser;
  }

  constructor(child, profile, stderr) {
    this.child = child;
    this.profile = profile;
    this.stderr = stderr;
    this.nextId = 1;
    this.pending = new Map();
    this.listeners = [];
    this.buffer = Buffer.alloc(0);
    child.stdio[4].on("data", (chunk) => this.receive(chunk));
    child.on("exit", (code) => {
      for (const { reject } of this.pending.values()) reject(new Error(`chromium exited (${code}): ${stderr()}`));
      this.pending.clear();
    });
  }

  receive(chunk) {
    this.buffer = Buffer.concat([this.buffer, chunk]);
    let end;
    while ((end = this.buffer.indexOf(0)) >= 0) {
      const message = JSON.parse(this.buffer.subarray(0, end).toString("utf8"));
      this.buffer = this.buffer.subarray(end + 1);
      if (message.id !== undefined && this.pending.has(message.id)) {
        const { resolve, reject, timer } = this.pending.get(message.id);
        clearTimeout(timer);
        this.pending.delete(message.id);
        if (message.error) reject(new Error(`${message.error.message} (${message.error.code})`));
        else resolve(message.result);
      } else if (message.method) {
        for (const listener of this.listeners) listener(message);
      }
    }
  }

  send(method, params = {}, sessionId = undefined) {
    const id = this.nextId++;
    const message = { id, method, params };
    if (sessionId) message.sessionId = sessionId;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new Error(`${method} took longer than ${COMMAND_TIMEOUT_MS} ms`));
      }, COMMAND_TIMEOUT_MS);
      this.pending.set(id, { resolve, reject, timer });
      this.child.stdio[3].write(JSON.stringify(message) + "\0");
    });
  }

  /** A new tab, attached, with Page and Runtime enabled. */
  async newPage(width = 1600, height = 1000) {
    const { targetId } = await this.send("Target.createTarget", { url: "about:blank" });
    const { sessionId } = await this.send("Target.attachToTarget", { targetId, flatten: true });
    const page = new Page(this, sessionId);
    await page.send("Page.enable");
    await page.send("Runtime.enable");
    await page.send("Emulation.setDeviceMetricsOverride", { width, height, deviceScaleFactor: 1, mobile: false });
    return page;
  }

  async close() {
    try {
      await this.send("Browser.close");
    } catch (_) {
      // Already gone.
    }
    const exited = new Promise((resolve) => this.child.once("exit", resolve));
    const timeout = new Promise((resolve) => setTimeout(resolve, 5_000));
    await Promise.race([exited, timeout]);
    if (this.child.exitCode === null) this.child.kill("SIGKILL");
    rmSync(this.profile, { recursive: true, force: true });
  }
}

export class Page {
  constructor(browser, sessionId) {
    this.browser = browser;
    this.sessionId = sessionId;
    this.errors = [];
    browser.listeners.push((message) => {
      if (message.sessionId !== sessionId) return;
      if (message.method === "Runtime.exceptionThrown") {
        this.errors.push(message.params.exceptionDetails.exception?.description || message.params.exceptionDetails.text);
      }
      if (message.method === "Runtime.consoleAPICalled" && message.params.type === "error") {
        this.errors.push(message.params.args.map((a) => a.value ?? a.description).join(" "));
      }
    });
  }

  send(method, params = {}) {
    return this.browser.send(method, params, this.sessionId);
  }

  async goto(url) {
    const loaded = new Promise((resolve) => {
      const listener = (message) => {
        if (message.sessionId === this.sessionId && message.method === "Page.loadEventFired") {
          this.browser.listeners.splice(this.browser.listeners.indexOf(listener), 1);
          resolve();
        }
      };
      this.browser.listeners.push(listener);
    });
    await this.send("Page.navigate", { url });
    await loaded;
  }

  /** Evaluates `expression` in the page and returns its value (awaiting a promise). */
  async eval(expression) {
    const { result, exceptionDetails } = await this.send("Runtime.evaluate", {
      expression,
      awaitPromise: true,
      returnByValue: true,
    });
    if (exceptionDetails) throw new Error(`${expression}: ${exceptionDetails.exception?.description || exceptionDetails.text}`);
    return result.value;
  }

  /** Polls `expression` until it is truthy; fails with `what` after `timeoutMs`. */
  async waitFor(expression, what, timeoutMs = 15_000) {
    const deadline = Date.now() + timeoutMs;
    let last;
    while (Date.now() < deadline) {
      last = await this.eval(expression);
      if (last) return last;
      await new Promise((r) => setTimeout(r, 100));
    }
    throw new Error(`timed out waiting for ${what} (last value: ${JSON.stringify(last)})`);
  }

  /** The window's size in CSS pixels, as a smaller screen would give it. */
  async setViewport(width, height) {
    await this.send("Emulation.setDeviceMetricsOverride", { width, height, deviceScaleFactor: 1, mobile: false });
  }

  async screenshot() {
    const { data } = await this.send("Page.captureScreenshot", { format: "png", captureBeyondViewport: true });
    return Buffer.from(data, "base64");
  }

  /** The whole document at the window's width, not only what the window shows
   *  (how docs/console.png is taken: every panel in one picture). */
  async fullPageScreenshot() {
    const metrics = await this.send("Page.getLayoutMetrics");
    // cssContentSize is in CSS pixels; older Chromium has only contentSize.
    const size = metrics.cssContentSize || metrics.contentSize;
    const clip = { x: 0, y: 0, width: Math.ceil(size.width), height: Math.ceil(size.height), scale: 1 };
    const { data } = await this.send("Page.captureScreenshot", { format: "png", captureBeyondViewport: true, clip });
    return Buffer.from(data, "base64");
  }
}
