// The OpenAI-compatible HTTP embedder against a real `dki serve` (its /v1/embeddings serves the
// store's hashing embedder, so the vectors have an independent reference), against loopback
// servers that answer wrongly on purpose (errors, short lists, bad indexes, silence), and the
// first-working-embedder list, through the API and the CLI.
import { createServer as createHttpServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { HashingEmbedder } from "../src/memory/embedders/hashing.js";
import { HttpEmbedder, firstWorkingEmbedder } from "../src/memory/embedders/http.js";
import { MemoryStore } from "../src/memory/memory-store.js";
import { maxAbsDiff, tempDir } from "./support/paths.js";
import { makeTinyModel, startServer, type Running } from "./support/serve.js";
import { dki, dkiFails } from "./support/dki-bin.js";

let running: Running;
const hashing = new HashingEmbedder();

beforeAll(async () => {
  running = await startServer(await makeTinyModel(), tempDir());
}, 600_000);
afterAll(async () => {
  await running?.server.close();
});

const texts = ["The cabin wifi is maple-42.", "Ana owns the lake cabin.", "Trains to Lisbon leave at nine.", "A red fox.", "湖边小屋的无线网密码"];

describe("against dki serve", () => {
  test("learns the dimension, and its vectors are the server's embedder's (in batches too), as unit vectors", async () => {
    const e = await HttpEmbedder.connect({ url: `${running.url}/v1/`, model: "tiny", batchSize: 2 });
    expect(e.dim).toBe(hashing.dim);
    expect(e.id).toBe(`http:tiny:${hashing.dim}`);
    const got = await e.embed(texts);
    const want = await hashing.embed(texts);
    expect(got).toHaveLength(texts.length);
    got.forEach((v, i) => expect(maxAbsDiff(v, want[i]!)).toBeLessThan(1e-6));
    await expect(e.embed(["ok", "  "])).rejects.toThrow(/texts\[1\] is empty/);
  });

  test("a memory store runs on it: add and search", async () => {
    const e = await HttpEmbedder.connect({ url: `${running.url}/v1`, model: "tiny" });
    const store = await MemoryStore.open({ dir: tempDir(), embedder: e });
    try {
      await store.memories.add("Ana owns the lake cabin by the pines.", { userId: "u" });
      await store.memories.add("Trains to Lisbon leave at nine.", { userId: "u" });
      const [hit] = await store.memories.search("who owns the lake cabin", { userId: "u", limit: 1 });
      expect(hit.memory.text).toMatch(/lake cabin/);
    } finally {
      await store.close();
    }
  });

  test("the server's own errors come back with their status and message", async () => {
    await expect(HttpEmbedder.connect({ url: `${running.url}/v1`, model: "no-such-model" })).rejects.toThrow(/\/v1\/embeddings \(model no-such-model\): HTTP 404: The model `no-such-model` does not exist/);
  });
});

/** A loopback server answering every request with `answer` (or never, for null). */
async function scripted(answer: ((body: { input: string[] }) => { status: number; body: string }) | null): Promise<{ url: string; server: Server }> {
  const server = createHttpServer((req, res) => {
    let raw = "";
    req.on("data", (c) => (raw += c));
    req.on("end", () => {
      if (answer === null) return; // silence
      const a = answer(JSON.parse(raw) as { input: string[] });
      res.writeHead(a.status, { "content-type": "application/json" }).end(a.body);
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`, server };
}

describe("servers that answer wrongly", () => {
  const close: Server[] = [];
  afterAll(() => {
    for (const s of close) s.closeAllConnections(), s.close();
  });
  const ok = (vectors: (input: string[]) => unknown[]) => (b: { input: string[] }) => ({ status: 200, body: JSON.stringify({ data: vectors(b.input) }) });

  test.each([
    ["an error object", (_: { input: string[] }) => ({ status: 500, body: JSON.stringify({ error: { message: "model is loading" } }) }), /HTTP 500: model is loading/],
    ["a body that is not JSON", () => ({ status: 200, body: "<html>" }), /expected 1 embeddings in data\[\], got a body that is not JSON/],
    ["too few embeddings", ok(() => []), /expected 1 embeddings in data\[\], got 0/],
    ["an index past the inputs", ok((input) => input.map(() => ({ index: 5, embedding: [1, 0] }))), /data\[0\]\.index 5 is not a distinct input index/],
    ["a value that is not a number", ok((input) => input.map((_, index) => ({ index, embedding: [1, "x"] }))), /data\[0\]\.embedding is not a list of finite numbers/],
  ] as const)("%s: a clear error naming the server", async (_, answer, message) => {
    const s = await scripted(answer);
    close.push(s.server);
    await expect(HttpEmbedder.connect({ url: s.url, model: "m" })).rejects.toThrow(message);
  });

  test("vectors come back in input order by their index, scaled to length 1; a later answer of another dimension is refused", async () => {
    let dim = 3;
    const s = await scripted(ok((input) => input.map((_, index) => ({ index, embedding: Array.from({ length: dim }, (_, d) => (d === index % dim ? 2 : 0)) })).reverse()));
    close.push(s.server);
    const e = await HttpEmbedder.connect({ url: s.url, model: "m" });
    expect(e.dim).toBe(3);
    expect((await e.embed(["a", "b"])).map((v) => Array.from(v))).toEqual([[1, 0, 0], [0, 1, 0]]);
    dim = 4;
    await expect(e.embed(["a"])).rejects.toThrow(/data\[0\]\.embedding has 4 values; this embedder's dimension is 3/);
  });

  test("silence past the timeout, a closed port and bad options are errors that say so", async () => {
    const s = await scripted(null);
    close.push(s.server);
    await expect(HttpEmbedder.connect({ url: s.url, model: "m", timeoutMs: 300 })).rejects.toThrow(/no answer within 300 ms/);
    const closed = await scripted(null);
    const port = new URL(closed.url).port;
    await new Promise<void>((r) => closed.server.close(() => r()));
    await expect(HttpEmbedder.connect({ url: `http://127.0.0.1:${port}/v1`, model: "m" })).rejects.toThrow(/ECONNREFUSED/);
    await expect(HttpEmbedder.connect({ url: "ftp://x/v1", model: "m" })).rejects.toThrow(/url must be http:\/\/ or https:\/\//);
    await expect(HttpEmbedder.connect({ url: s.url, model: " " })).rejects.toThrow(/model must name/);
  });
});

/** A loopback port nothing listens on. */
async function closedPort(): Promise<number> {
  const s = createHttpServer();
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
  const port = (s.address() as AddressInfo).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

describe("the first working embedder of a list", () => {
  test("skips what fails (with why), takes the first that embeds; none working is one error with every reason", async () => {
    const down = `http://127.0.0.1:${await closedPort()}/v1`;
    const r = await firstWorkingEmbedder([
      { name: `${down}#m`, open: () => HttpEmbedder.connect({ url: down, model: "m" }) },
      { name: "hashing", open: async () => hashing },
    ]);
    expect(r.name).toBe("hashing");
    expect(r.skipped).toEqual([{ name: `${down}#m`, reason: expect.stringMatching(/ECONNREFUSED/) }]);
    await expect(firstWorkingEmbedder([{ name: "a", open: async () => Promise.reject(new Error("gone")) }, { name: "b", open: async () => Promise.reject(new Error("also gone")) }])).rejects.toThrow(/no embedder of the list works: a: gone; b: also gone/);
  });

  test("the CLI's --embedder list: the first that works is used and stderr says what was skipped; a URL without #model is refused", async () => {
    const data = tempDir();
    const down = `http://127.0.0.1:${await closedPort()}/v1`;
    const r = await dki(["memory", "add", "Ana owns the lake cabin.", "--data", data, "--user", "u", "--embedder", `${down}#m, hashing`]);
    expect(r.stderr).toMatch(/^dki: embedder hashing \(hashing[^)]*\); skipped http:\/\/127\.0\.0\.1:\d+\/v1#m: .*ECONNREFUSED/);
    expect(JSON.parse((await dki(["memory", "list", "--data", data, "--user", "u", "--format", "json"])).stdout).memories).toHaveLength(1);
    expect(await dkiFails(["memory", "list", "--data", data, "--user", "u", "--embedder", "http://127.0.0.1:1/v1"])).toMatch(/--embedder http:\/\/127\.0\.0\.1:1\/v1: name the model after a #/);
  });
});
