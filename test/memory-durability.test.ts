// Durability: a child process adding memories in a loop is killed with SIGKILL at random points,
// several times over one data folder. On every reopen, each add it acknowledged is there with its
// text, no write is half-done (each memory has its vector and its audit entry, each audit entry
// all its memories), and the index agrees with the store, rebuilt where the kill left it behind
// and reported. The child runs the built package (npm test compiles dist/ first).
import { spawn } from "node:child_process";
import { once } from "node:events";
import { join } from "node:path";
import { expect, test } from "vitest";
import { MemoryStore } from "../src/memory/memory-store.js";
import type { RebuildReport } from "../src/memory/retrieval/scoped-index.js";
import { repoRoot, tempDir } from "./support/paths.js";
import { prng } from "./support/prng.js";

interface Acked {
  userId: string;
  memories: { id: string; text: string }[];
}

/** Runs the add loop until `acks` adds are acknowledged, waits `extraMs` more, SIGKILLs it; returns every ack it printed. */
async function runAndKill(dir: string, options: object, acks: number, extraMs: number): Promise<Acked[]> {
  const child = spawn(process.execPath, [join(repoRoot, "test/support/memory-add-child.mjs"), join(repoRoot, "dist"), dir, JSON.stringify(options)], { stdio: ["ignore", "pipe", "pipe"] });
  const exited = once(child, "exit");
  const acked: Acked[] = [];
  let stderr = "";
  let buf = "";
  child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
  const take = (final: boolean) => {
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = JSON.parse(buf.slice(0, nl)) as Acked | { ready: true };
      buf = buf.slice(nl + 1);
      if ("userId" in line) acked.push(line);
    }
    // A line cut by the kill was never fully acknowledged: ignored.
    if (final) buf = "";
  };
  await new Promise<void>((resolve, reject) => {
    let armed = false;
    child.stdout.on("data", (d: Buffer) => {
      buf += d.toString();
      take(false);
      if (!armed && acked.length >= acks) {
        armed = true;
        setTimeout(resolve, extraMs);
      }
    });
    child.on("exit", (code) => reject(new Error(`the add loop exited (${code}) before it was killed: ${stderr}`)));
  });
  child.kill("SIGKILL");
  const [, signal] = await exited;
  expect(signal).toBe("SIGKILL");
  take(true);
  return acked;
}

test("adds acknowledged before a SIGKILL survive it whole, and the index is rebuilt to agree, reported", async () => {
  const rand = prng(2817);
  const dir = tempDir();
  const acknowledged = new Map<string, { userId: string; text: string }>();
  const reports: RebuildReport[] = [];
  // HNSW from the first memory, so every user has index files that a kill can leave behind.
  const common = { hnswFrom: 0, indexFlushDelayMs: 15 };
  for (let round = 0; round < 6; round++) {
    const durability = round % 2 === 0 ? "flush" : "commit";
    const acked = await runAndKill(dir, { ...common, durability, tag: `r${round}` }, 20 + Math.floor(rand() * 60), Math.floor(rand() * 40));
    for (const a of acked) for (const m of a.memories) acknowledged.set(m.id, { userId: a.userId, text: m.text });

    const store = await MemoryStore.open({ dir, ...common, onRebuild: (r) => reports.push(r) });
    try {
      // Loads every user's index: missing, stale or corrupt ones are rebuilt here, and reported.
      store.checkIndexes();
      const users = store.listUsers();
      let total = 0;
      for (const userId of users) {
        const memories = await store.memories.getAll({ userId });
        total += memories.length;
        const audited = new Set((await store.audit.list({ userId, action: "memory_add" })).flatMap((e) => e.memoryIds));
        const present = new Set(memories.map((m) => m.id));
        // Whole writes only: every memory came with its audit entry, every audit entry with all its memories.
        for (const m of memories) expect(audited.has(m.id)).toBe(true);
        for (const id of audited) expect(present.has(id)).toBe(true);
      }
      for (const [id, { userId, text }] of acknowledged) expect((await store.memories.get(id, { userId }))?.text).toBe(text);
      // The index agrees with the store: it holds every memory, and finds a sample by its own text.
      expect(store.stats()).toMatchObject({ memories: total, indexedMemories: total });
      const sample = [...acknowledged].filter(() => rand() < 0.1);
      for (const [id, { userId, text }] of sample) {
        const hits = await store.memories.search(text, { userId, limit: 3 });
        expect(hits.map((h) => h.memory.id)).toContain(id);
      }
    } finally {
      await store.close();
    }
  }
  expect(acknowledged.size).toBeGreaterThan(100);
  // Kills landed between writes and index saves: those indexes were rebuilt and said so.
  expect(reports.length).toBeGreaterThan(0);
  for (const r of reports) expect(["stale", "missing"]).toContain(r.reason);
  // The rebuilt indexes were saved: a clean reopen rebuilds nothing.
  const again = await MemoryStore.open({ dir, ...common });
  try {
    expect(again.checkIndexes()).toEqual([]);
  } finally {
    await again.close();
  }
  console.log(`durability: ${acknowledged.size} acknowledged memories over 6 kills, ${reports.length} index rebuilds reported (${[...new Set(reports.map((r) => r.reason))].join(", ")})`);
});
