// API keys and tenant isolation on `dki serve`: every request's user is checked against its key
// by the server, never taken from the body alone. Each user holds secrets (a memory, a
// preference, a recorded message); every key asks every endpoint about every user and every
// record id, and no response may hold a secret of a user the key may not act for. A key gets the
// same answer for another tenant's user or record as for one that does not exist.
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { ApiKeys } from "../src/server/auth.js";
import { MemoryStore } from "../src/memory/index.js";
import { prng } from "./support/prng.js";
import { tempDir } from "./support/paths.js";
import { call, makeTinyModel, startServer, type Running } from "./support/serve.js";

const USERS = ["alice", "bob", "team/carol", "team/dave", "eve"];
/** A user no key's data holds, to compare "not yours" with "not there". */
const GHOST = "team/ghost";
const KEYS = {
  alice: { key: "k-alice-0123456789abcdef", users: ["alice"] },
  team: { key: "k-team-0123456789abcdef", userPrefix: "team/" },
  bobEve: { key: "k-bobeve-0123456789abcdef", users: ["bob", "eve"] },
  admin: { key: "k-admin-0123456789abcdef", admin: true },
};
type KeyName = keyof typeof KEYS;
const may = (k: KeyName, u: string): boolean => {
  const e = KEYS[k] as { users?: string[]; userPrefix?: string; admin?: boolean };
  return e.admin === true || (e.users ?? []).includes(u) || (e.userPrefix !== undefined && u.startsWith(e.userPrefix));
};

interface Owned {
  secrets: string[];
  memoryId: string;
  preferenceId: string;
  sessionId: string;
}
const owned = new Map<string, Owned>();
let running: Running;

beforeAll(async () => {
  const model = await makeTinyModel();
  const data = join(tempDir(), "data");
  const rand = prng(38);
  const word = () => Array.from({ length: 10 }, () => "bcdfghjkmnpqrstvwxz"[Math.floor(rand() * 19)]).join("");
  const store = await MemoryStore.open({ dir: data });
  for (const u of USERS) {
    const [m, p, q] = [word(), word(), word()];
    const [mem] = await store.memories.add(`The user's code word is ${m}.`, { userId: u });
    const pref = await store.preferences.add(`always mention ${p}`, { userId: u, type: "style" });
    owned.set(u, { secrets: [m, p, q], memoryId: mem.id, preferenceId: pref.id, sessionId: "" });
  }
  await store.close();
  running = await startServer(model, data, { keys: ApiKeys.fromJson({ keys: Object.entries(KEYS).map(([name, k]) => ({ name, ...k })) }) });
  // Each user's recorded conversation, its query holding the user's third secret.
  for (const u of USERS) {
    const o = owned.get(u)!;
    const r = await call(running.url, "POST", "/v1/chat/completions", { key: KEYS.admin.key, body: { model: "tiny", user: u, max_tokens: 2, messages: [{ role: "user", content: `remember ${o.secrets[2]}` }] } });
    expect(r.status, r.text).toBe(200);
    o.sessionId = (r.json as { dki: { session: string } }).dki.session;
  }
});

afterAll(async () => {
  await running?.server.close();
});

/** Every secret of a user key `k` may not act for that `text` holds. */
function leaked(k: KeyName, text: string): string[] {
  return USERS.filter((u) => !may(k, u)).flatMap((u) => owned.get(u)!.secrets.filter((s) => text.includes(s)).map((s) => `${u}:${s}`));
}

describe("dki serve: API keys", () => {
  test("no key, a malformed header or a wrong key: 401 with an OpenAI error, on every route but /health and /metrics", async () => {
    const routes: [string, string, unknown?][] = [
      ["GET", "/v1/models"],
      ["POST", "/v1/chat/completions", { model: "tiny", messages: [{ role: "user", content: "hi" }] }],
      ["POST", "/v1/embeddings", { model: "tiny", input: "x" }],
      ["GET", "/v1/memories?user_id=alice"],
      ["DELETE", "/v1/users/alice"],
    ];
    for (const [method, path, body] of routes) {
      for (const headers of [{}, { authorization: "Basic abc" }, { authorization: "Bearer k-wrong-0123456789abcdef" }] as Record<string, string>[]) {
        const r = await call(running.url, method, path, { body, headers });
        expect(r.status, `${method} ${path} ${JSON.stringify(headers)}`).toBe(401);
        expect(r.json).toMatchObject({ error: { type: "authentication_error" } });
        expect(leaked("alice", r.text)).toEqual([]);
      }
    }
    expect((await call(running.url, "GET", "/health")).status).toBe(200);
    expect((await call(running.url, "GET", "/metrics")).status).toBe(200);
    // Alice's data is still there (the refused DELETE did nothing).
    const mine = await call(running.url, "GET", "/v1/memories", { key: KEYS.alice.key });
    expect(mine.text).toContain(owned.get("alice")!.secrets[0]);
  });

  test("the key file is checked, each problem named with its place", () => {
    expect(() => ApiKeys.fromJson({ keys: [{ key: "short", users: ["a"] }] })).toThrow(/keys\[0\]\.key must be a string of at least 16 characters/);
    expect(() => ApiKeys.fromJson({ keys: [{ key: "0123456789abcdefgh" }] })).toThrow(/keys\[0\] may act for no user/);
    expect(() => ApiKeys.fromJson({ keys: [{ key: "0123456789abcdefgh", users: ["a"], scope: "x" }] })).toThrow(/keys\[0\]\.scope is not a known field/);
    expect(() => ApiKeys.fromJson({ keys: [{ key: "0123456789abcdefgh", users: ["a"] }, { key: "0123456789abcdefgh", users: ["b"] }] })).toThrow(/keys\[1\]\.key repeats an earlier key/);
    expect(() => ApiKeys.fromJson([])).toThrow(/must be a JSON object/);
  });
});

describe("dki serve: tenant isolation", () => {
  test("every key × every endpoint × every user and record id: no other tenant's memory, preference or message, and 'not yours' reads as 'not there'", async () => {
    const allMemoryIds = [...USERS.map((u) => owned.get(u)!.memoryId), "mem_doesnotexist0000000000"];
    const allPrefIds = [...USERS.map((u) => owned.get(u)!.preferenceId), "pref_doesnotexist000000000"];
    const allSessions = [...USERS.map((u) => owned.get(u)!.sessionId), "api-no-such-session"];
    const everySecret = USERS.flatMap((u) => owned.get(u)!.secrets).join(" ");
    let checked = 0;
    for (const k of Object.keys(KEYS) as KeyName[]) {
      const key = KEYS[k].key;
      const ask = async (method: string, path: string, body?: unknown) => {
        const r = await call(running.url, method, path, { key, body });
        expect(leaked(k, r.text), `${k} ${method} ${path}`).toEqual([]);
        checked++;
        return r;
      };
      for (const u of [...USERS, GHOST]) {
        const q = `user_id=${encodeURIComponent(u)}`;
        const allowed = may(k, u);
        const own = owned.get(u);
        const notFoundOrOk = async (method: string, path: string, body: unknown, mine: boolean) => {
          const r = await ask(method, path, body);
          if (!allowed || !mine) {
            expect(r.status, `${k} ${method} ${path}`).toBe(404);
            expect((r.json as { error: { type: string } }).error.type).toBe("not_found_error");
          }
          return r;
        };
        // Lists and search: the user's own data, or 404 for a user the key may not act for.
        const list = await notFoundOrOk("GET", `/v1/memories?${q}`, undefined, true);
        if (allowed && own) expect(list.text).toContain(own.secrets[0]);
        await notFoundOrOk("POST", "/v1/memories/search", { query: everySecret, user_id: u, limit: 50 }, true);
        const prefs = await notFoundOrOk("GET", `/v1/preferences?${q}`, undefined, true);
        if (allowed && own) expect(prefs.text).toContain(own.secrets[1]);
        await notFoundOrOk("GET", `/v1/sessions?${q}`, undefined, true);
        // Every record id, the user's own and everyone else's (and one that names nothing).
        for (const id of allMemoryIds) {
          const mine = own?.memoryId === id;
          await notFoundOrOk("GET", `/v1/memories/${id}?${q}`, undefined, mine);
          await notFoundOrOk("GET", `/v1/memories/${id}/history?${q}`, undefined, mine);
          if (!mine) {
            await notFoundOrOk("PUT", `/v1/memories/${id}`, { text: "overwritten", user_id: u }, false);
            await notFoundOrOk("DELETE", `/v1/memories/${id}?${q}`, undefined, false);
          }
        }
        for (const id of allPrefIds) {
          if (own?.preferenceId === id) continue;
          await notFoundOrOk("PUT", `/v1/preferences/${id}`, { priority: 9, user_id: u }, false);
          await notFoundOrOk("DELETE", `/v1/preferences/${id}?${q}`, undefined, false);
        }
        for (const sid of allSessions) {
          const r = await notFoundOrOk("GET", `/v1/sessions/${sid}/messages?${q}`, undefined, own?.sessionId === sid);
          if (allowed && own?.sessionId === sid) expect(r.text).toContain(own.secrets[2]);
        }
        // A chat turn naming the user: injected memories only its own (α forced, so any routed memory is injected).
        const chat = await ask("POST", "/v1/chat/completions", { model: "tiny", user: u, max_tokens: 1, messages: [{ role: "user", content: everySecret }], dki: { alpha: 1, max_memories: 20 } });
        if (allowed) {
          expect(chat.status).toBe(200);
          const used = (chat.json as { dki: { memories: { id: string }[] } }).dki.memories.map((m) => m.id);
          expect(used).toEqual(own ? [own.memoryId] : []);
        } else {
          expect(chat.status).toBe(403);
          expect(chat.json).toMatchObject({ error: { type: "permission_error", param: "user" } });
        }
        // Writes for a user the key may not act for are refused and leave nothing.
        await notFoundOrOk("POST", "/v1/memories", { user_id: u, memory: "planted by another tenant" }, true);
        await notFoundOrOk("POST", "/v1/preferences", { user_id: u, preference: "planted", type: "style" }, true);
      }
      // "Not yours" and "not there" are one answer: another tenant's existing user and record read exactly as missing ones.
      const foreign = USERS.find((u) => !may(k, u));
      if (foreign !== undefined) {
        const a = await ask("GET", `/v1/memories?user_id=${encodeURIComponent(foreign)}`);
        const b = await ask("GET", `/v1/memories?user_id=${encodeURIComponent("nobody-" + foreign)}`);
        expect(a.text).toBe(b.text);
        const mineUser = USERS.find((u) => may(k, u))!;
        const c = await ask("GET", `/v1/memories/${owned.get(foreign)!.memoryId}?user_id=${encodeURIComponent(mineUser)}`);
        const d = await ask("GET", `/v1/memories/mem_doesnotexist0000000000?user_id=${encodeURIComponent(mineUser)}`);
        expect(c.status).toBe(404);
        expect(c.text).toBe(d.text);
      }
      // Only an admin key lists users.
      const users = await ask("GET", "/v1/users");
      expect(users.status).toBe(k === "admin" ? 200 : 403);
    }
    expect(checked).toBeGreaterThan(1000);

    // Nothing planted, overwritten or deleted across tenants: each user still has exactly its own records.
    for (const u of USERS) {
      const o = owned.get(u)!;
      const mems = (await call(running.url, "GET", `/v1/memories?user_id=${encodeURIComponent(u)}`, { key: KEYS.admin.key })).json as { results: { id: string; memory: string }[] };
      const planted = mems.results.filter((m) => m.memory === "planted by another tenant").length;
      expect(mems.results.filter((m) => m.id === o.memoryId).map((m) => m.memory)).toEqual([`The user's code word is ${o.secrets[0]}.`]);
      // Each key that may act for u planted one memory (allowed writes); none came from a key that may not.
      expect(planted).toBe((Object.keys(KEYS) as KeyName[]).filter((k) => may(k, u)).length);
      const prefs = (await call(running.url, "GET", `/v1/preferences?user_id=${encodeURIComponent(u)}`, { key: KEYS.admin.key })).json as { results: { id: string; priority: number }[] };
      expect(prefs.results.find((p) => p.id === o.preferenceId)?.priority).not.toBe(9);
    }
  });

  test("a key without a default user must name one; a key with one acts for it", async () => {
    const none = await call(running.url, "POST", "/v1/chat/completions", { key: KEYS.bobEve.key, body: { model: "tiny", max_tokens: 1, messages: [{ role: "user", content: "hi" }] } });
    expect(none.status).toBe(400);
    expect(none.json).toMatchObject({ error: { param: "user", code: "missing_user" } });
    const alice = await call(running.url, "GET", "/v1/memories", { key: KEYS.alice.key });
    expect(alice.status).toBe(200);
    expect(alice.text).toContain(owned.get("alice")!.secrets[0]);
  });

  test("DELETE of a user: refused (404) for a key that may not act for it; for one that may, store, index and K/V tiers are cleared", async () => {
    const r = await call(running.url, "DELETE", "/v1/users/eve", { key: KEYS.alice.key });
    expect(r.status).toBe(404);
    expect((await call(running.url, "GET", "/v1/memories?user_id=eve", { key: KEYS.bobEve.key })).text).toContain(owned.get("eve")!.secrets[0]);
    const del = await call(running.url, "DELETE", "/v1/users/eve", { key: KEYS.bobEve.key });
    expect(del.status, del.text).toBe(200);
    expect(del.json).toMatchObject({ user_id: "eve", erased: { kv_cache_cleared: true } });
    expect((del.json as { erased: { memories: number; turns: number } }).erased.memories).toBeGreaterThan(0);
    const after = await call(running.url, "GET", "/v1/memories?user_id=eve", { key: KEYS.bobEve.key });
    expect(after.json).toEqual({ results: [] });
    const search = await call(running.url, "POST", "/v1/memories/search", { key: KEYS.bobEve.key, body: { query: owned.get("eve")!.secrets.join(" "), user_id: "eve" } });
    expect(search.json).toEqual({ results: [] });
    const chat = await call(running.url, "POST", "/v1/chat/completions", { key: KEYS.bobEve.key, body: { model: "tiny", user: "eve", max_tokens: 1, messages: [{ role: "user", content: owned.get("eve")!.secrets.join(" ") }], dki: { alpha: 1 } } });
    expect((chat.json as { dki: { memories: unknown[] } }).dki.memories).toEqual([]);
    // The erasure is audited without the user's id.
    expect(running.systems.store.systemAudit().some((e) => e.action === "user_erase" && e.userId !== "eve")).toBe(true);
  });
});
