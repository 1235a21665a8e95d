// The MCP memory server in process (the SDK's Client over its in-memory transport), for what a
// child process hides: a memory changed or deleted through MCP takes its user's cached K/V with
// it, in every tier, and leaves every other user's.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { afterAll, beforeAll, expect, test } from "vitest";
import { Model } from "../src/engine/model.js";
import { makeTinyModel } from "../src/models/make-tiny.js";
import { DKISystem } from "../src/dki/system.js";
import { createMemoryServer } from "../src/integrations/mcp/server.js";
import { tempDir } from "./support/paths.js";

let model: Model;
let system: DKISystem;

beforeAll(async () => {
  const dir = tempDir();
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: dir, seed: 7 });
  model = await Model.load(dir, { contextSize: 1024 });
  system = await DKISystem.open({ model, dataDir: tempDir(), config: { gating: { relevanceThreshold: 0 } } });
});
afterAll(async () => {
  await system?.close();
  model?.dispose();
});

async function clientFor(userId: string): Promise<Client> {
  const [a, b] = InMemoryTransport.createLinkedPair();
  await createMemoryServer({ system, userId, defaultSessionId: `s-${userId}`, version: "test" }).connect(a);
  const client = new Client({ name: userId, version: "1" });
  await client.connect(b);
  return client;
}

async function call(c: Client, name: string, args: Record<string, unknown>): Promise<Record<string, unknown>> {
  const r = (await c.callTool({ name, arguments: args })) as CallToolResult;
  expect(r.isError ?? false, JSON.stringify(r.content)).toBe(false);
  return r.structuredContent!;
}

/** Entries per tier once the cache's background writes (L2 encodes, L3 files) have settled. */
async function entries(): Promise<{ L1: number; L3: number }> {
  for (let i = 0; i < 3000 && system.cache.stats().pending > 0; i++) await new Promise((r) => setTimeout(r, 10));
  const s = system.cache.stats();
  return { L1: s.L1.entries, L3: s.L3.entries };
}

test("update_memory and delete_memory drop the user's K/V blocks from every tier, and only that user's", async () => {
  const alice = await clientFor("alice");
  const bob = await clientFor("bob");
  const [a] = (await call(alice, "add_memory", { text: "Alice loves hiking in the Alps." })).added as { id: string }[];
  await call(bob, "add_memory", { text: "Bob plays the cello in a jazz band." });
  await call(alice, "chat", { query: "Where does Alice go hiking?", max_tokens: 1, alpha: 1 });
  await call(bob, "chat", { query: "What does Bob play?", max_tokens: 1, alpha: 1 });
  expect(await entries()).toEqual({ L1: 2, L3: 2 });

  await call(alice, "update_memory", { id: a!.id, text: "Alice loves climbing in the Dolomites." });
  expect(await entries()).toEqual({ L1: 1, L3: 1 });

  // Bob's block is still served from the cache; Alice's new text is computed afresh.
  const b = await call(bob, "chat", { query: "What does Bob play?", max_tokens: 1, alpha: 1 });
  expect((b.tiers as { tier: string }[]).map((t) => t.tier)).toEqual(["L1"]);
  const again = await call(alice, "chat", { query: "Where does Alice go climbing?", max_tokens: 1, alpha: 1 });
  expect((again.tiers as { tier: string }[]).map((t) => t.tier)).toEqual(["L4"]);
  expect(await entries()).toEqual({ L1: 2, L3: 2 });

  await call(alice, "delete_memory", { id: a!.id });
  expect(await entries()).toEqual({ L1: 1, L3: 1 });
  await alice.close();
  await bob.close();
});
