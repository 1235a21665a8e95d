// The AI SDK provider over a `dki serve` URL, end to end: the `ai` package's own generateText,
// streamText, embed and embedMany against createDki({ url }) on a real `dki serve` child process
// (loopback, a generated model, API keys). Beside it, the in-process provider on the same model and
// an equal store: the two must answer the same greedy turn with the same text and report it in the
// same shapes, since an application switches between them by configuration alone.
import { execFile } from "node:child_process";
import { readFile, writeFile } from "node:fs/promises";
import { promisify } from "node:util";
import { join } from "node:path";
import { APICallError } from "@ai-sdk/provider";
import { embed, embedMany, generateText, streamText, type ModelMessage, type TextStreamPart, type ToolSet } from "ai";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { createDki, type DkiProvider, type DkiServerProvider } from "../src/integrations/ai-sdk/index.js";
import { call, makeTinyModel, spawnServer, type ChildServer } from "./support/serve.js";
import { repoRoot, tempDir } from "./support/paths.js";
import { as, HIKING, HIKING_Q, meta, streamAbortedAtFirstText } from "./support/ai-sdk.js";

const ADMIN = "admin-key-0123456789abcdef";
const ALICE = "alice-key-0123456789abcdef";

let server: ChildServer;
let local: DkiProvider;
/** Over the URL with alice's key: it may act for alice only. */
let remote: DkiServerProvider;
let serverMemoryId: string;
let modelDir: string;

beforeAll(async () => {
  const model = (modelDir = await makeTinyModel());
  const keys = join(tempDir(), "keys.json");
  await writeFile(keys, JSON.stringify({ keys: [{ key: ADMIN, name: "admin", admin: true }, { key: ALICE, name: "alice", users: ["alice"] }] }));
  server = await spawnServer(["--model", model, "--data", join(tempDir(), "data"), "--init", "--threads", "1", "--context-size", "1024", "--api-key-file", keys]);
  const added = await call(server.url, "POST", "/v1/memories", { key: ADMIN, body: { user_id: "alice", memory: HIKING } });
  expect(added.status).toBe(201);
  serverMemoryId = (added.json as { results: { id: string }[] }).results[0]!.id;
  expect((await call(server.url, "POST", "/v1/memories", { key: ADMIN, body: { user_id: "bob", memory: "Bob plays the cello in a jazz band." } })).status).toBe(201);

  // The in-process provider on the same weights, settings and memories.
  local = createDki({ model, dataDir: tempDir(), loadOptions: { threads: 1, contextSize: 1024 } });
  const sys = await local.system();
  await sys.memories.add(HIKING, { userId: "alice" });
  await sys.memories.add("Bob plays the cello in a jazz band.", { userId: "bob" });
  remote = createDki({ url: server.url, apiKey: ALICE });
}, 120_000);
afterAll(async () => {
  await local?.close();
  await remote?.close();
  if (server !== undefined && server.child.exitCode === null) {
    server.child.kill("SIGTERM");
    await server.exited;
  }
});

/** The keys of an object and of its nested objects, as paths: the shape, without the values. */
function shape(v: unknown, at = ""): string[] {
  if (v === null || typeof v !== "object") return [at];
  if (Array.isArray(v)) return v.length === 0 ? [`${at}[]`] : shape(v[0], `${at}[]`);
  return Object.entries(v).flatMap(([k, x]) => shape(x, at === "" ? k : `${at}.${k}`)).sort();
}

/** The session's recorded messages on the server ([] when it has none). */
async function recorded(sessionId: string, userId = "alice"): Promise<{ role: string; content: string }[]> {
  const r = await call(server.url, "GET", `/v1/sessions/${sessionId}/messages?user_id=${userId}`, { key: ADMIN });
  if (r.status === 404) return [];
  expect(r.status).toBe(200);
  return (r.json as { results: { role: string; content: string }[] }).results;
}

async function metric(re: RegExp): Promise<number> {
  return Number(re.exec((await call(server.url, "GET", "/metrics")).text)?.[1] ?? 0);
}
/** The server's count of turns aborted (by the client going away, here). */
const abortedTurns = (mode: string) => metric(new RegExp(`dki_turns_total\\{mode="${mode}",outcome="aborted"\\} (\\d+)`));

async function failure(p: Promise<unknown>): Promise<Error> {
  const e = await p.then(
    () => null,
    (x: unknown) => x,
  );
  expect(e, "should have failed").not.toBeNull();
  return e as Error;
}

describe("generateText over a URL", () => {
  test('the same greedy turn as the in-process provider: same text, usage and metadata shape ("dki", "none", "rag")', async () => {
    for (const mode of ["dki", "none", "rag"] as const) {
      const l = await generateText({ model: local(mode), prompt: HIKING_Q, maxOutputTokens: 8, providerOptions: as("alice", `same-${mode}`) });
      const r = await generateText({ model: remote(mode), prompt: HIKING_Q, maxOutputTokens: 8, providerOptions: as("alice", `same-${mode}`) });
      expect(r.text, mode).toBe(l.text);
      expect(r.text.length).toBeGreaterThan(0);
      expect([r.finishReason, r.rawFinishReason]).toEqual([l.finishReason, l.rawFinishReason]);
      // Every count a number, the same numbers; the memory's tokens as the in-process provider reports them.
      expect(r.usage).toEqual(l.usage);
      for (const n of [r.usage.inputTokens, r.usage.outputTokens, r.usage.inputTokenDetails.cacheReadTokens, r.usage.inputTokenDetails.cacheWriteTokens, r.usage.outputTokenDetails.reasoningTokens]) expect(typeof n).toBe("number");
      const rm = meta(r.providerMetadata);
      const lm = meta(l.providerMetadata);
      expect(shape(rm), mode).toEqual(shape(lm));
      const same = (m: Record<string, unknown>) => ({ ...m, memories: (m.memories as { id: string }[]).map((x) => ({ ...x, id: "" })), ttftMs: 0, latency: 0, tiers: (m.tiers as { id: string | null; loadMs: number }[]).map((t) => ({ ...t, id: "", loadMs: 0 })) });
      expect(same(rm), mode).toEqual(same(lm));
      expect(rm).toMatchObject({ mode, userId: "alice", sessionId: `same-${mode}` });
      if (mode !== "none") expect((rm.memories as { id: string }[]).map((m) => m.id)).toEqual([serverMemoryId]);
    }
    // The turns are the server's: recorded in its store under the session.
    expect((await recorded("same-dki")).map((m) => m.role)).toEqual(["user", "assistant"]);
  });

  test("providerOptions.dki.alpha and the system prompt reach the turn; the session continues on the server", async () => {
    const r = await generateText({ model: remote("dki"), system: "You are terse.", prompt: HIKING_Q, maxOutputTokens: 3, providerOptions: as("alice", "a1", { alpha: 0.5 }) });
    const l = await generateText({ model: local("dki"), system: "You are terse.", prompt: HIKING_Q, maxOutputTokens: 3, providerOptions: as("alice", "a1", { alpha: 0.5 }) });
    expect(meta(r.providerMetadata)).toMatchObject({ forced: true, alpha: 0.5, promptTokens: l.usage.inputTokens });
    expect(r.text).toBe(l.text);

    // The app sends the conversation back: no warning, the history is the server's record.
    const messages: ModelMessage[] = [{ role: "user", content: HIKING_Q }, ...r.response.messages, { role: "user", content: "And in winter?" }];
    const second = await generateText({ model: remote("dki"), system: "You are terse.", messages, maxOutputTokens: 3, providerOptions: as("alice", "a1") });
    expect(second.warnings ?? []).toEqual([]);
    expect(meta(second.providerMetadata).historyTokens).toBeGreaterThan(0);
    expect((await recorded("a1")).length).toBe(4);
    // Messages the server never recorded: the model did not see them, and the call says so.
    const made: ModelMessage[] = [{ role: "user", content: "Hi" }, { role: "assistant", content: "Hello!" }, { role: "user", content: HIKING_Q }];
    const other = await generateText({ model: remote("none"), messages: made, maxOutputTokens: 2, topK: 5, providerOptions: as("alice", "h2") });
    expect(other.warnings).toEqual([
      { type: "unsupported", feature: "topK", details: expect.stringContaining("top_k") },
      { type: "other", message: expect.stringMatching(/^2 earlier message\(s\) of the prompt are not the recorded turns of session "h2" \(0 recorded messages\)/) },
    ]);
  });

  test("the key decides the users: alice's key acts for alice, a turn for bob is refused with the server's 403, a wrong key with its 401", async () => {
    const e = await failure(generateText({ model: remote("dki"), prompt: HIKING_Q, maxOutputTokens: 2, maxRetries: 0, providerOptions: as("bob", "k1") }));
    expect(APICallError.isInstance(e), String(e)).toBe(true);
    expect((e as APICallError).statusCode).toBe(403);
    expect(e.message).toMatch(/^dki serve answered 403 to POST \/v1\/chat\/completions: this API key may not act for the user named in user \(user_not_allowed, user\)$/);
    expect((e as APICallError).isRetryable).toBe(false);
    expect(await recorded("k1", "bob")).toEqual([]);

    const wrong = createDki({ url: server.url, apiKey: "not-a-key-0123456789" });
    const w = await failure(generateText({ model: wrong("none"), prompt: HIKING_Q, maxOutputTokens: 2, maxRetries: 0, providerOptions: as("alice", "k2") }));
    expect((w as APICallError).statusCode).toBe(401);
    expect(w.message).toMatch(/^dki serve answered 401 to GET \/v1\/models: /);
    expect((w as APICallError).isRetryable).toBe(false);

    // The admin key acts for bob: bob's own memory, never alice's.
    const admin = createDki({ url: server.url, apiKey: ADMIN });
    const bob = await generateText({ model: admin("dki"), prompt: HIKING_Q, maxOutputTokens: 2, providerOptions: as("bob", "k3") });
    expect((meta(bob.providerMetadata).memories as { id: string }[]).some((m) => m.id === serverMemoryId)).toBe(false);
    expect(meta(bob.providerMetadata).userId).toBe("bob");
  });

  test("a request the server refuses is an error naming the status and its message; an unreachable server names the URL", async () => {
    const e = await failure(generateText({ model: remote("none"), prompt: HIKING_Q, maxOutputTokens: 2, stopSequences: ["a", "b", "c", "d", "e"], maxRetries: 0, providerOptions: as("alice", "e1") }));
    expect((e as APICallError).statusCode).toBe(400);
    expect(e.message).toMatch(/^dki serve answered 400 to POST \/v1\/chat\/completions: .*stop/);
    // A URL that is not a dki serve's root: the route is not there.
    const elsewhere = createDki({ url: `${server.url}/elsewhere`, apiKey: ALICE });
    const n = await failure(generateText({ model: elsewhere("none"), prompt: HIKING_Q, maxRetries: 0, providerOptions: as("alice", "e3") }));
    expect((n as APICallError).statusCode).toBe(404);
    expect(n.message).toMatch(/^dki serve answered 404 to GET \/elsewhere\/v1\/models: /);
    const gone = createDki({ url: "http://127.0.0.1:9/", apiKey: ALICE });
    const g = await failure(generateText({ model: gone("none"), prompt: HIKING_Q, maxRetries: 0, providerOptions: as("alice", "e2") }));
    expect(g.message).toMatch(/could not reach dki serve at http:\/\/127\.0\.0\.1:9 \(GET \/v1\/models\)/);
  });
});

describe("a busy server, then one shutting down", () => {
  // A second server (no keys: loopback, any user) that holds one turn at a time and aborts its turns at once on SIGTERM.
  let busy: ChildServer;
  beforeAll(async () => {
    busy = await spawnServer(["--model", modelDir, "--data", join(tempDir(), "data"), "--init", "--threads", "1", "--context-size", "1024", "--max-queue", "1", "--drain-timeout", "0"]);
  }, 60_000);
  afterAll(async () => {
    if (busy !== undefined && busy.child.exitCode === null) {
      busy.child.kill("SIGTERM");
      await busy.exited;
    }
  });

  /** Reads `stream` up to its first text delta. */
  async function firstDelta(reader: ReadableStreamDefaultReader<TextStreamPart<ToolSet>>): Promise<void> {
    for (;;) {
      const { done, value } = await reader.read();
      expect(done, "the turn ended before answering").toBe(false);
      if (value?.type === "text-delta") return;
    }
  }

  test("a full server queue is a retryable 429 naming its Retry-After", async () => {
    const p = createDki({ url: busy.url });
    const ctl = new AbortController();
    const long = streamText({ model: p("none"), prompt: HIKING_Q, maxOutputTokens: 900, abortSignal: ctl.signal, providerOptions: as("alice", "q1") });
    const reader = long.fullStream.getReader();
    await firstDelta(reader);
    // The first turn holds the server's one place while it answers.
    const e = await failure(generateText({ model: p("none"), prompt: HIKING_Q, maxOutputTokens: 2, maxRetries: 0, providerOptions: as("alice", "q2") }));
    ctl.abort();
    await reader.cancel().catch(() => {});
    expect(APICallError.isInstance(e), String(e)).toBe(true);
    const a = e as APICallError;
    expect(a.statusCode).toBe(429);
    expect(a.isRetryable).toBe(true);
    expect(a.responseHeaders?.["retry-after"]).toMatch(/^\d+$/);
    expect(a.message).toMatch(new RegExp(`^dki serve answered 429 to POST /v1/chat/completions: the server holds 1 turns, its bound \\(--max-queue 1\\).* \\(queue_full\\) \\(Retry-After: ${a.responseHeaders?.["retry-after"]} s\\)$`));
  });

  test("an error after the stream started (the server shutting down mid-answer) is an error part naming it, and a finish with reason error", async () => {
    const p = createDki({ url: busy.url });
    // The turn before may still be leaving the server's one place.
    for (let i = 0; i < 3000 && (await call(busy.url, "GET", "/metrics")).text.includes("dki_queue_depth 1"); i++) await new Promise((r) => setTimeout(r, 10));
    const s = streamText({ model: p("none"), prompt: HIKING_Q, maxOutputTokens: 900, providerOptions: as("alice", "q3"), onError: () => {} });
    const reader = s.fullStream.getReader();
    await firstDelta(reader);
    busy.child.kill("SIGTERM");
    const rest: TextStreamPart<ToolSet>[] = [];
    for (let r = await reader.read(); !r.done; r = await reader.read()) rest.push(r.value);
    const errors = rest.filter((x) => x.type === "error").map((x) => x.error as Error);
    expect(errors.map((x) => x.message)).toEqual(["dki serve ended the stream with an error: the server shut down (shutting_down)"]);
    expect(APICallError.isInstance(errors[0])).toBe(true);
    expect(rest.filter((x) => x.type === "finish-step").map((x) => (x as { finishReason: string }).finishReason)).toEqual(["error"]);
    expect((await busy.exited).code).toBe(0);
  });
});

describe("streamText over a URL", () => {
  test("parts in order, deltas adding up to the in-process provider's answer, usage and metadata from the last chunk", async () => {
    const s = streamText({ model: remote("dki"), prompt: HIKING_Q, maxOutputTokens: 8, providerOptions: as("alice", "s1") });
    const parts: TextStreamPart<ToolSet>[] = [];
    for await (const p of s.fullStream) parts.push(p);
    const deltas = parts.filter((p) => p.type === "text-delta").length;
    expect(deltas).toBeGreaterThan(1);
    expect(parts.map((p) => p.type).filter((t) => t !== "text-delta")).toEqual(["start", "start-step", "text-start", "text-end", "finish-step", "finish"]);
    const l = await generateText({ model: local("dki"), prompt: HIKING_Q, maxOutputTokens: 8, providerOptions: as("alice", "s1") });
    expect(await s.text).toBe(l.text);
    expect(await s.usage).toEqual(l.usage);
    expect(await s.finishReason).toBe(l.finishReason);
    const m = meta(await s.providerMetadata);
    expect(m).toMatchObject({ mode: "dki", sessionId: "s1", memories: [{ id: serverMemoryId }], injected: true });
    expect(shape(m)).toEqual(shape(meta(l.providerMetadata)));
    expect((await recorded("s1")).at(-1)!.content).toBe(await s.text);
  });

  test("an abort mid-answer closes the request: the server aborts the turn and records nothing", async () => {
    const aborted = () => abortedTurns("dki");
    const before = await aborted();
    const types = await streamAbortedAtFirstText(remote("dki"), "ab1");
    expect(types).toContain("abort");
    expect(types).not.toContain("finish");
    // The server saw the connection close and stopped the turn (counted as aborted), and recorded nothing.
    for (let i = 0; i < 3000 && (await aborted()) === before; i++) await new Promise((r) => setTimeout(r, 10));
    expect(await aborted()).toBe(before + 1);
    expect(await recorded("ab1")).toEqual([]);
  });

  test("generateText aborted during the turn rejects with the abort; the server aborts the turn and records nothing", async () => {
    const before = await abortedTurns("dki");
    const ctl = new AbortController();
    // Aborted once the server holds the turn (its queue depth 1), not before the request reached it.
    const p = generateText({ model: remote("dki"), prompt: HIKING_Q, maxOutputTokens: 900, abortSignal: ctl.signal, providerOptions: as("alice", "ab2") });
    for (let i = 0; i < 3000 && (await metric(/dki_queue_depth (\d+)/)) === 0; i++) await new Promise((r) => setTimeout(r, 2));
    expect(await metric(/dki_queue_depth (\d+)/), "the turn ended before it could be aborted").toBe(1);
    ctl.abort();
    await expect(p).rejects.toMatchObject({ name: "AbortError" });
    for (let i = 0; i < 3000 && (await abortedTurns("dki")) === before; i++) await new Promise((r) => setTimeout(r, 10));
    expect(await abortedTurns("dki")).toBe(before + 1);
    expect(await recorded("ab2")).toEqual([]);
    await expect(generateText({ model: remote("dki"), prompt: HIKING_Q, abortSignal: AbortSignal.abort(), providerOptions: as("alice", "ab3") })).rejects.toMatchObject({ name: "AbortError" });
  });

  test("a refused stream is an error part naming the status, and no turn", async () => {
    const s = streamText({ model: remote("dki"), prompt: HIKING_Q, maxOutputTokens: 4, maxRetries: 0, providerOptions: as("bob", "s2"), onError: () => {} });
    const errors: unknown[] = [];
    for await (const p of s.fullStream) if (p.type === "error") errors.push(p.error);
    expect(errors.length).toBe(1);
    expect((errors[0] as APICallError).statusCode).toBe(403);
    expect((errors[0] as Error).message).toMatch(/^dki serve answered 403/);
  });
});

describe("embeddings over a URL", () => {
  test("embed and embedMany return the server store's vectors: the in-process provider's for the same embedder", async () => {
    const r = await embed({ model: remote.embeddingModel(), value: HIKING });
    const l = await embed({ model: local.embeddingModel(), value: HIKING });
    expect(r.embedding).toEqual(l.embedding);
    expect(r.providerMetadata).toEqual(l.providerMetadata);
    const texts = [HIKING, HIKING_Q, "Bob plays the cello."];
    const many = await embedMany({ model: remote.textEmbeddingModel(), values: texts });
    expect(many.embeddings).toEqual((await embedMany({ model: local.textEmbeddingModel(), values: texts })).embeddings);
    expect(many.usage.tokens).toBeNaN();
  });
});

describe("the URL provider", () => {
  test("settings are checked when it is made, and a closed provider refuses calls", async () => {
    expect(() => createDki({ url: "not a url" })).toThrow(/url "not a url" is not a URL/);
    expect(() => createDki({ url: "ftp://127.0.0.1" })).toThrow(/must be http: or https:/);
    expect(() => createDki({ url: server.url, model: "x", dataDir: "y" } as never)).toThrow(/either \{ url \}.*or \{ model, dataDir \}, not both/);
    expect(createDki({ url: `${server.url}/v1/` }).url).toBe(server.url);
    const p = createDki({ url: server.url, apiKey: ALICE });
    await p.close();
    await expect(generateText({ model: p("none"), prompt: "Hello", maxRetries: 0, providerOptions: as("alice", "c1") })).rejects.toThrow("this DKI provider has been closed");
  });
});

describe("the README", () => {
  test("the example of \"Over a `dki serve` URL\" runs as written against the server, through the package's exports", async () => {
    const readme = await readFile(join(repoRoot, "README.md"), "utf8");
    const section = readme.slice(readme.indexOf("### Over a `dki serve` URL"));
    const code = /```js\n([\s\S]*?)```/.exec(section)?.[1];
    expect(code).toBeDefined();
    // A user of its own (the admin key may act for any), so the example's session is its own.
    const { stdout } = await promisify(execFile)(process.execPath, ["--input-type=module", "-e", code!], { cwd: repoRoot, env: { ...process.env, DKI_URL: server.url, DKI_API_KEY: ADMIN, DKI_USER: "readme-user" } });
    const turns = await call(server.url, "GET", "/v1/sessions/s1/messages?user_id=readme-user", { key: ADMIN });
    const messages = (turns.json as { results: { role: string; content: string }[] }).results;
    expect(messages.map((m) => m.role)).toEqual(["user", "assistant", "user", "assistant"]);
    expect(stdout).toContain(messages[1]!.content);
    expect(stdout).toContain(messages[3]!.content);
  });
});
