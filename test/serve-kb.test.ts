// Knowledge-base collections through `dki serve`: an admin key ingests and removes documents,
// any key lists and searches them, and a RAG turn with dki.collection puts the matching chunks in
// its prompt and names them in its dki object.
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { MemoryStore } from "../src/memory/index.js";
import { ApiKeys } from "../src/server/auth.js";
import { tempDir } from "./support/paths.js";
import { call, makeTinyModel, startServer, type Running } from "./support/serve.js";

const ADMIN = "kb-admin-0123456789abcdef";
const ALICE = "kb-alice-0123456789abcdef";
const HANDBOOK = "# Leave\nEvery employee gets 25 days of paid vacation a year.\n# Parking\nThe garage has 120 spaces for bicycles and cars.";
let running: Running;

beforeAll(async () => {
  const model = await makeTinyModel();
  const data = join(tempDir(), "data");
  await (await MemoryStore.open({ dir: data })).close();
  running = await startServer(model, data, { keys: ApiKeys.fromJson({ keys: [{ key: ADMIN, admin: true }, { key: ALICE, users: ["alice"] }] }) });
});

afterAll(async () => {
  await running?.server.close();
});

describe("dki serve: knowledge-base collections", () => {
  test("ingest (admin only), list, search, a RAG turn over the collection, remove", async () => {
    const doc = { doc_id: "handbook.md", text: HANDBOOK, doc_type: "markdown", metadata: { category: "hr" } };
    const refused = await call(running.url, "POST", "/v1/collections/handbook/documents", { key: ALICE, body: doc });
    expect(refused.status).toBe(403);
    expect(refused.json).toMatchObject({ error: { type: "permission_error", code: "admin_only" } });
    const added = await call(running.url, "POST", "/v1/collections/handbook/documents", { key: ADMIN, body: doc });
    expect(added.status, added.text).toBe(201);
    expect(added.json).toMatchObject({ doc_id: "handbook.md", status: "added" });
    expect((await call(running.url, "POST", "/v1/collections/handbook/documents", { key: ADMIN, body: doc })).json).toMatchObject({ status: "unchanged" });

    const cols = await call(running.url, "GET", "/v1/collections", { key: ALICE });
    expect(cols.json).toMatchObject({ results: [{ name: "handbook", documents: 1 }] });
    const docs = await call(running.url, "GET", "/v1/collections/handbook/documents", { key: ALICE });
    expect(docs.json).toMatchObject({ results: [{ doc_id: "handbook.md", doc_type: "markdown" }] });

    const hits = await call(running.url, "POST", "/v1/collections/handbook/search", { key: ALICE, body: { query: "how many vacation days", limit: 1, filter: { eq: { category: "hr" } } } });
    expect(hits.status, hits.text).toBe(200);
    const top = (hits.json as { results: { doc_id: string; text: string; heading_path: string[] }[] }).results[0];
    expect(top).toMatchObject({ doc_id: "handbook.md", heading_path: ["Leave"] });
    expect(top.text).toContain("25 days");
    const badFilter = await call(running.url, "POST", "/v1/collections/handbook/search", { key: ALICE, body: { query: "x", filter: { eq: { colour: "red" } } } });
    expect(badFilter.status).toBe(400);
    expect((badFilter.json as { error: { message: string } }).error.message).toMatch(/colour/);
    expect((await call(running.url, "POST", "/v1/collections/nope/search", { key: ALICE, body: { query: "x" } })).status).toBe(404);

    const question = { model: "tiny", user: "alice", max_tokens: 2, messages: [{ role: "user", content: "How many vacation days do I get?" }] };
    const plain = await call(running.url, "POST", "/v1/chat/completions", { key: ALICE, body: { ...question, dki: { mode: "rag" } } });
    const withKb = await call(running.url, "POST", "/v1/chat/completions", { key: ALICE, body: { ...question, dki: { mode: "rag", collection: "handbook" } } });
    expect(withKb.status, withKb.text).toBe(200);
    const info = withKb.json as { dki: { chunks: { doc_id: string; heading_path: string[] }[] }; usage: { prompt_tokens: number } };
    expect(info.dki.chunks.map((c) => c.doc_id)).toContain("handbook.md");
    expect(info.usage.prompt_tokens).toBeGreaterThan((plain.json as { usage: { prompt_tokens: number } }).usage.prompt_tokens);
    expect((await call(running.url, "POST", "/v1/chat/completions", { key: ALICE, body: { ...question, dki: { collection: "handbook" } } })).json).toMatchObject({ error: { param: "dki.collection" } });
    expect((await call(running.url, "POST", "/v1/chat/completions", { key: ALICE, body: { ...question, dki: { mode: "rag", collection: "nope" } } })).status).toBe(404);

    expect((await call(running.url, "DELETE", "/v1/collections/handbook/documents/handbook.md", { key: ALICE })).status).toBe(403);
    expect((await call(running.url, "DELETE", "/v1/collections/handbook/documents/handbook.md", { key: ADMIN })).status).toBe(200);
    expect((await call(running.url, "DELETE", "/v1/collections/handbook/documents/handbook.md", { key: ADMIN })).status).toBe(404);
    expect((await call(running.url, "GET", "/v1/collections/handbook/documents", { key: ALICE })).json).toEqual({ results: [] });
  });
});
