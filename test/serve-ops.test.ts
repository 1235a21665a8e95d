// `dki serve`'s operations, on real servers in this process: /health (503 while the model loads),
// Prometheus metrics, the bounded queue's 429 with Retry-After, a client that disconnects
// aborting its own turn only (nothing recorded), and bad requests answered with clean 4xx errors:
// malformed JSON, an oversized body, invalid UTF-8, unknown fields, huge max_tokens.
import { request as httpRequest, type IncomingMessage } from "node:http";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { createServer } from "../src/server/app.js";
import { ServerSystems } from "../src/server/systems.js";
import { tempDir } from "./support/paths.js";
import { call, makeTinyModel, readSse, startServer, type Running, storeWithAlice } from "./support/serve.js";

let model: string;
let data: string;
const LONG = 3500; // answer tokens: a turn of a few seconds on the tiny model, long enough to act on mid-stream

beforeAll(async () => {
  model = await makeTinyModel();
  data = await storeWithAlice();
});

/** A metric's value in a Prometheus text exposition (0 when absent). */
function metric(text: string, name: string, labels = ""): number {
  const line = text.split("\n").find((l) => l.startsWith(`${name}${labels} `) || (labels === "" && l.startsWith(`${name} `)));
  return line === undefined ? 0 : Number(line.split(" ").pop());
}

async function waitFor(what: string, ok: () => Promise<boolean>): Promise<void> {
  for (let i = 0; i < 400; i++) {
    if (await ok()) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`timed out waiting for ${what}`);
}

describe("dki serve: health and metrics", () => {
  test("/health is 503 while the model loads and routes answer 503 with Retry-After; then 200 with model, device and uptime", async () => {
    const server = createServer();
    const url = await server.app.listen({ host: "127.0.0.1", port: 0 });
    try {
      const loading = await call(url, "GET", "/health");
      expect(loading.status).toBe(503);
      expect(loading.json).toMatchObject({ status: "loading" });
      const chat = await call(url, "POST", "/v1/chat/completions", { body: { model: "tiny", messages: [{ role: "user", content: "hi" }] } });
      expect(chat.status).toBe(503);
      expect(chat.headers.get("retry-after")).toBe("1");
      expect(chat.json).toMatchObject({ error: { type: "service_unavailable", code: "loading" } });
      server.ready(await ServerSystems.open({ model, loadOptions: { threads: 1 }, dataDir: data }));
      const ok = await call(url, "GET", "/health");
      expect(ok.status).toBe(200);
      expect(ok.json).toMatchObject({ status: "ok", model: "tiny", device: "cpu", embedder: "hashing-v1-d512" });
      expect((ok.json as { uptime_s: number }).uptime_s).toBeGreaterThan(0);
    } finally {
      await server.close();
    }
  });

  test("/metrics: requests, errors, TTFT and latency histograms, tokens, K/V blocks by tier, queue depth", async () => {
    const r = await startServer(model, data);
    try {
      for (let i = 0; i < 2; i++) {
        const c = await call(r.url, "POST", "/v1/chat/completions", { body: { model: "tiny", user: "alice", max_tokens: 3, messages: [{ role: "user", content: "Hiking in the Alps?" }], dki: { alpha: 1 } } });
        expect(c.status).toBe(200);
      }
      await call(r.url, "POST", "/v1/chat/completions", { body: { model: "nope", messages: [{ role: "user", content: "hi" }] } });
      const m = await call(r.url, "GET", "/metrics");
      expect(m.headers.get("content-type")).toMatch(/^text\/plain/);
      const t = m.text;
      expect(metric(t, "dki_http_requests_total", '{route="/v1/chat/completions",method="POST",status="200"}')).toBe(2);
      expect(metric(t, "dki_http_errors_total", '{route="/v1/chat/completions",status="404"}')).toBe(1);
      expect(metric(t, "dki_turn_ttft_seconds_count", '{mode="dki"}')).toBe(2);
      expect(metric(t, "dki_turn_latency_seconds_count", '{mode="dki"}')).toBe(2);
      expect(metric(t, "dki_tokens_total", '{kind="completion"}')).toBe(6);
      expect(metric(t, "dki_tokens_total", '{kind="memory_kv"}')).toBeGreaterThan(0);
      // The memory's block: computed in the first turn, from L1 in the second.
      expect(metric(t, "dki_kv_blocks_total", '{tier="L4"}')).toBe(1);
      expect(metric(t, "dki_kv_blocks_total", '{tier="L1"}')).toBe(1);
      expect(metric(t, "dki_turns_total", '{mode="dki",outcome="answered"}')).toBe(2);
      expect(t).toMatch(/^dki_queue_depth 0$/m);
    } finally {
      await r.server.close();
    }
  });
});

describe("dki serve: under load", () => {
  let r: Running;
  beforeAll(async () => {
    r = await startServer(model, data, { maxQueue: 1 });
  });
  afterAll(async () => {
    await r?.server.close();
  });

  test("past the queue bound: 429 with Retry-After; a client that disconnects aborts its own turn (nothing recorded) and frees its place", async () => {
    const abort = new AbortController();
    const long = await fetch(`${r.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "tiny", user: "alice", max_tokens: LONG, stream: true, messages: [{ role: "user", content: "Tell me a long story." }], dki: { session: "left-early" } }),
      signal: abort.signal,
    });
    expect(long.status).toBe(200);
    let chunks = 0;
    const reading = readSse(long, () => void chunks++).catch(() => []);
    await waitFor("the first chunks", async () => chunks >= 3);
    // The bound (1) is held by the running turn: another user's request is refused at once.
    const refused = await call(r.url, "POST", "/v1/chat/completions", { body: { model: "tiny", user: "bob", max_tokens: 2, messages: [{ role: "user", content: "hi" }] } });
    expect(refused.status).toBe(429);
    expect(Number(refused.headers.get("retry-after"))).toBeGreaterThanOrEqual(1);
    expect(refused.json).toMatchObject({ error: { type: "rate_limit_error", code: "queue_full" } });
    // The client goes away mid-answer.
    abort.abort();
    await reading;
    await waitFor("the aborted turn to leave the queue", async () => /^dki_queue_depth 0$/m.test((await call(r.url, "GET", "/metrics")).text));
    const m = (await call(r.url, "GET", "/metrics")).text;
    expect(metric(m, "dki_turns_total", '{mode="dki",outcome="aborted"}')).toBe(1);
    // Nothing of the aborted turn was recorded, and the next request is served.
    expect((await call(r.url, "GET", "/v1/sessions/left-early/messages?user_id=alice")).status).toBe(404);
    const next = await call(r.url, "POST", "/v1/chat/completions", { body: { model: "tiny", user: "bob", max_tokens: 2, messages: [{ role: "user", content: "hi" }] } });
    expect(next.status).toBe(200);
  });
});

describe("dki serve: slow readers and timeouts", () => {
  test("a client that never reads its stream does not hold the model: another user is answered, and the unread turn is recorded", async () => {
    const r = await startServer(model, data, { maxQueue: 4 });
    const body = JSON.stringify({ model: "tiny", user: "alice", max_tokens: LONG, stream: true, messages: [{ role: "user", content: "Tell me a long story." }], dki: { session: "never-read" } });
    // A raw request whose response is paused and never read: the socket's buffers fill up.
    const req = httpRequest(`${r.url}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" } });
    const response = new Promise<IncomingMessage>((resolve) => req.on("response", (res) => resolve(res)));
    req.end(body);
    try {
      const res = await response;
      res.pause();
      expect(res.statusCode).toBe(200);
      const other = await call(r.url, "POST", "/v1/chat/completions", { body: { model: "tiny", user: "bob", max_tokens: 2, messages: [{ role: "user", content: "hi" }] } });
      expect(other.status).toBe(200);
      await waitFor("the unread turn to be recorded", async () => (await call(r.url, "GET", "/v1/sessions/never-read/messages?user_id=alice")).status === 200);
      const rows = (await call(r.url, "GET", "/v1/sessions/never-read/messages?user_id=alice")).json as { results: { role: string }[] };
      expect(rows.results.map((x) => x.role)).toEqual(["user", "assistant"]);
      req.destroy();
    } finally {
      req.destroy();
      await r.server.close();
    }
  });

  test("a turn past the turn timeout is aborted: 504, nothing recorded, the queue place freed", async () => {
    const r = await startServer(model, data, { turnTimeoutMs: 200 });
    try {
      const res = await call(r.url, "POST", "/v1/chat/completions", { body: { model: "tiny", user: "alice", max_tokens: LONG, messages: [{ role: "user", content: "Tell me a long story." }], dki: { session: "too-slow" } } });
      expect(res.status).toBe(504);
      expect(res.json).toMatchObject({ error: { code: "turn_timeout" } });
      expect((await call(r.url, "GET", "/v1/sessions/too-slow/messages?user_id=alice")).status).toBe(404);
      expect((await call(r.url, "GET", "/health")).json).toMatchObject({ queue_depth: 0 });
    } finally {
      await r.server.close();
    }
  });
});

describe("dki serve: bad requests get clean 4xx answers", () => {
  let r: Running;
  beforeAll(async () => {
    r = await startServer(model, data, { bodyLimit: 64 * 1024 });
  });
  afterAll(async () => {
    await r?.server.close();
  });

  const chat = (extra: Record<string, unknown> = {}) => ({ model: "tiny", user: "alice", max_tokens: 2, messages: [{ role: "user", content: "hi" }], ...extra });

  test.each([
    ["malformed JSON", { raw: '{"model": "tiny", "messages": [' }, 400, "invalid_json"],
    ["an empty body", { raw: "" }, 400, "invalid_json"],
    ["a JSON array", { raw: "[]" }, 400, "invalid_value"],
    ["invalid UTF-8", { raw: Buffer.concat([Buffer.from('{"model": "tiny", "messages": [{"role": "user", "content": "caf'), Buffer.from([0xc3, 0x28]), Buffer.from('"}]}')]) }, 400, "invalid_utf8"],
    ["an oversized body", { raw: JSON.stringify(chat({ messages: [{ role: "user", content: "x".repeat(70 * 1024) }] })) }, 413, "body_too_large"],
    ["an unknown field", { body: chat({ logit_bias: { 1: 2 } }) }, 400, "unknown_field"],
    ["an unknown field in dki", { body: chat({ dki: { beta: 0.3 } }) }, 400, "unknown_field"],
    ["huge max_tokens", { body: chat({ max_tokens: 2 ** 31 }) }, 400, "max_tokens_too_large"],
    ["a wrong type", { body: chat({ max_tokens: "5" }) }, 400, "invalid_value"],
    ["n > 1", { body: chat({ n: 2 }) }, 400, "invalid_value"],
    ["no messages", { body: chat({ messages: [] }) }, 400, "invalid_value"],
    ["a too long user", { body: chat({ user: "u".repeat(300) }) }, 400, "invalid_value"],
    ["the last message not the user's", { body: chat({ messages: [{ role: "system", content: "x" }] }) }, 400, null],
    ["text/plain", { raw: "hello", headers: { "content-type": "text/plain" } }, 415, "unsupported_media_type"],
  ] as const)("%s", async (_name, req, status, code) => {
    const res = await call(r.url, "POST", "/v1/chat/completions", req as Parameters<typeof call>[3]);
    expect(res.status, res.text).toBe(status);
    const e = (res.json as { error: { message: string; type: string; code: string | null } }).error;
    expect(e.type).toBe("invalid_request_error");
    expect(e.message.length).toBeGreaterThan(5);
    if (code !== null) expect(e.code).toBe(code);
    // The server is unharmed.
    expect((await call(r.url, "GET", "/health")).status).toBe(200);
  });

  test("the field at fault is named in param", async () => {
    expect((await call(r.url, "POST", "/v1/chat/completions", { body: chat({ dki: { beta: 0.3 } }) })).json).toMatchObject({ error: { param: "dki.beta" } });
    expect((await call(r.url, "POST", "/v1/chat/completions", { body: chat({ temperature: -1 }) })).json).toMatchObject({ error: { param: "temperature" } });
    expect((await call(r.url, "POST", "/v1/chat/completions", { body: { messages: [{ role: "user", content: "hi" }] } })).json).toMatchObject({ error: { param: "model" } });
    expect((await call(r.url, "GET", "/v1/nope")).json).toMatchObject({ error: { code: "unknown_route" } });
  });
});
