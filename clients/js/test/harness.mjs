// Real `stickless serve` processes for the Node tests, over the redis-server the pytest wrapper
// (tests/test_js.py) started: STICKLESS_PYTHON runs them, STICKLESS_REDIS_URL is the store, and
// every pid goes to STICKLESS_PID_FILE so the wrapper can stop what a crashed run left behind.
import { spawn } from "node:child_process";
import { appendFileSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";

const env = process.env;

/** Why these tests cannot run here (null: they can); under CI=true the caller fails instead. */
export function missing() {
  for (const name of ["STICKLESS_PYTHON", "STICKLESS_REDIS_URL"]) {
    if (!env[name]) return `${name} is not set (run through pytest tests/test_js.py)`;
  }
  return null;
}

/** Router timings of the test nodes: short, so a killed holder is found quickly (the lease at
 * the default 3 s: on a loaded machine a 2 s lease was lost by a node running a turn). */
const CONFIG = {
  lease_ttl: 3.0, lease_extend_interval: 0.5, holder_loss_sweep_interval: 0.5,
  status_heartbeat_interval: 0.5, forward_ttl: 20.0, interrupt_grace: 1.0,
};

export const NAMESPACE = `js${process.pid}x${Date.now() % 100000}`;

/** A tokens file {token: principal}, for `--tokens`. */
export function tokensFile(tokens) {
  const path = join(mkdtempSync(join(tmpdir(), "stickless-js-")), "tokens.json");
  writeFileSync(path, JSON.stringify(tokens));
  return path;
}

/** One `stickless serve` node; `start()` resolves once it printed READY. */
export class Node {
  constructor(name, { port = 0, tokens = null } = {}) {
    this.name = name;
    this.port = port;
    this.tokens = tokens;
    this.process = null;
    this.nodeId = "";
  }

  get url() { return `http://127.0.0.1:${this.port}`; }

  async start() {
    const args = ["-m", "stickless", "serve", "--redis", env.STICKLESS_REDIS_URL,
      "--namespace", NAMESPACE, "--port", String(this.port), "--node-id", this.name,
      "--grace", "1", "--config", JSON.stringify(CONFIG)];
    if (this.tokens) args.push("--tokens", this.tokens);
    const child = spawn(env.STICKLESS_PYTHON, args, { stdio: ["ignore", "pipe", "inherit"] });
    this.process = child;
    if (env.STICKLESS_PID_FILE) appendFileSync(env.STICKLESS_PID_FILE, `${child.pid}\n`);
    const exited = new Promise((resolve) => child.once("exit", resolve));
    this.exited = exited;
    const lines = createInterface({ input: child.stdout });
    const ready = new Promise((resolve, reject) => {
      lines.once("line", resolve);
      exited.then((code) => reject(new Error(`${this.name} exited (${code}) before READY`)));
    });
    const line = await ready;
    const [word, port, nodeId] = line.split(" ");
    if (word !== "READY") throw new Error(`${this.name}: ${line}`);
    this.port = Number(port);
    this.nodeId = nodeId;
    return this;
  }

  /** Stop the process (SIGTERM: a graceful close; SIGKILL: a crash) and wait for it. */
  async stop(signal = "SIGTERM") {
    if (this.process === null || this.process.exitCode !== null ||
        this.process.signalCode !== null) return;
    this.process.kill(signal);
    await this.exited;
  }
}
