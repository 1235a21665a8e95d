// `dki mcp` as an MCP client meets it: the MCP SDK's own Client, over stdio (StdioClientTransport
// spawning the real `bin/dki.js mcp` process) and over Streamable HTTP (the SDK's HTTP client
// against `dki mcp --port`), on a generated model and a real memory store. Every tool, bad
// inputs, and the rule the server exists to keep: a client configured for one user can never
// read, change or erase another user's memories, whatever ids or arguments it sends.
import { spawn, type ChildProcess } from "node:child_process";
import { request } from "node:http";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { getDefaultEnvironment, StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { makeTinyModel } from "../src/models/make-tiny.js";
import { dkiBin, dkiFails } from "./support/dki-bin.js";
import { repoRoot, tempDir } from "./support/paths.js";

const HIKING = "Alice loves hiking in the Alps and is allergic to peanuts.";
const HIKING_Q = "Any tips for hiking in the Alps with a peanut allergy?";
const CELLO = "Bob plays the cello in a jazz band.";
const TOOLS = ["add_memory", "add_preference", "chat", "delete_all_memories", "delete_memory", "get_memory", "list_memories", "search_memories", "update_memory"];

let modelDir: string;
const clients: Client[] = [];
const children: ChildProcess[] = [];

beforeAll(async () => {
  modelDir = tempDir();
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: modelDir, seed: 7 });
});
afterAll(async () => {
  for (const c of clients) await c.close().catch(() => {});
  for (const c of children) c.kill("SIGTERM");
});

const serverArgs = (data: string, cache: string) => [dkiBin, "mcp", "--model", modelDir, "--data", data, "--cache", cache, "--context-size", "1024", "--threads", "1"];

/** What each stdio server has written to stderr so far, by its client. */
const serverStderr = new Map<Client, string[]>();

/** A client of a stdio server started for `user` (by --user, or by DKI_MCP_USER when `viaEnv`). */
async function stdioClient(data: string, user: string, o: { viaEnv?: boolean; extra?: string[] } = {}): Promise<Client> {
  const args = [...serverArgs(data, tempDir()), ...(o.viaEnv ? [] : ["--user", user]), ...(o.extra ?? [])];
  const transport = new StdioClientTransport({ command: process.execPath, args, env: { ...getDefaultEnvironment(), ...(o.viaEnv ? { DKI_MCP_USER: user } : {}) }, stderr: "pipe" });
  const client = new Client({ name: `test-${user}`, version: "1.0.0" });
  const lines: string[] = [];
  serverStderr.set(client, lines);
  transport.stderr?.on("data", (d: Buffer) => lines.push(d.toString()));
  await client.connect(transport);
  clients.push(client);
  return client;
}

async function call(c: Client, name: string, args: Record<string, unknown> = {}): Promise<Record<string, unknown>> {
  const r = (await c.callTool({ name, arguments: args })) as CallToolResult;
  expect(r.isError ?? false, `${name} failed: ${JSON.stringify(r.content)}`).toBe(false);
  // The text a client shows and the structured content are the same value.
  expect(JSON.parse((r.content[0] as { text: string }).text)).toEqual(r.structuredContent);
  return r.structuredContent!;
}

/** A tool call that must come back as an MCP tool error; its message. */
async function fails(c: Client, name: string, args: Record<string, unknown>): Promise<string> {
  const r = (await c.callTool({ name, arguments: args })) as CallToolResult;
  expect(r.isError, `${name} ${JSON.stringify(args)} should have failed: ${JSON.stringify(r.content)}`).toBe(true);
  return (r.content[0] as { text: string }).text;
}

type MemoryView = { id: string; text: string; metadata: Record<string, unknown>; session_id: string | null };

describe("dki mcp over stdio", () => {
  test("every tool and resource, for the user the server was started for", async () => {
    const c = await stdioClient(tempDir(), "alice");
    const tools = (await c.listTools()).tools;
    expect(tools.map((t) => t.name).sort()).toEqual(TOOLS);
    for (const t of tools) {
      // Strict schemas, and none with a way to name a user.
      expect(t.inputSchema.additionalProperties, t.name).toBe(false);
      expect(Object.keys(t.inputSchema.properties ?? {}).filter((k) => /user/i.test(k)), t.name).toEqual([]);
    }

    const [hiking] = (await call(c, "add_memory", { text: HIKING, metadata: { topic: "outdoors" } })).added as MemoryView[];
    expect(hiking).toMatchObject({ text: HIKING, metadata: { topic: "outdoors" } });
    const [tea] = (await call(c, "add_memory", { text: "Alice drinks green tea every morning.", session_id: "s-tea" })).added as MemoryView[];
    expect(tea!.session_id).toBe("s-tea");

    const found = (await call(c, "search_memories", { query: HIKING_Q, limit: 1 })).results as (MemoryView & { score: number })[];
    expect(found.map((m) => m.id)).toEqual([hiking!.id]);
    expect(found[0]!.score).toBeGreaterThan(0);
    // Scoped to a session: only what was added there, whichever memory the query would rank first.
    expect(((await call(c, "search_memories", { query: "What does Alice drink every morning in the Alps?", session_id: "s-tea" })).results as MemoryView[]).map((m) => m.id)).toEqual([tea!.id]);
    expect(((await call(c, "search_memories", { query: "What does Alice drink every morning in the Alps?", session_id: "s-other" })).results as MemoryView[])).toEqual([]);

    const listed = await call(c, "list_memories");
    expect(listed.total).toBe(2);
    expect((listed.memories as MemoryView[]).map((m) => m.id).sort()).toEqual([hiking!.id, tea!.id].sort());
    const page = await call(c, "list_memories", { limit: 1, offset: 1 });
    expect((page.memories as MemoryView[]).length).toBe(1);
    expect((page.memories as MemoryView[])[0]!.id).toBe((listed.memories as MemoryView[])[1]!.id);

    expect(((await call(c, "get_memory", { id: hiking!.id })).memory as MemoryView).text).toBe(HIKING);
    const updated = (await call(c, "update_memory", { id: tea!.id, text: "Alice drinks oolong tea every morning." })).memory as MemoryView;
    expect(updated.text).toBe("Alice drinks oolong tea every morning.");
    expect(((await call(c, "get_memory", { id: tea!.id })).memory as MemoryView).text).toBe(updated.text);

    const pref = (await call(c, "add_preference", { text: "Vegetarian meals only.", type: "diet", priority: 5 })).preference as { id: string; type: string; priority: number };
    expect(pref).toMatchObject({ type: "diet", priority: 5 });

    const turn = await call(c, "chat", { query: HIKING_Q, max_tokens: 4, session_id: "c1" });
    expect(turn).toMatchObject({ session_id: "c1", injected: true, output_tokens: 4, finish_reason: "length" });
    expect((turn.memories_used as { id: string }[]).map((m) => m.id)).toContain(hiking!.id);
    expect((turn.tiers as { kind: string }[]).map((t) => t.kind)).toContain("preferences");
    expect(turn.memory_tokens).toBeGreaterThan(0);
    const plain = await call(c, "chat", { query: HIKING_Q, max_tokens: 2, session_id: "c2", no_memory: true });
    expect(plain).toMatchObject({ injected: false, memories_used: [], memory_tokens: 0 });

    // Resources: the list, each memory, the preferences.
    const uris = (await c.listResources()).resources.map((r) => r.uri).sort();
    expect(uris).toEqual(["dki://memories", "dki://preferences", `dki://memories/${hiking!.id}`, `dki://memories/${tea!.id}`].sort());
    const all = JSON.parse(((await c.readResource({ uri: "dki://memories" })).contents[0] as { text: string }).text) as MemoryView[];
    expect(all.map((m) => m.id).sort()).toEqual([hiking!.id, tea!.id].sort());
    const one = JSON.parse(((await c.readResource({ uri: `dki://memories/${hiking!.id}` })).contents[0] as { text: string }).text) as MemoryView;
    expect(one.text).toBe(HIKING);
    const prefs = JSON.parse(((await c.readResource({ uri: "dki://preferences" })).contents[0] as { text: string }).text) as { id: string }[];
    expect(prefs.map((p) => p.id)).toEqual([pref.id]);

    expect(await call(c, "delete_memory", { id: tea!.id })).toEqual({ deleted: tea!.id });
    expect(await fails(c, "get_memory", { id: tea!.id })).toBe(`memory "${tea!.id}" not found`);
    expect(await fails(c, "delete_memory", { id: tea!.id })).toBe(`memory "${tea!.id}" not found`);
    expect(await call(c, "delete_all_memories", { confirm: true })).toEqual({ deleted: 1 });
    expect((await call(c, "list_memories")).total).toBe(0);

    // The client closing the server's stdin ends it in order (not by the SIGTERM the client sends to a server that stays).
    await c.close();
    expect(serverStderr.get(c)!.join("")).toMatch(/dki mcp: serving the memory of user "alice" over stdio .*\ndki mcp: stdin closed: stopped\n$/s);
  });

  test("--rerank-model: the chat tool's memories are picked by the cross-encoder from a deeper search", async () => {
    const c = await stdioClient(tempDir(), "carol", { extra: ["--rerank-model", join(repoRoot, "models", "memory-qa-reranker"), "--max-memories", "1"] });
    await call(c, "add_memory", { text: "User: Is my dog named? My friend's dog is Pelvorin." });
    const own = ((await call(c, "add_memory", { text: "User: I have a dog named Corsadro." })).added as MemoryView[])[0]!;
    // search_memories is the store's search (the friend's dog first); chat routes through the reranker.
    expect(((await call(c, "search_memories", { query: "What is the name of the user's dog?", limit: 1 })).results as MemoryView[])[0]!.id).not.toBe(own.id);
    const turn = await call(c, "chat", { query: "What is the name of the user's dog?", max_tokens: 1, alpha: 1 });
    expect((turn.memories_used as { id: string }[]).map((m) => m.id)).toEqual([own.id]);
  });

  test("bad inputs are MCP tool errors naming the problem", async () => {
    const c = await stdioClient(tempDir(), "alice");
    expect(await fails(c, "add_memory", {})).toMatch(/Input validation error: .*text/s);
    expect(await fails(c, "add_memory", { text: "   " })).toMatch(/must be non-empty text/);
    expect(await fails(c, "add_memory", { text: "x", user_id: "bob" })).toMatch(/Unrecognized key.*"user_id"/s);
    expect(await fails(c, "add_memory", { text: "x", metadata: { nested: { a: 1 } } })).toMatch(/Input validation error: .*metadata/s);
    expect(await fails(c, "search_memories", { query: "x", limit: 0 })).toMatch(/Input validation error: .*limit/s);
    expect(await fails(c, "get_memory", { id: 5 })).toMatch(/Input validation error: .*id/s);
    expect(await fails(c, "get_memory", { id: "mem_nope" })).toBe('memory "mem_nope" not found');
    expect(await fails(c, "update_memory", { id: "mem_nope", text: "y" })).toMatch(/^memory "mem_nope" not found for user "alice"$/);
    expect(await fails(c, "delete_all_memories", {})).toMatch(/Input validation error: .*confirm/s);
    expect(await fails(c, "delete_all_memories", { confirm: false })).toMatch(/Input validation error: .*confirm/s);
    expect(await fails(c, "add_preference", { text: "Vegetarian." })).toMatch(/Input validation error: .*type/s);
    expect(await fails(c, "chat", { query: "hi", alpha: 2 })).toMatch(/Input validation error: .*alpha/s);
    expect(await fails(c, "chat", { query: "hi", alpha: 0.5, no_memory: true })).toBe("give at most one of alpha and no_memory");
    expect(await fails(c, "chat", { query: "hi", max_tokens: 0 })).toMatch(/Input validation error: .*max_tokens/s);
    expect(await fails(c, "forget_everything", {})).toMatch(/Tool forget_everything not found/);
    await expect(c.readResource({ uri: "dki://memories/mem_nope" })).rejects.toThrow(/memory "mem_nope" not found/);
    // Nothing of the refused calls was stored.
    expect((await call(c, "list_memories")).total).toBe(0);
  });

  test("a client configured for user A can never read, change or erase user B's memories", async () => {
    const data = tempDir();
    const bob = await stdioClient(data, "bob");
    const alice = await stdioClient(data, "alice");
    const [cello] = (await call(bob, "add_memory", { text: CELLO })).added as MemoryView[];
    const [hiking] = (await call(alice, "add_memory", { text: HIKING })).added as MemoryView[];
    const b = cello!.id;

    // Read: by id, by search (B's own words), by listing, by resource, through a chat turn.
    expect(await fails(alice, "get_memory", { id: b })).toBe(`memory "${b}" not found`);
    expect(((await call(alice, "search_memories", { query: CELLO, limit: 100 })).results as MemoryView[]).map((m) => m.id)).toEqual([hiking!.id]);
    expect(((await call(alice, "list_memories")).memories as MemoryView[]).map((m) => m.id)).toEqual([hiking!.id]);
    await expect(alice.readResource({ uri: `dki://memories/${b}` })).rejects.toThrow(`memory "${b}" not found`);
    expect((await alice.listResources()).resources.map((r) => r.uri)).not.toContain(`dki://memories/${b}`);
    const turn = await call(alice, "chat", { query: "Who plays the cello in a jazz band?", max_tokens: 2, alpha: 1 });
    expect((turn.memories_used as { id: string }[]).map((m) => m.id)).not.toContain(b);
    // Naming B in any argument is refused, not ignored.
    expect(await fails(alice, "list_memories", { user_id: "bob" })).toMatch(/Unrecognized key/);
    expect(await fails(alice, "get_memory", { id: b, userId: "bob" })).toMatch(/Unrecognized key/);

    // Change and erase: by id, and everything at once.
    expect(await fails(alice, "update_memory", { id: b, text: "Bob hates music." })).toBe(`memory "${b}" not found for user "alice"`);
    expect(await fails(alice, "delete_memory", { id: b })).toBe(`memory "${b}" not found`);
    expect(await call(alice, "delete_all_memories", { confirm: true })).toEqual({ deleted: 1 });

    // B's memory is as B wrote it, and B's server still finds it.
    expect(((await call(bob, "get_memory", { id: b })).memory as MemoryView).text).toBe(CELLO);
    expect(((await call(bob, "list_memories")).memories as MemoryView[]).map((m) => m.id)).toEqual([b]);
    // And B's server cannot reach A's deleted-or-not memories either.
    expect(await fails(bob, "get_memory", { id: hiking!.id })).toBe(`memory "${hiking!.id}" not found`);

    // The user may come from the environment instead of --user: the same store, bob's view.
    const bobByEnv = await stdioClient(data, "bob", { viaEnv: true });
    expect(((await call(bobByEnv, "list_memories")).memories as MemoryView[]).map((m) => m.id)).toEqual([b]);
  });
});

/** `dki mcp --port 0 --keys FILE` started; its URL read from what it prints on stderr. */
async function httpServer(data: string, keys: Record<string, string>): Promise<string> {
  return (await httpServerProcess(data, keys)).url;
}

async function httpServerProcess(data: string, keys: Record<string, string>): Promise<{ url: string; child: ChildProcess; stderr: () => string }> {
  const keyFile = join(tempDir(), "keys.json");
  writeFileSync(keyFile, JSON.stringify(keys));
  const child = spawn(process.execPath, [...serverArgs(data, tempDir()), "--port", "0", "--keys", keyFile], { stdio: ["ignore", "pipe", "pipe"] });
  children.push(child);
  let stderr = "";
  return new Promise((resolve, reject) => {
    child.stderr!.on("data", (d: Buffer) => {
      stderr += d.toString();
      const m = /listening on (http:\/\/127\.0\.0\.1:\d+\/mcp)/.exec(stderr);
      if (m) resolve({ url: m[1]!, child, stderr: () => stderr });
    });
    child.on("exit", (code) => reject(new Error(`dki mcp --port exited with ${code}: ${stderr}`)));
  });
}

async function httpClient(url: string, key: string): Promise<Client> {
  const client = new Client({ name: "test-http", version: "1.0.0" });
  await client.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: { Authorization: `Bearer ${key}` } } }));
  clients.push(client);
  return client;
}

/** A raw request to the server: its status and body. */
function raw(url: string, o: { method?: string; headers?: Record<string, string>; body?: string }): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request(url, { method: o.method ?? "POST", headers: { "Content-Type": "application/json", Accept: "application/json, text/event-stream", ...o.headers } }, (res) => {
      let body = "";
      res.on("data", (d: Buffer) => (body += d.toString()));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on("error", reject);
    req.end(o.body ?? "");
  });
}

describe("dki mcp over Streamable HTTP", () => {
  const KEY_A = "alice-key-0123456789abcdef";
  const KEY_B = "bob-key-0123456789abcdef";

  test("each request's user is its key's: every tool works, and A's key never reaches B's memories", async () => {
    const { url, child, stderr } = await httpServerProcess(tempDir(), { [KEY_A]: "alice", [KEY_B]: "bob" });
    const alice = await httpClient(url, KEY_A);
    const bob = await httpClient(url, KEY_B);
    expect((await alice.listTools()).tools.map((t) => t.name).sort()).toEqual(TOOLS);

    const [cello] = (await call(bob, "add_memory", { text: CELLO })).added as MemoryView[];
    const [hiking] = (await call(alice, "add_memory", { text: HIKING })).added as MemoryView[];
    const b = cello!.id;
    expect(((await call(alice, "search_memories", { query: HIKING_Q })).results as MemoryView[]).map((m) => m.id)).toEqual([hiking!.id]);
    expect(((await call(alice, "get_memory", { id: hiking!.id })).memory as MemoryView).text).toBe(HIKING);
    await call(alice, "update_memory", { id: hiking!.id, text: `${HIKING} She also climbs.` });
    await call(alice, "add_preference", { text: "Short answers.", type: "style" });
    expect(await call(alice, "chat", { query: HIKING_Q, max_tokens: 2 })).toMatchObject({ injected: true, output_tokens: 2 });

    expect(await fails(alice, "get_memory", { id: b })).toBe(`memory "${b}" not found`);
    expect(await fails(alice, "update_memory", { id: b, text: "changed" })).toBe(`memory "${b}" not found for user "alice"`);
    expect(await fails(alice, "delete_memory", { id: b })).toBe(`memory "${b}" not found`);
    expect(((await call(alice, "list_memories")).memories as MemoryView[]).map((m) => m.id)).toEqual([hiking!.id]);
    await expect(alice.readResource({ uri: `dki://memories/${b}` })).rejects.toThrow(`memory "${b}" not found`);
    expect(await fails(alice, "list_memories", { user_id: "bob" })).toMatch(/Unrecognized key/);
    expect(await call(alice, "delete_all_memories", { confirm: true })).toEqual({ deleted: 1 });
    expect(((await call(bob, "get_memory", { id: b })).memory as MemoryView).text).toBe(CELLO);
    expect(await fails(alice, "get_memory", { id: hiking!.id })).toBe(`memory "${hiking!.id}" not found`);

    // SIGTERM stops it in order: the HTTP server, then the system (cache flushed, store closed).
    const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
    child.kill("SIGTERM");
    expect(await exited).toBe(0);
    expect(stderr()).toMatch(/dki mcp: SIGTERM: stopped\n$/);
  });

  test("no key, an unknown key, another host or origin, another path or method: refused before any MCP message is read", async () => {
    const url = await httpServer(tempDir(), { [KEY_A]: "alice" });
    const init = JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "raw", version: "1" } } });
    const ok = await raw(url, { headers: { Authorization: `Bearer ${KEY_A}` }, body: init });
    expect(ok.status).toBe(200);
    expect(JSON.parse(ok.body)).toMatchObject({ result: { serverInfo: { name: "dki-memory" } } });

    expect(await raw(url, { body: init })).toMatchObject({ status: 401, body: expect.stringContaining("missing Authorization: Bearer <key>") });
    expect(await raw(url, { headers: { Authorization: "Bearer not-a-key-of-this-server" }, body: init })).toMatchObject({ status: 401, body: expect.stringContaining("unknown key") });
    expect(await raw(url, { headers: { Authorization: `Bearer ${KEY_A}`, Host: "evil.example:80" }, body: init })).toMatchObject({ status: 403 });
    expect(await raw(url, { headers: { Authorization: `Bearer ${KEY_A}`, Origin: "http://evil.example" }, body: init })).toMatchObject({ status: 403 });
    expect(await raw(url.replace(/\/mcp$/, "/other"), { headers: { Authorization: `Bearer ${KEY_A}` }, body: init })).toMatchObject({ status: 404 });
    expect(await raw(url, { method: "GET", headers: { Authorization: `Bearer ${KEY_A}` } })).toMatchObject({ status: 405 });
    expect(await raw(url, { headers: { Authorization: `Bearer ${KEY_A}` }, body: "{not json" })).toMatchObject({ status: 400, body: expect.stringContaining("parse error") });
    await expect(httpClient(url, "wrong-key-0123456789abcdef")).rejects.toThrow();
  });
});

describe("dki mcp refuses a configuration that would not fix the user", () => {
  test("no user for stdio, a user for HTTP, HTTP without keys, bad key files", async () => {
    const base = ["mcp", "--model", modelDir, "--data", tempDir()];
    expect(await dkiFails(base)).toBe("dki: dki mcp needs the user it serves: --user ID or DKI_MCP_USER (the tools never take a user)\n");
    expect(await dkiFails([...base, "--port", "0"])).toMatch(/--port serves over HTTP, where each request's user comes from its key: give --keys FILE/);
    const dir = tempDir();
    const write = (name: string, text: string) => {
      writeFileSync(join(dir, name), text);
      return join(dir, name);
    };
    const good = write("good.json", JSON.stringify({ "k-0123456789abcdef": "alice" }));
    expect(await dkiFails([...base, "--port", "0", "--keys", good, "--user", "alice"])).toMatch(/--user names the user of a stdio server; over HTTP \(--port\) each request's user comes from its key/);
    expect(await dkiFails([...base, "--keys", good, "--user", "alice"])).toMatch(/--keys is for the HTTP server: give --port with it/);
    expect(await dkiFails([...base, "--port", "0", "--keys", write("bad.json", "{nope")])).toMatch(/--keys .*bad\.json is not valid JSON/);
    expect(await dkiFails([...base, "--port", "0", "--keys", write("short.json", '{"abc": "alice"}')])).toMatch(/key 1 must be at least 16 characters/);
    expect(await dkiFails([...base, "--port", "0", "--keys", write("nouser.json", '{"k-0123456789abcdef": ""}')])).toMatch(/key 1 must map to a non-empty user id/);
    expect(await dkiFails([...base, "--port", "0", "--keys", write("empty.json", "{}")])).toMatch(/holds no keys/);
    expect(await dkiFails([...base, "--user", "alice", "--port", "70000"])).toMatch(/--port must be an integer in \[0, 65535\]/);
  });
});
