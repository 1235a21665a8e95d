// The memory store's speed (issue 28, must-show 4): add throughput with the hashing embedder
// (batches of 100, and single adds under both durabilities), search p50/p95 at 1k / 10k / 100k
// memories spread over 1k users, the time to load every user's index after a reopen and to rebuild
// one large user's HNSW index, and bytes on disk per memory. Targets: search p95 ≤ 5 ms at 100k
// memories, ≥ 2,000 adds/s in batches.
// Usage: node bench/memory.js [--quick]   (quick: 1k and 10k memories only)
import { mkdtempSync, rmSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { MemoryStore } from "../dist/src/memory/memory-store.js";
import { machine } from "./lib/machine.js";
import { writeResults } from "./lib/results.js";

const quick = process.argv.includes("--quick");
const SIZES = quick ? [1_000, 10_000] : [1_000, 10_000, 100_000];
const USERS = 1_000;
const BATCH = 100;
const SEARCHES = 2_000;
const SINGLE_ADDS = 200;
const BIG_USER = 10_000; // memories of the one user whose HNSW index is rebuilt

// Deterministic text: words drawn with a Zipf-like skew, some sentences in Chinese.
let seed = 42;
const rand = () => ((seed = (seed * 1_103_515_245 + 12_345) & 0x7fffffff) / 0x7fffffff);
const EN = "time person year way day thing man world life hand part child eye woman place work week case point government company number group problem fact garden coffee music river city travel doctor dinner birthday guitar school train market holiday friend sister brother morning evening weekend concert museum beach mountain recipe bicycle camera library".split(" ");
const ZH = "今天 明天 朋友 工作 学校 音乐 咖啡 旅行 医生 晚饭 生日 吉他 火车 市场 假期 妹妹 哥哥 早上 周末 博物馆 海滩 爬山 菜谱 自行车 相机 图书馆".split(" ");
const word = (list) => list[Math.floor(list.length * rand() ** 2)];
const sentence = () => (rand() < 0.2 ? Array.from({ length: 6 + Math.floor(rand() * 6) }, () => word(ZH)).join("") : Array.from({ length: 8 + Math.floor(rand() * 10) }, () => word(EN)).join(" "));
const query = () => (rand() < 0.2 ? Array.from({ length: 2 + Math.floor(rand() * 2) }, () => word(ZH)).join("") : Array.from({ length: 3 + Math.floor(rand() * 3) }, () => word(EN)).join(" "));

const percentile = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};
const scratch = mkdtempSync(join(tmpdir(), "dki-bench-memory-"));
const rows = [];
const loadAtStart = loadavg()[0];

for (const size of SIZES) {
  const dir = join(scratch, `store-${size}`);
  let store = await MemoryStore.open({ dir });
  // Memories go to the users in batches of 100 (one transaction, one fsync each), round robin.
  const perUser = Math.max(1, Math.floor(size / USERS));
  const batch = Math.min(BATCH, perUser);
  let added = 0;
  const t0 = performance.now();
  for (let round = 0; added < size; round++) {
    for (let u = 0; u < USERS && added < size; u++) {
      const n = Math.min(batch, size - added);
      await store.memories.add(Array.from({ length: n }, () => ({ role: "user", content: sentence() })), { userId: `user-${u}` });
      added += n;
    }
  }
  const addSeconds = (performance.now() - t0) / 1000;

  const searchMs = [];
  for (let i = 0; i < SEARCHES; i++) {
    const userId = `user-${Math.floor(rand() * Math.min(USERS, size))}`;
    const q = query();
    const s0 = performance.now();
    await store.memories.search(q, { userId, limit: 10 });
    searchMs.push(performance.now() - s0);
  }
  await store.close();

  // Reopen: every user's index is loaded from the store (scan indexes) or its files (HNSW).
  store = await MemoryStore.open({ dir });
  const l0 = performance.now();
  const rebuilt = store.checkIndexes();
  const loadAllMs = performance.now() - l0;
  const coldMs = [];
  const stats = store.stats();
  await store.close();
  store = await MemoryStore.open({ dir });
  for (let u = 0; u < 200; u++) {
    const s0 = performance.now();
    await store.memories.search(query(), { userId: `user-${(u * 7) % Math.min(USERS, size)}`, limit: 10 });
    coldMs.push(performance.now() - s0);
  }
  await store.close();

  rows.push({
    memories: size,
    users: Math.min(USERS, size),
    "batch size": batch,
    "adds/s (batches)": size / addSeconds,
    "search p50 ms": percentile(searchMs, 50),
    "search p95 ms": percentile(searchMs, 95),
    "first search of a user after reopen, p50 / p95 ms": `${percentile(coldMs, 50).toFixed(2)} / ${percentile(coldMs, 95).toFixed(2)}`,
    "load all indexes after reopen ms": loadAllMs,
    "bytes on disk / memory": Math.round(stats.bytesOnDisk / stats.memories),
  });
  if (rebuilt.length > 0) throw new Error(`a clean reopen rebuilt ${rebuilt.length} indexes`);
  rmSync(dir, { recursive: true, force: true });
}

// Single adds: one transaction per memory, so the commit (and its fsync) is the cost.
const singles = {};
for (const durability of ["flush", "commit"]) {
  const dir = join(scratch, `single-${durability}`);
  const store = await MemoryStore.open({ dir, durability });
  const t0 = performance.now();
  for (let i = 0; i < SINGLE_ADDS; i++) await store.memories.add(sentence(), { userId: `user-${i % 10}` });
  singles[durability] = SINGLE_ADDS / ((performance.now() - t0) / 1000);
  await store.close();
}

// One large user: its index is HNSW (from 1000 memories); deleting the index files forces a rebuild.
const bigDir = join(scratch, "big-user");
let big = await MemoryStore.open({ dir: bigDir, durability: "commit" });
for (let i = 0; i < BIG_USER; i += BATCH) await big.memories.add(Array.from({ length: BATCH }, () => ({ role: "user", content: sentence() })), { userId: "big" });
const bigSearch = [];
for (let i = 0; i < 500; i++) {
  const s0 = performance.now();
  await big.memories.search(query(), { userId: "big", limit: 10 });
  bigSearch.push(performance.now() - s0);
}
await big.close();
rmSync(join(bigDir, "index"), { recursive: true });
let rebuild;
big = await MemoryStore.open({ dir: bigDir, onRebuild: (r) => (rebuild = r) });
const r0 = performance.now();
big.checkIndexes();
const rebuildTotalMs = performance.now() - r0;
await big.close();
rmSync(scratch, { recursive: true, force: true });

writeResults("memory", {
  machine: machine(),
  rows,
  columns: ["memories", "users", "batch size", "adds/s (batches)", "search p50 ms", "search p95 ms", "first search of a user after reopen, p50 / p95 ms", "load all indexes after reopen ms", "bytes on disk / memory"],
  notes: [
    `hashing embedder (512 dimensions), default store settings (durability "flush": an fsync per write transaction), ${SEARCHES} searches of limit 10 for random users after the adds (their indexes loaded)`,
    `single adds (one transaction each): ${singles.flush.toFixed(0)}/s with durability "flush", ${singles.commit.toFixed(0)}/s with "commit" (no fsync)`,
    `one user with ${BIG_USER} memories (HNSW index): search p50 ${percentile(bigSearch, 50).toFixed(2)} ms, p95 ${percentile(bigSearch, 95).toFixed(2)} ms; its index files deleted, the rebuild from the store took ${rebuild?.ms.toFixed(0)} ms for the HNSW graph (${rebuildTotalMs.toFixed(0)} ms with reading the store and BM25), reported as "${rebuild?.reason}"`,
    "users below 1000 memories are searched by an exact scan (no index files); 'load all indexes' reads every user's memories and vectors back and rebuilds BM25",
    `load average at the start ${loadAtStart.toFixed(1)}, at the end ${loadavg()[0].toFixed(1)} (other work on the machine slows every column)`,
  ],
});
