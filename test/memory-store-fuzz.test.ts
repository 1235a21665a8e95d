// A damaged store file must end in a clean error or a correct store, never a signal. A store is
// written here, then copies of its file, truncated at 100 offsets (0, 100, 4096, 8192 and spread
// over the file) or with random bit flips (seeded), are opened by child processes running the
// built package: each child reads every user's memories, searches each by its own text and adds
// one. Every child must either exit 0 having returned only records exactly as written (ids, user,
// text) and hits among that user's memories, or exit 2 with an error naming the file, and never
// die of a signal (LMDB maps the file: unchecked, a truncated file is SIGBUS, a damaged one
// SIGSEGV). A garbage lock file and the knowledge base's file get the same treatment.
import { spawn } from "node:child_process";
import { copyFileSync, mkdirSync, readFileSync, statSync, truncateSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { expect, test } from "vitest";
import { HashingEmbedder } from "../src/memory/embedders/hashing.js";
import { StoreFileError } from "../src/memory/errors.js";
import { MemoryStore } from "../src/memory/memory-store.js";
import { KnowledgeBase } from "../src/rag/kb/knowledge-base.js";
import { repoRoot, tempDir } from "./support/paths.js";
import { prng } from "./support/prng.js";

interface Written {
  userId: string;
  text: string;
}
interface Outcome {
  code: number | null;
  signal: NodeJS.Signals | null;
  lines: { ok: boolean; result?: unknown; error?: { name: string; message: string } }[];
  stderr: string;
}

const CHILD = join(repoRoot, "test/support/memory-store-child.mjs");
const AFTER = { userId: "after", text: "written after the damage" };
const COMMANDS = JSON.stringify([{ op: "add", ...AFTER }, { op: "dump" }]);

function runChild(dir: string): Promise<Outcome> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [CHILD, join(repoRoot, "dist"), dir, "{}", COMMANDS], { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    let stderr = "";
    child.stdout.on("data", (d: Buffer) => (out += d.toString()));
    child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    const timer = setTimeout(() => child.kill("SIGKILL"), 60_000);
    child.on("error", reject);
    child.on("close", (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stderr, lines: out.split("\n").filter((l) => l !== "").map((l) => JSON.parse(l) as Outcome["lines"][number]) });
    });
  });
}

/** Runs jobs two at a time (the machine's cores). */
async function inPairs<T>(jobs: (() => Promise<T>)[]): Promise<T[]> {
  const out: T[] = new Array(jobs.length);
  let next = 0;
  const worker = async () => {
    while (next < jobs.length) {
      const i = next++;
      out[i] = await jobs[i]();
    }
  };
  await Promise.all([worker(), worker()]);
  return out;
}

/** Checks one child's outcome; returns "error" or "store". */
function judge(what: string, o: Outcome, file: string, written: Map<string, Written>): "error" | "store" {
  const context = `${what}: exit ${o.code}, signal ${o.signal}, ${JSON.stringify(o.lines.at(-1))} ${o.stderr.slice(0, 500)}`;
  expect(o.signal, context).toBeNull();
  if (o.code !== 0) {
    expect(o.code, context).toBe(2);
    const last = o.lines.at(-1)!;
    expect(last.ok, context).toBe(false);
    expect(last.error!.message, context).toContain(file);
    return "error";
  }
  const [, added, dump] = o.lines;
  expect(o.lines.every((l) => l.ok), context).toBe(true);
  const addedId = (added.result as { id: string }).id;
  const users = dump.result as Record<string, { id: string; userId: string; text: string; hits: string[] }[]>;
  expect(users.after?.map((m) => m.id), context).toContain(addedId);
  for (const [userId, memories] of Object.entries(users)) {
    const ids = new Set(memories.map((m) => m.id));
    for (const m of memories) {
      // Every record returned is one that was written, whole, under its own user (the memories
      // of "after" are the children's own adds).
      const w = userId === "after" ? AFTER : written.get(m.id);
      expect(w, `${context}: unknown memory ${m.id}`).toBeDefined();
      expect({ userId: m.userId, text: m.text }, context).toEqual(w);
      for (const h of m.hits) expect(ids.has(h), `${context}: hit ${h} is not one of ${userId}'s`).toBe(true);
    }
  }
  return "store";
}

test("a truncated or bit-flipped store file ends in a clean error naming it or in a correct store, never a signal (100 truncations, 50 flip runs, seed 3517)", async () => {
  const rand = prng(3517);
  const base = tempDir();
  const written = new Map<string, Written>();
  const store = await MemoryStore.open({ dir: base, hnswFrom: 20 });
  const words = ["kite", "heron", "maple", "granite", "violin", "harbour", "saffron", "glacier", "lantern", "orchard"];
  for (let i = 0; i < 45; i++) {
    const userId = `u${i % 3}`;
    const text = `memory ${i} of ${userId}: the ${words[i % 10]} and the ${words[(i * 7 + 3) % 10]} ${"é".repeat(i % 5)}`;
    const [m] = await store.memories.add(text, { userId });
    written.set(m.id, { userId, text });
  }
  const [gone] = await store.memories.getAll({ userId: "u1" });
  await store.memories.delete(gone.id, { userId: "u1" });
  written.delete(gone.id);
  await store.preferences.add("likes tea", { userId: "u0", type: "taste" });
  await store.close();
  const file = join(base, "store.lmdb");
  const size = statSync(file).size;
  const pristine = readFileSync(file);

  const copy = (i: number): string => {
    const dir = join(tempDir(), `c${i}`);
    mkdirSync(dir);
    copyFileSync(file, join(dir, "store.lmdb"));
    return dir;
  };
  // The undamaged copy is a correct store (the judge's own check of itself).
  expect(judge("pristine", await runChild(copy(-1)), "store.lmdb", written)).toBe("store");

  const offsets = [0, 100, 4096, 8192];
  // Half of them at page boundaries, where the size alone looks right and the page tree must tell.
  for (let i = 0; offsets.length < 100; i++) {
    const offset = Math.min(size - 1, Math.floor(((i + rand()) * size) / 96));
    offsets.push(i % 2 === 0 ? offset - (offset % 4096) : offset);
  }
  const truncations = await inPairs(
    offsets.map((offset, i) => async () => {
      const dir = copy(i);
      truncateSync(join(dir, "store.lmdb"), offset);
      return judge(`truncated at ${offset} of ${size}`, await runChild(dir), join(dir, "store.lmdb"), written);
    }),
  );
  // The header-sized ones are refused; the file's last pages may be free ones, so a late cut can leave a correct store.
  expect(truncations.slice(0, 4)).toEqual(["error", "error", "error", "error"]);

  const flipRuns = Array.from({ length: 50 }, (_, i) => {
    const bits = Array.from({ length: 1 + (i % 3) }, () => Math.floor(rand() * size * 8));
    return async () => {
      const dir = copy(1000 + i);
      const bytes = Buffer.from(pristine);
      for (const bit of bits) bytes[bit >> 3] ^= 1 << (bit & 7);
      writeFileSync(join(dir, "store.lmdb"), bytes);
      return judge(`bits ${bits.join(", ")} flipped`, await runChild(dir), join(dir, "store.lmdb"), written);
    };
  });
  const flips = await inPairs(flipRuns);
  const count = (xs: string[], x: string) => xs.filter((y) => y === x).length;
  console.log(`store fuzz (${size}-byte file): truncations ${count(truncations, "error")} refused, ${count(truncations, "store")} correct; flips ${count(flips, "error")} refused, ${count(flips, "store")} correct`);
  // Both outcomes occur: flips land in records (refused by their checksums) and in unused bytes.
  expect(count(flips, "error")).toBeGreaterThan(0);
  expect(count(flips, "store")).toBeGreaterThan(0);
}, 240_000);

test("a garbage or truncated lock file is replaced by LMDB, not trusted", async () => {
  const dir = tempDir();
  const store = await MemoryStore.open({ dir });
  const [m] = await store.memories.add("the lock file is only a cache", { userId: "u" });
  await store.close();
  const written = new Map([[m.id, { userId: "u", text: "the lock file is only a cache" }]]);
  const rand = prng(11);
  for (const lock of [Buffer.alloc(0), Buffer.from("garbage"), Buffer.from(Array.from({ length: 8272 }, () => Math.floor(rand() * 256))), Buffer.alloc(100_000, 0xff)]) {
    writeFileSync(join(dir, "store.lmdb-lock"), lock);
    expect(judge(`a ${lock.length}-byte lock file`, await runChild(dir), "store.lmdb", written)).toBe("store");
  }
});

test("the knowledge base refuses its truncated file the same way", async () => {
  const options = (dir: string) => ({ dir, embedder: new HashingEmbedder({ dim: 32 }), tokenizer: { encode: (t: string) => t.split(/\s+/).map((_, i) => i), decode: () => "" } as never });
  const dir = tempDir();
  await (await KnowledgeBase.open(options(dir))).close();
  const pristine = readFileSync(join(dir, "kb.lmdb"));
  expect(pristine.length).toBeGreaterThan(8192);
  for (const cut of [0, 100, 4096, 8192]) {
    const damaged = tempDir();
    writeFileSync(join(damaged, "kb.lmdb"), pristine.subarray(0, cut));
    const opening = KnowledgeBase.open(options(damaged));
    await expect(opening).rejects.toThrow(StoreFileError);
    await expect(opening).rejects.toThrow(`the knowledge base file ${join(damaged, "kb.lmdb")}`);
  }
});
