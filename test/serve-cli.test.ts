// `dki serve` from the command line: its usage errors (one line naming the flag or file, exit 1,
// before it listens), a key file and config file read from disk, and the CLI's store commands
// beside a running server (the store serves several processes: a memory added by `dki memory add`
// is injected in the server's next turn; `dki user erase`, which needs the K/V cache the server
// holds, says to erase through the server).
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, describe, expect, test } from "vitest";
import { dki, dkiFails } from "./support/dki-bin.js";
import { repoRoot, tempDir } from "./support/paths.js";
import { call, makeTinyModel, spawnServer, storeWithAlice } from "./support/serve.js";

let model: string;
let data: string;

beforeAll(async () => {
  model = await makeTinyModel();
  data = await storeWithAlice();
});

describe("dki serve: the command", () => {
  test("usage errors name the flag or the file", async () => {
    const dir = tempDir();
    const file = (name: string, text: string) => {
      const p = join(dir, name);
      writeFileSync(p, text);
      return p;
    };
    expect(await dkiFails(["serve", "--model", model, "--data", join(dir, "missing")])).toMatch(/^dki: --data .*missing: no memory store there .*; or give --init to start an empty one\n$/);
    expect(await dkiFails(["serve", "--model", model, "--data", data, "--api-key-file", file("k1.json", "{nope")])).toMatch(/^dki: --api-key-file .*k1\.json is not valid JSON/);
    expect(await dkiFails(["serve", "--model", model, "--data", data, "--api-key-file", file("k2.json", '{"keys":[{"key":"0123456789abcdefgh","users":[]}]}')])).toBe(`dki: ${join(dir, "k2.json")}: keys[0] may act for no user: give users, userPrefix or admin: true\n`);
    expect(await dkiFails(["serve", "--model", model, "--data", data, "--config", file("c1.json", '{"maxMemories": -1}')])).toBe(`dki: --config ${join(dir, "c1.json")}: config.maxMemories must be an integer >= 0, got -1\n`);
    // YAML too, read by the same reader as dki chat's --config.
    expect(await dkiFails(["serve", "--model", model, "--data", data, "--config", file("c2.yaml", "maxMemory: 1\n")])).toMatch(/^dki: --config .*c2\.yaml: config has no key "maxMemory"/);
    expect(await dkiFails(["serve", "--model", model, "--data", data, "--port", "70000"])).toBe('dki: option \'--port <n>\' argument \'70000\' is invalid. --port must be an integer in [0, 65535], got "70000" (see --help)\n');
  });

  test("--rerank-model: the cross-encoder picks the memory both modes use from the search's candidates; a bad folder or --rerank-depth alone is a usage error", async () => {
    const dir = tempDir();
    const store = join(dir, "data");
    const q = "What is the name of the user's dog?";
    // The hashing search ranks the first (it repeats the question's words) above the answer.
    const ids: string[] = [];
    for (const text of ["User: What is the name of that dog in the park? The user's dog is cute.", "User: I have a dog named Corsadro.", "User: My friend Mia has a dog named Pelvorin."]) {
      ids.push((JSON.parse((await dki(["memory", "add", "--data", store, "--user", "alice", "--format", "json", text])).stdout) as { id: string }).id);
    }
    const config = join(dir, "dki.json");
    writeFileSync(config, JSON.stringify({ maxMemories: 1 }));
    const reranker = join(repoRoot, "models", "memory-qa-reranker");
    const ask = async (url: string, mode: "dki" | "rag") => {
      const r = await call(url, "POST", "/v1/chat/completions", { body: { model: "tiny", max_tokens: 1, user: "alice", messages: [{ role: "user", content: q }], dki: mode === "dki" ? { mode, alpha: 1 } : { mode } } });
      expect(r.status, r.text).toBe(200);
      return (r.json as { dki: { memories: { id: string }[] } }).dki.memories.map((m) => m.id);
    };
    const plain = await spawnServer(["--model", model, "--data", store, "--threads", "1", "--config", config]);
    try {
      expect(await ask(plain.url, "dki")).toEqual([ids[0]]);
    } finally {
      plain.child.kill("SIGTERM");
      expect((await plain.exited).code).toBe(0);
    }
    const s = await spawnServer(["--model", model, "--data", store, "--threads", "1", "--config", config, "--rerank-model", reranker, "--rerank-depth", "10"]);
    try {
      expect(await ask(s.url, "dki")).toEqual([ids[1]]);
      expect(await ask(s.url, "rag")).toEqual([ids[1]]);
    } finally {
      s.child.kill("SIGTERM");
      expect((await s.exited).code).toBe(0);
    }
    expect(await dkiFails(["serve", "--model", model, "--data", store, "--rerank-model", join(dir, "nothing")])).toMatch(/^dki: .*nothing.* is not a folder\n$/);
    expect(await dkiFails(["serve", "--model", model, "--data", store, "--rerank-depth", "5"])).toBe("dki: --rerank-depth needs --rerank-model\n");
  });

  test("with a key file and a config file: 401 without the key; the store's CLI commands work beside the server, which sees their writes", async () => {
    const dir = tempDir();
    const keys = join(dir, "keys.json");
    writeFileSync(keys, JSON.stringify({ keys: [{ key: "alice-key-0123456789", users: ["alice"] }] }));
    const config = join(dir, "dki.json");
    writeFileSync(config, JSON.stringify({ maxMemories: 1 }));
    const s = await spawnServer(["--model", model, "--data", data, "--threads", "1", "--api-key-file", keys, "--config", config]);
    try {
      expect((await call(s.url, "GET", "/v1/models")).status).toBe(401);
      // Another process writes to the store the server holds open.
      const { id } = JSON.parse((await dki(["memory", "add", "--data", data, "--user", "alice", "--format", "json", "Alice keeps bees in Provence."])).stdout) as { id: string };
      const r = await call(s.url, "POST", "/v1/chat/completions", { key: "alice-key-0123456789", body: { model: "tiny", max_tokens: 2, messages: [{ role: "user", content: "Tell me about the bees in Provence" }], dki: { alpha: 1 } } });
      expect(r.status, r.text).toBe(200);
      // maxMemories 1 from the config file: only the best match, the memory just added.
      expect((r.json as { dki: { memories: { id: string }[] } }).dki.memories.map((m) => m.id)).toEqual([id]);
      const listed = await dki(["memory", "list", "--data", data, "--user", "alice"]);
      expect(listed.stdout).toContain("bees in Provence");
      // Erasing also clears the K/V cache the server holds: refused, pointing at the server's route.
      expect(await dkiFails(["user", "erase", "alice", "--data", data, "--yes"])).toMatch(/in use by another open cache.*; if a dki serve owns this store, erase through it: DELETE \/v1\/users\/alice\n$/);
      expect((await call(s.url, "GET", "/v1/memories", { key: "alice-key-0123456789" })).text).toContain("bees in Provence");
    } finally {
      s.child.kill("SIGTERM");
      expect((await s.exited).code).toBe(0);
    }
  });
});
