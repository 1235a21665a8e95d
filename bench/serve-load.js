// `dki serve` under load: 1 / 8 / 32 concurrent users streaming chat completions against a server
// in its own process (node bin/dki.js serve), from this process. Per shape and concurrency: time
// to first token (p50/p95, from the request to the first content chunk), tokens/s over the run,
// turns answered, 429s (the queue bound) and any other errors. And the server's own cost per
// request: the client's wall time of a non-streamed turn less the turn's chat() time the server
// reports (dki.latency.total_ms), i.e. HTTP, JSON, schema, auth and routing.
//
// The load comes from a small client here rather than autocannon or wrk: those time whole
// responses, and a streamed turn's time to first token is the figure that matters.
//
// Usage: node bench/serve-load.js [--quick] [--presets tiny,smollm2-135m]
import { spawn } from "node:child_process";
import { Agent, request as httpRequest } from "node:http";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir, loadavg } from "node:os";
import { join } from "node:path";
import { native } from "../dist/src/index.js";
import { MemoryStore } from "../dist/src/memory/index.js";
import { packageRoot } from "../dist/src/engine/native.js";
import { machine } from "./lib/machine.js";
import { benchModel } from "./lib/models.js";
import { writeLinePlot } from "./lib/plot.js";
import { writeResults } from "./lib/results.js";

const quick = process.argv.includes("--quick");
const presetArg = process.argv.find((a, i) => process.argv[i - 1] === "--presets");
const presets = presetArg ? presetArg.split(",") : ["tiny", "smollm2-135m"];
const LEVELS = [1, 8, 32];
/** Turns each user sends at a concurrency level: the runs stay bounded in count (and so in time). */
const turnsPerUser = (c) => (quick ? { 1: 5, 8: 2, 32: 1 } : { 1: 12, 8: 4, 32: 2 })[c];
const MAX_TOKENS = 16;
const MAX_QUEUE = 16;
const OVERHEAD_TURNS = quick ? 10 : 40;
const QUERY = "What do you remember about my hiking trips and my allergies?";

const quantile = (xs, q) => {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))];
};

async function makeStore(users) {
  const dir = join(mkdtempSync(join(tmpdir(), "dki-serve-bench-")), "data");
  const store = await MemoryStore.open({ dir });
  for (let u = 0; u < users; u++) {
    await store.memories.add(`User ${u} loves hiking in the Alps every summer.`, { userId: `u${u}` });
    await store.memories.add(`User ${u} is allergic to peanuts and cashews.`, { userId: `u${u}` });
    await store.memories.add(`User ${u} plays the cello in a quartet on Sundays.`, { userId: `u${u}` });
  }
  await store.close();
  return dir;
}

function startServer(model, data) {
  const child = spawn(process.execPath, [join(packageRoot(), "bin", "dki.js"), "serve", "--model", model, "--data", data, "--port", "0", "--no-log", "--max-queue", String(MAX_QUEUE), "--context-size", "1024"], { stdio: ["ignore", "ignore", "pipe"] });
  let err = "";
  return new Promise((resolve, reject) => {
    child.stderr.on("data", (d) => {
      err += d.toString();
      const url = /listening on (http:\/\/\S+)/.exec(err)?.[1];
      if (url && err.includes("dki: ready")) resolve({ child, url });
    });
    child.on("exit", (code) => reject(new Error(`dki serve exited (${code}):\n${err}`)));
  });
}

/** One streamed turn: its TTFT (first content chunk), tokens and status. */
async function streamedTurn(url, model, user, session) {
  const t0 = performance.now();
  const r = await fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model, user, max_tokens: MAX_TOKENS, stream: true, messages: [{ role: "user", content: QUERY }], dki: { session } }),
  });
  if (r.status !== 200) {
    const retryAfter = Number(r.headers.get("retry-after") ?? "1");
    await r.text();
    return { status: r.status, retryAfter };
  }
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  let ttft = null;
  let tokens = 0;
  let done = false;
  for (;;) {
    const { value, done: end } = await reader.read();
    if (end) break;
    buf += decoder.decode(value, { stream: true });
    for (let i = buf.indexOf("\n\n"); i >= 0; i = buf.indexOf("\n\n")) {
      const data = buf.slice(6, i);
      buf = buf.slice(i + 2);
      if (data === "[DONE]") {
        done = true;
        continue;
      }
      const chunk = JSON.parse(data);
      if (chunk.error) return { status: 500, error: chunk.error.message };
      if (ttft === null && chunk.choices[0]?.delta?.content) ttft = performance.now() - t0;
      if (chunk.usage) tokens = chunk.usage.completion_tokens;
    }
  }
  return done ? { status: 200, ttft: ttft ?? performance.now() - t0, tokens, ms: performance.now() - t0 } : { status: 500, error: "stream ended without [DONE]" };
}

async function loadLevel(url, model, c) {
  const turns = turnsPerUser(c);
  const results = [];
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: c }, async (_, u) => {
      for (let t = 0; t < turns; t++) {
        const r = await streamedTurn(url, model, `u${u}`, `c${c}-u${u}-t${t}`);
        results.push(r);
        // A refused turn is counted, not retried; the user waits as told before its next one.
        if (r.status === 429 && t < turns - 1) await new Promise((res) => setTimeout(res, r.retryAfter * 1000));
      }
    }),
  );
  const wallS = (performance.now() - t0) / 1000;
  const ok = results.filter((r) => r.status === 200);
  return {
    users: c,
    turns: results.length,
    answered: ok.length,
    "429s": results.filter((r) => r.status === 429).length,
    "other errors": results.filter((r) => r.status !== 200 && r.status !== 429).length,
    "TTFT p50 ms": quantile(ok.map((r) => r.ttft), 0.5),
    "TTFT p95 ms": quantile(ok.map((r) => r.ttft), 0.95),
    "turn p50 ms": quantile(ok.map((r) => r.ms), 0.5),
    // Over the run's wall time, Retry-After waits included.
    "tokens/s": ok.reduce((n, r) => n + r.tokens, 0) / wallS,
    "wall s": wallS,
  };
}

/** A non-streamed request over a kept-alive connection with node:http (a lean client: undici's fetch adds its own ~1 ms). */
function postJson(agent, url, body) {
  return new Promise((resolve, reject) => {
    const req = httpRequest(`${url}/v1/chat/completions`, { method: "POST", agent, headers: { "content-type": "application/json" } }, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (d) => (text += d));
      res.on("end", () => resolve({ status: res.statusCode, body: JSON.parse(text) }));
    });
    req.on("error", reject);
    req.end(JSON.stringify(body));
  });
}

/** The server's cost per request: client wall time of a non-streamed turn less the chat() time the server reports. */
async function overhead(url, model) {
  const agent = new Agent({ keepAlive: true, maxSockets: 1 });
  const extra = [];
  for (let t = 0; t < OVERHEAD_TURNS; t++) {
    const t0 = performance.now();
    const r = await postJson(agent, url, { model, user: "u0", max_tokens: 4, messages: [{ role: "user", content: QUERY }], dki: { session: `overhead-${t}` } });
    const wall = performance.now() - t0;
    if (r.status !== 200) throw new Error(`overhead turn: ${r.status} ${JSON.stringify(r.body)}`);
    if (t >= 2) extra.push(wall - r.body.dki.latency.total_ms); // the first turns warm the blocks and the JIT
  }
  agent.destroy();
  return { p50: quantile(extra, 0.5), p95: quantile(extra, 0.95) };
}

const loadAtStart = loadavg()[0];
const rows = [];
const overheads = [];
const points = [];
for (const preset of presets) {
  const model = await benchModel(preset, "f16");
  const data = await makeStore(Math.max(...LEVELS));
  // The served model's id is its folder's name.
  const id = model.split("/").pop();
  const { child, url } = await startServer(model, data);
  try {
    const o = await overhead(url, id);
    overheads.push({ shape: preset, ...o });
    for (const c of LEVELS) {
      const row = { shape: preset, ...(await loadLevel(url, id, c)) };
      rows.push(row);
      points.push({ x: c, y: row["TTFT p50 ms"], series: `${preset} p50` }, { x: c, y: row["TTFT p95 ms"], series: `${preset} p95` });
      process.stderr.write(`${preset} ${c} users: ${JSON.stringify(row)}\n`);
    }
  } finally {
    child.kill("SIGTERM");
    await new Promise((r) => child.once("exit", r));
    rmSync(join(data, ".."), { recursive: true, force: true });
  }
}

const plot = await writeLinePlot(`serve-load-cpu-ttft${quick ? "-quick" : ""}`, { rows: points, title: "dki serve: time to first token by concurrent streaming users", x: "concurrent users (symlog)", y: "TTFT ms (log)", series: "shape, percentile" });
writeResults("serve-load-cpu", {
  machine: machine(native()),
  rows,
  columns: ["shape", "users", "turns", "answered", "429s", "other errors", "TTFT p50 ms", "TTFT p95 ms", "turn p50 ms", "tokens/s", "wall s"],
  notes: [
    `Random F16 weights (make-tiny presets), context 1024, ${MAX_TOKENS} answer tokens a turn, 3 memories a user injected as K/V (DKI mode), --max-queue ${MAX_QUEUE}; the server in its own process, the load from this one; each user sends its turns one after another, a new session each.`,
    `Turns per user: ${LEVELS.map((c) => `${c} users × ${turnsPerUser(c)}`).join(", ")}. A 429 is counted and not retried; the user waits its Retry-After before its next turn.`,
    `Server cost per request (client wall time of a non-streamed 4-token turn, node:http over a kept-alive connection, less the chat() time the server reports, ${OVERHEAD_TURNS - 2} turns): ${overheads.map((o) => `${o.shape} p50 ${o.p50.toFixed(2)} ms, p95 ${o.p95.toFixed(2)} ms`).join("; ")} (target ≤ 2 ms).`,
    `Load average at the start: ${loadAtStart.toFixed(2)}. Plot: ${plot.png.split("/").pop()}.`,
  ],
});
