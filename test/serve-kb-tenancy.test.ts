// Knowledge-base collections through `dki serve` beyond ingest and search: get-or-create with
// settings (admin; 201, 200, 409 naming the difference), delete by metadata filter (admin), and
// collections per tenant: over random owners, every key on every read route (list, documents,
// search, a RAG turn) gets only chunks of collections its user may see; another tenant's
// collection is a 404 exactly like a missing one.
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { MemoryStore } from "../src/memory/index.js";
import { ApiKeys } from "../src/server/auth.js";
import { prng } from "./support/prng.js";
import { tempDir } from "./support/paths.js";
import { call, makeTinyModel, startServer, type Running } from "./support/serve.js";

const ADMIN = "kbt-admin-0123456789abcdef";
const ALICE = "kbt-alice-0123456789abcdef";
const BOB = "kbt-bob-00-0123456789abcdef";
const TEAM = "kbt-team-a-0123456789abcdef"; // users team-a/…, no default user
let running: Running;

beforeAll(async () => {
  const model = await makeTinyModel();
  const data = join(tempDir(), "data");
  await (await MemoryStore.open({ dir: data })).close();
  running = await startServer(model, data, { keys: ApiKeys.fromJson({ keys: [{ key: ADMIN, admin: true }, { key: ALICE, users: ["alice"] }, { key: BOB, users: ["bob"] }, { key: TEAM, userPrefix: "team-a/" }] }) });
});
afterAll(async () => {
  await running?.server.close();
});

const req = (method: string, path: string, key: string, body?: unknown) => call(running.url, method, path, { key, ...(body !== undefined ? { body } : {}) });

describe("dki serve: collection settings and delete by filter", () => {
  test("PUT /v1/collections/{c}: get-or-create (admin only), other settings 409 naming them", async () => {
    const settings = { chunk: { chunk_tokens: 128, overlap_tokens: 16 } };
    expect((await req("PUT", "/v1/collections/games", ALICE, settings)).status).toBe(403);
    const made = await req("PUT", "/v1/collections/games", ADMIN, settings);
    expect(made.status, made.text).toBe(201);
    expect(made.json).toMatchObject({ name: "games", created: true, owner: null, chunk: { chunk_tokens: 128, overlap_tokens: 16, min_tail_tokens: 32, strategy: "sentence" } });
    const again = await req("PUT", "/v1/collections/games", ADMIN, settings);
    expect(again.status).toBe(200);
    expect(again.json).toMatchObject({ created: false });
    const other = await req("PUT", "/v1/collections/games", ADMIN, { chunk: { chunk_tokens: 256, overlap_tokens: 16 } });
    expect(other.status).toBe(409);
    expect(other.json).toMatchObject({ error: { code: "collection_settings_differ" } });
    expect((other.json as { error: { message: string } }).error.message).toMatch(/chunk\.chunkTokens is 128, not 256/);
    expect((await req("PUT", "/v1/collections/x2", ADMIN, { owner: { user_id: "a", user_prefix: "b" } })).status).toBe(400);
    expect((await req("PUT", "/v1/collections/x2", ADMIN, { colour: "red" })).status).toBe(400);
    // No body at all: the default settings.
    const bare = await req("PUT", "/v1/collections/plain", ADMIN);
    expect(bare.status, bare.text).toBe(201);
    expect(bare.json).toMatchObject({ name: "plain", chunk: { chunk_tokens: 512 } });
    expect((await req("GET", "/v1/collections", ADMIN)).json).toMatchObject({ results: [{ name: "games" }, { name: "plain" }] });
  });

  test("POST /v1/collections/{c}/documents/delete: every document a filter matches (admin only)", async () => {
    for (const s of ["s1", "s2"]) for (const t of [1, 2]) {
      const r = await req("POST", "/v1/collections/games/documents", ADMIN, { doc_id: `${s}-${t}`, text: `Game ${s} move ${t}: the rook took the pawn.`, metadata: { sessionId: s } });
      expect(r.status, r.text).toBe(201);
    }
    expect((await req("POST", "/v1/collections/games/documents/delete", ALICE, { filter: { eq: { sessionId: "s1" } } })).status).toBe(403);
    const bad = await req("POST", "/v1/collections/games/documents/delete", ADMIN, { filter: { eq: { colour: "red" } } });
    expect(bad.status).toBe(400);
    expect((bad.json as { error: { message: string } }).error.message).toMatch(/unknown field "colour"/);
    expect((await req("POST", "/v1/collections/games/documents/delete", ADMIN, {})).status).toBe(400);
    expect((await req("POST", "/v1/collections/nope/documents/delete", ADMIN, { filter: { eq: { sessionId: "s1" } } })).status).toBe(404);
    const del = await req("POST", "/v1/collections/games/documents/delete", ADMIN, { filter: { eq: { sessionId: "s1" } } });
    expect(del.status, del.text).toBe(200);
    expect(del.json).toEqual({ deleted: ["s1-1", "s1-2"], documents: 2, chunks: 2 });
    const left = await req("GET", "/v1/collections/games/documents", ALICE);
    expect((left.json as { results: { doc_id: string }[] }).results.map((d) => d.doc_id)).toEqual(["s2-1", "s2-2"]);
    const hits = await req("POST", "/v1/collections/games/search", ALICE, { query: "rook pawn game", limit: 10 });
    expect((hits.json as { results: { doc_id: string }[] }).results.map((d) => d.doc_id).sort()).toEqual(["s2-1", "s2-2"]);
  });
});

describe("dki serve: collections per tenant", () => {
  test("property: over random owners, no key gets another tenant's chunk through list, documents, search or a RAG turn", async () => {
    const r = prng(9);
    const OWNERS = [null, { user_id: "alice" }, { user_id: "bob" }, { user_prefix: "team-a/" }, { user_id: "team-a/x" }];
    const owners = new Map<string, (typeof OWNERS)[number]>();
    for (let c = 0; c < 6; c++) {
      const name = `t${c}`;
      const owner = c < OWNERS.length ? OWNERS[c] : OWNERS[Math.floor(r() * OWNERS.length)];
      owners.set(name, owner);
      expect((await req("PUT", `/v1/collections/${name}`, ADMIN, owner === null ? {} : { owner })).status).toBe(201);
      expect((await req("POST", `/v1/collections/${name}/documents`, ADMIN, { doc_id: "recipe", text: `The secret recipe uses saffron and lemon. Marker zz${c}qq.` })).status).toBe(201);
    }
    const admits = (o: (typeof OWNERS)[number], u: string | null) => o === null || (u !== null && ("user_id" in o ? o.user_id === u : u.startsWith(o.user_prefix) && u.length > o.user_prefix.length));
    // Each key as the user it acts for (null: a key of several users naming none sees shared ones only).
    const cases: { key: string; user?: string; sees: string | null }[] = [
      { key: ALICE, sees: "alice" },
      { key: BOB, sees: "bob" },
      { key: TEAM, sees: null },
      { key: TEAM, user: "team-a/x", sees: "team-a/x" },
      { key: TEAM, user: "team-a/y", sees: "team-a/y" },
      { key: ADMIN, user: "bob", sees: "bob" },
    ];
    let reached = 0;
    for (const k of cases) {
      const q = k.user !== undefined ? `?user_id=${encodeURIComponent(k.user)}` : "";
      const leaks = (text: string) => (text.match(/zz\d+qq/g) ?? []).filter((m) => !admits(owners.get(`t${m.slice(2, -2)}`)!, k.sees));
      const list = await req("GET", `/v1/collections${q}`, k.key);
      expect(list.status).toBe(200);
      expect((list.json as { results: { name: string }[] }).results.map((c) => c.name).filter((n) => n.startsWith("t")).sort()).toEqual([...owners].filter(([, o]) => admits(o, k.sees)).map(([n]) => n));
      for (const [name, owner] of owners) {
        const visible = admits(owner, k.sees);
        const responses = [
          await req("GET", `/v1/collections/${name}/documents${q}`, k.key),
          await req("POST", `/v1/collections/${name}/search`, k.key, { query: "secret recipe saffron", limit: 10, ...(k.user !== undefined ? { user_id: k.user } : {}) }),
        ];
        if (k.sees !== null) {
          responses.push(await req("POST", "/v1/chat/completions", k.key, { model: "tiny", user: k.sees, max_tokens: 1, messages: [{ role: "user", content: "What does the secret recipe use?" }], dki: { mode: "rag", collection: name } }));
        }
        for (const res of responses) {
          expect(leaks(res.text), `${k.sees} got another tenant's chunk`).toEqual([]);
          if (visible) {
            expect(res.status, res.text).toBe(200);
            expect(res.text).toContain('"recipe"'); // the document, its chunk, or the chunk the turn used
            reached++;
          } else {
            expect(res.status, `${k.sees} reached ${name}`).toBe(404);
            expect(res.text).not.toContain(`zz${name.slice(1)}qq`);
          }
        }
      }
      // A user the key may not act for reads as not found.
      if (k.key === ALICE) expect((await req("GET", "/v1/collections?user_id=bob", ALICE)).status).toBe(404);
    }
    expect(reached).toBeGreaterThan(10);
    // Erasing a user removes the collections that user owns alone; a group's (prefix) stay.
    const aliceOwns = [...owners].filter(([, o]) => o !== null && "user_id" in o && o.user_id === "alice").map(([n]) => n);
    expect(aliceOwns.length).toBeGreaterThan(0);
    const erased = await req("DELETE", "/v1/users/alice", ADMIN);
    expect(erased.status, erased.text).toBe(200);
    expect(erased.json).toMatchObject({ erased: { kb_collections: aliceOwns } });
    const after = ((await req("GET", "/v1/collections", ADMIN)).json as { results: { name: string }[] }).results.map((c) => c.name);
    for (const n of aliceOwns) expect(after).not.toContain(n);
    expect(after).toEqual(expect.arrayContaining([...owners].filter(([, o]) => o === null || !("user_id" in o) || o.user_id !== "alice").map(([n]) => n)));
    for (const n of aliceOwns) expect((await req("POST", `/v1/collections/${n}/search`, ALICE, { query: "secret recipe" })).status).toBe(404);
    // The admin naming no user sees every collection.
    expect((await req("GET", "/v1/collections", ADMIN)).json).toMatchObject({ results: expect.arrayContaining([...owners.keys()].filter((n) => !aliceOwns.includes(n)).map((name) => expect.objectContaining({ name }))) });
  });
});
