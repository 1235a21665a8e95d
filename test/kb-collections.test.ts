// Collections: get-or-create with settings (idempotent, other settings refused by name), the
// collection's chunk settings used by its ingestions, delete by metadata filter (one transaction,
// persisted, the index in step), and collections per tenant: a property test that no user ever
// gets another tenant's chunk through any read of the knowledge base's API.
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { KnowledgeBase } from "../src/rag/kb/knowledge-base.js";
import type { CollectionOwner } from "../src/rag/kb/tenancy.js";
import { HashingEmbedder } from "../src/memory/embedders/hashing.js";
import { Tokenizer } from "../src/tokenizer/tokenizer.js";
import { prng } from "./support/prng.js";
import { smollm2Tokenizer, tempDir } from "./support/paths.js";

let tok: Tokenizer;
let dir: string;
let kb: KnowledgeBase;
const embedder = new HashingEmbedder();

beforeAll(async () => {
  tok = await Tokenizer.fromFolder(smollm2Tokenizer);
  dir = tempDir();
  kb = await KnowledgeBase.open({ dir, embedder, tokenizer: tok });
});
afterAll(async () => {
  await kb.close();
});

describe("collections: get-or-create", () => {
  test("idempotent with the same settings; other settings refused, naming each; create refuses an existing one", async () => {
    const first = await kb.getOrCreateCollection("games", { chunk: { chunkTokens: 64, overlapTokens: 8 } });
    expect(first.created).toBe(true);
    expect(first.collection).toMatchObject({ name: "games", documents: 0, chunk: { chunkTokens: 64, overlapTokens: 8, minTailTokens: 16, strategy: "sentence" } });
    const again = await kb.getOrCreateCollection("games", { chunk: { chunkTokens: 64, overlapTokens: 8, minTailTokens: 16 } });
    expect(again).toEqual({ created: false, collection: first.collection });
    await expect(kb.getOrCreateCollection("games", { chunk: { chunkTokens: 128, overlapTokens: 8 } })).rejects.toThrow(/collection "games" exists with other settings: chunk\.chunkTokens is 64, not 128; chunk\.minTailTokens is 16, not 32$/);
    await expect(kb.getOrCreateCollection("games", { chunk: { chunkTokens: 64, overlapTokens: 8 }, owner: { userId: "alice" } })).rejects.toThrow(/owner is shared \(no owner\), not user "alice"/);
    await expect(kb.getOrCreateCollection("games")).rejects.toThrow(/chunk\.chunkTokens is 64, not 512; chunk\.overlapTokens is 8, not 64; chunk\.minTailTokens is 16, not 128/);
    await expect(kb.createCollection("games", { chunk: { chunkTokens: 64, overlapTokens: 8 } })).rejects.toThrow(/collection "games" already exists/);
    // Bad settings: refused before anything is written.
    await expect(kb.getOrCreateCollection("x1", { owner: { userId: "a", userPrefix: "b" } })).rejects.toThrow(/exactly one of userId and userPrefix/);
    await expect(kb.getOrCreateCollection("x1", { owner: { team: "a" } as never })).rejects.toThrow(/owner\.team is not a known field/);
    await expect(kb.getOrCreateCollection("x1", { chunks: {} } as never)).rejects.toThrow(/chunks is not a known setting/);
    await expect(kb.getOrCreateCollection("x1", { chunk: { chunkTokens: 2 } })).rejects.toThrow(/chunkTokens must be/);
    await expect(kb.getOrCreateCollection("bad name")).rejects.toThrow(/collection name "bad name"/);
    expect(kb.listCollections().map((c) => c.name)).toEqual(["games"]);
    // Concurrent get-or-create: one creates, the others get it.
    const all = await Promise.all(Array.from({ length: 5 }, () => kb.getOrCreateCollection("race-c", { owner: { userPrefix: "team-a/" } })));
    expect(all.filter((r) => r.created)).toHaveLength(1);
    expect(kb.getCollection("race-c").owner).toEqual({ userPrefix: "team-a/" });
  });

  test("a collection's chunk settings chunk its documents; an ingestion's own override them field by field", async () => {
    const text = Array.from({ length: 40 }, (_, i) => `Round ${i} of the game ended with a draw.`).join(" ");
    await kb.ingestText(text, { collection: "games", docId: "by-collection" });
    await kb.ingestText(text, { collection: "games", docId: "own", chunk: { chunkTokens: 200 } });
    const sizes = (doc: string) => kb.snapshot("games").chunks.filter((c) => c.docId === doc).map((c) => c.tokenCount);
    expect(Math.max(...sizes("by-collection"))).toBeLessThanOrEqual(64 + 15);
    expect(sizes("by-collection").length).toBeGreaterThan(sizes("own").length);
    expect(Math.max(...sizes("own"))).toBeGreaterThan(79);
    await kb.removeDocument("games", "by-collection");
    await kb.removeDocument("games", "own");
  });
});

describe("chunk settings and re-ingestion", () => {
  test("the chunk settings are part of a document's hash: the same text under another strategy is re-chunked, under the same one unchanged", async () => {
    const text = Array.from({ length: 30 }, (_, i) => `Clause ${i} says the office opens at nine.`).join(" ");
    const chunk = { chunkTokens: 40, overlapTokens: 0 };
    expect((await kb.ingestText(text, { collection: "rechunk", docId: "d", chunk: { ...chunk, strategy: "tokens" } })).status).toBe("added");
    const windows = kb.snapshot("rechunk").chunks.map((c) => c.text);
    expect(windows.some((t) => !t.endsWith("."))).toBe(true);
    expect((await kb.ingestText(text, { collection: "rechunk", docId: "d", chunk })).status).toBe("replaced");
    const sentences = kb.snapshot("rechunk").chunks.map((c) => c.text);
    expect(sentences.every((t) => t.endsWith("nine."))).toBe(true);
    expect((await kb.ingestText(text, { collection: "rechunk", docId: "d", chunk: { ...chunk, strategy: "sentence" } })).status).toBe("unchanged");
  });
});

describe("delete by metadata filter", () => {
  test("removes every matching document with its chunks, in one step; search and reopening agree", async () => {
    for (const session of ["s1", "s2", "s3"]) {
      for (let turn = 0; turn < 3; turn++) {
        await kb.ingestText(`Session ${session} turn ${turn}: the knight took the bishop on e5 and the dragon guarded the castle.`, { collection: "games", docId: `${session}-${turn}`, metadata: { sessionId: session, category: turn === 0 ? "opening" : "play", turn } });
      }
    }
    const before = kb.snapshot("games");
    const s2chunks = before.chunks.filter((c) => c.docId.startsWith("s2-")).map((c) => c.id);
    expect(s2chunks.length).toBeGreaterThan(0);
    const r = await kb.deleteWhere("games", { eq: { sessionId: "s2" } });
    expect(r).toEqual({ documents: ["s2-0", "s2-1", "s2-2"], chunks: s2chunks.length });
    for (const id of s2chunks) expect(kb.getChunk("games", id)).toBeUndefined();
    const hits = await kb.search("knight bishop dragon castle", { collection: "games", limit: 50 });
    expect(hits.length).toBe(6);
    expect(hits.some((h) => h.chunk.docId.startsWith("s2-"))).toBe(false);
    // and / or / in over custom fields; nothing matching removes nothing.
    expect(await kb.deleteWhere("games", { and: [{ eq: { sessionId: "s1" } }, { in: { turn: [1, 2] } }] })).toEqual({ documents: ["s1-1", "s1-2"], chunks: 2 });
    expect(await kb.deleteWhere("games", { eq: { sessionId: "nobody" } })).toEqual({ documents: [], chunks: 0 });
    // Bad filters are refused and remove nothing.
    const kept = JSON.stringify(kb.snapshot("games").chunks);
    await expect(kb.deleteWhere("games", { eq: { colour: "red" } })).rejects.toThrow(/filter: unknown field "colour"/);
    await expect(kb.deleteWhere("games", undefined as never)).rejects.toThrow(/deleteWhere needs a filter/);
    await expect(kb.deleteWhere("games", { or: [] })).rejects.toThrow(/non-empty array/);
    await expect(kb.deleteWhere("nope", { eq: { sessionId: "s1" } })).rejects.toThrow(/no collection "nope"/);
    expect(JSON.stringify(kb.snapshot("games").chunks)).toBe(kept);
    await kb.close();
    kb = await KnowledgeBase.open({ dir, embedder, tokenizer: tok });
    expect(kb.listDocuments("games").map((d) => d.docId)).toEqual(["s1-0", "s3-0", "s3-1", "s3-2"]);
    expect((await kb.search("knight bishop", { collection: "games", limit: 50 })).map((h) => h.chunk.docId).sort()).toEqual(["s1-0", "s3-0", "s3-1", "s3-2"]);
    expect(kb.getCollection("games").chunk.chunkTokens).toBe(64);
  });
});

describe("collections per tenant", () => {
  const USERS = ["alice", "bob", "team-a/x", "team-a/y", "team-b/z", "team-a/"];
  const OWNERS: (CollectionOwner | undefined)[] = [undefined, { userId: "alice" }, { userId: "bob" }, { userPrefix: "team-a/" }, { userPrefix: "team-b/" }, { userId: "team-a/x" }];
  const admits = (o: CollectionOwner | undefined, u: string | null) => o === undefined || (u !== null && (o.userId !== undefined ? o.userId === u : u.startsWith(o.userPrefix!) && u.length > o.userPrefix!.length));

  test("property: over random collections, owners and documents, no user reads another tenant's collection, document or chunk through any scoped API", async () => {
    const tdir = tempDir();
    const tkb = await KnowledgeBase.open({ dir: tdir, embedder, tokenizer: tok });
    const r = prng(40);
    const owners = new Map<string, CollectionOwner | undefined>();
    const chunksOf = new Map<string, Set<string>>();
    for (let c = 0; c < 10; c++) {
      const name = `col${c}`;
      const owner = OWNERS[Math.floor(r() * OWNERS.length)];
      owners.set(name, owner);
      await tkb.createCollection(name, owner === undefined ? {} : { owner });
      // Every collection holds the same words (so a search would find any of them) plus its own.
      for (let d = 0; d < 1 + Math.floor(r() * 3); d++) {
        await tkb.ingestText(`The secret recipe ${d} uses saffron and lemon. Collection marker zz${c}qq.`, { collection: name, docId: `d${d}`, metadata: { category: "recipes" } });
      }
      chunksOf.set(name, new Set(tkb.snapshot(name).chunks.map((x) => x.id)));
    }
    const names = [...owners.keys()];
    const hidden = (u: string | null, name: string) => !admits(owners.get(name), u);
    let visibleReads = 0;
    for (const u of [...USERS, null]) {
      const view = tkb.forUser(u);
      const listed = view.listCollections().map((c) => c.name);
      expect(listed.sort()).toEqual(names.filter((n) => !hidden(u, n)).sort());
      for (const name of names) {
        const calls: (() => unknown)[] = [
          () => view.getCollection(name),
          () => view.listDocuments(name),
          () => view.getDocument(name, "d0"),
          () => view.getChunk(name, [...chunksOf.get(name)!][0]),
          () => view.search("secret recipe saffron lemon", { collection: name, limit: 20 }),
          () => view.searchDetailed("secret recipe", { collection: name, filter: { eq: { category: "recipes" } } }),
          () => view.retrieve("saffron", { collection: name, userId: u as string }),
          () => tkb.retrieve("saffron", { collection: name, userId: u as string }),
        ];
        expect(view.hasCollection(name)).toBe(!hidden(u, name));
        for (const call of calls) {
          if (u === null && calls.indexOf(call) >= 6) continue; // retrieve is always for a user
          if (hidden(u, name)) {
            const e = await Promise.resolve().then(call).then(() => null, (err: Error) => err);
            expect(e?.message, `${u} reached ${name}`).toMatch(new RegExp(`^no collection "${name}"`));
            // The error lists only what this user may see: another tenant's names do not leak.
            for (const other of names) if (hidden(u, other)) expect(e!.message).not.toMatch(new RegExp(`\\b${other}\\b(?!")`));
          } else {
            const out = await Promise.resolve().then(call);
            visibleReads++;
            // Whatever comes back is this collection's.
            const found = JSON.stringify(out ?? null).match(/zz\d+qq/g) ?? [];
            for (const m of found) expect(m).toBe(`zz${name.slice(3)}qq`);
          }
        }
      }
    }
    expect(visibleReads).toBeGreaterThan(50);
    // The unscoped KnowledgeBase (its owner: the library caller, an admin) sees everything.
    expect(tkb.listCollections()).toHaveLength(10);
    expect(() => tkb.forUser("")).toThrow(/non-empty user id/);
    // Erasing a user: the collections owned by exactly that user go, with their chunks; a group's stay.
    const alices = names.filter((n) => owners.get(n)?.userId === "alice");
    expect(alices.length).toBeGreaterThan(0);
    expect(await tkb.removeCollectionsOwnedBy("alice")).toEqual(alices);
    expect(tkb.listCollections().map((c) => c.name)).toEqual(names.filter((n) => !alices.includes(n)));
    for (const n of alices) expect(tkb.forUser("alice").hasCollection(n)).toBe(false);
    expect(await tkb.removeCollectionsOwnedBy("team-a/")).toEqual(names.filter((n) => owners.get(n)?.userId === "team-a/"));
    await tkb.close();
  });
});
