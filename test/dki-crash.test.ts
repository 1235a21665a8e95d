// Crash safety of a turn's record: a child process chatting in a loop is killed with SIGKILL at
// a random moment, several times over the same data folder; on reopen every turn it reported
// answered has its user row, assistant row and audit row, and no turn is half-written (rows come
// in complete user/assistant pairs, one audit row each).
import { spawn } from "node:child_process";
import { once } from "node:events";
import { join } from "node:path";
import { afterAll, beforeAll, expect, test } from "vitest";
import { Model } from "../src/engine/model.js";
import { makeTinyModel } from "../src/models/make-tiny.js";
import { DKISystem } from "../src/dki/index.js";
import { repoRoot, tempDir } from "./support/paths.js";
import { prng } from "./support/prng.js";

/** Kills, each at a random moment of a turn (the prefill, the decode or the record). */
const ROUNDS = 5;
let model: Model;
let modelDir: string;

beforeAll(async () => {
  modelDir = tempDir();
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: modelDir, seed: 5 });
  model = await Model.load(modelDir, { contextSize: 1024 });
});
afterAll(() => model.dispose());

interface Answered {
  turn: number;
  query: string;
  text: string;
  memoryIds: string[];
}

/** Runs the chat loop in a child until `answers` turns are reported, waits `extraMs` more, then SIGKILLs it. */
async function runAndKill(dataDir: string, sessionId: string, answers: number, extraMs: number): Promise<Answered[]> {
  const config = { generationReserve: 128, gating: { relevanceThreshold: 0 } };
  const child = spawn(process.execPath, [join(repoRoot, "test/support/dki-chat-child.mjs"), join(repoRoot, "dist"), "loop", JSON.stringify({ model: modelDir, dataDir, config, userId: "alice", sessionId, maxNewTokens: 6 })], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  const exited = once(child, "exit");
  const answered: Answered[] = [];
  let stderr = "";
  let buf = "";
  child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
  await new Promise<void>((resolve, reject) => {
    child.stdout.on("data", (d: Buffer) => {
      buf += d.toString();
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = JSON.parse(buf.slice(0, nl)) as Answered | { ready: true };
        buf = buf.slice(nl + 1);
        if ("turn" in line) answered.push(line);
        if (answered.length === answers) setTimeout(resolve, extraMs);
      }
    });
    child.on("exit", (code) => reject(new Error(`the chat loop exited (${code}) before it was killed: ${stderr}`)));
  });
  child.kill("SIGKILL");
  const [, signal] = await exited;
  expect(signal).toBe("SIGKILL");
  // A line the child wrote before dying but we had not parsed yet is also an answered turn.
  for (const line of buf.split("\n").filter((l) => l.startsWith("{"))) {
    try {
      const v = JSON.parse(line) as Answered;
      if ("turn" in v) answered.push(v);
    } catch {
      // cut mid-line by the kill: that turn was not reported answered
    }
  }
  return answered;
}

test("SIGKILL mid-loop, five times: every answered turn has its three rows, and no turn is half-written", async () => {
  const dataDir = tempDir();
  const seed = await DKISystem.open({ model, dataDir });
  const [mem] = await seed.memories.add("Alice loves hiking in the Alps and is allergic to peanuts.", { userId: "alice" });
  await seed.close();
  const rnd = prng(5);
  const reported: { sessionId: string; a: Answered }[] = [];
  for (let round = 0; round < ROUNDS; round++) {
    const sessionId = `crash-${round}`;
    // Killed somewhere in the next turn: in the prefill, the decode or the record.
    const answered = await runAndKill(dataDir, sessionId, 2, Math.floor(rnd() * 200));
    for (const a of answered) reported.push({ sessionId, a });
  }

  const sys = await DKISystem.open({ model, dataDir, config: { gating: { relevanceThreshold: 0 } } });
  try {
    for (let round = 0; round < ROUNDS; round++) {
      const sessionId = `crash-${round}`;
      const rows = await sys.conversations.list({ userId: "alice", sessionId });
      const audit = (await sys.audit.list({ userId: "alice", sessionId })).filter((e) => e.action === "dki_generate");
      // Whole turns only: user, assistant, user, assistant, …, and one audit row per turn.
      expect(rows.length % 2).toBe(0);
      rows.forEach((r, i) => expect(r.role).toBe(i % 2 === 0 ? "user" : "assistant"));
      expect(audit).toHaveLength(rows.length / 2);
      console.log(`${sessionId}: ${reported.filter((x) => x.sessionId === sessionId).length} turns reported answered, ${rows.length / 2} recorded`);
      for (const { a } of reported.filter((x) => x.sessionId === sessionId)) {
        const i = rows.findIndex((r) => r.role === "user" && r.content === a.query);
        expect(i, `turn ${a.turn} of ${sessionId} was answered but has no user row`).toBeGreaterThanOrEqual(0);
        expect(rows[i + 1]).toMatchObject({ role: "assistant", content: a.text, memoryIds: a.memoryIds });
        expect(audit.some((e) => JSON.stringify(e.memoryIds) === JSON.stringify(a.memoryIds))).toBe(true);
      }
      expect(reported.filter((x) => x.sessionId === sessionId).length).toBeGreaterThanOrEqual(2);
    }
    expect(reported.every(({ a }) => a.memoryIds.includes(mem!.id))).toBe(true);
    // The store and the cache still work after the crashes.
    const r = await sys.chat("Tips for hiking in the Alps with peanuts?", { userId: "alice", sessionId: "after", maxNewTokens: 2 });
    expect(r.memoriesUsed.map((m) => m.id)).toEqual([mem!.id]);
  } finally {
    await sys.close();
  }
});
