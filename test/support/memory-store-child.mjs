// Child of memory-multiprocess.test.ts and memory-store-fuzz.test.ts: one process with a memory
// store open, running commands and printing one JSON line per command. Runs the built package:
//   node memory-store-child.mjs <dist dir> <data dir> <options JSON> [<commands JSON>]
// With a commands array it runs those and exits (0, or 2 at the first error); without, it reads
// one JSON command per line from stdin until "close". A failed open prints its error and exits 2.
// Commands:
//   { op: "addMany", userId, texts, searchEvery? }  adds one by one; every searchEvery-th add it
//                                                  searches the text just added and lists misses
//   { op: "search", userId, query, limit? }          → [{ id, text }]
//   { op: "dump" }                                    → every user's memories, each searched by its own text
//   { op: "add", userId, text }                       → { id }
//   { op: "erase", userId }  { op: "close" }
import { createInterface } from "node:readline";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [dist, dir, optionsJson, commandsJson] = process.argv.slice(2);
const { MemoryStore } = await import(pathToFileURL(join(dist, "src/memory/memory-store.js")).href);
const say = (line) => process.stdout.write(JSON.stringify(line) + "\n");
const fail = (e) => {
  say({ ok: false, error: { name: e?.name, message: String(e?.message ?? e) } });
  process.exit(2);
};

let store;
try {
  store = await MemoryStore.open({ dir, ...JSON.parse(optionsJson) });
} catch (e) {
  fail(e);
}

async function run(c) {
  switch (c.op) {
    case "addMany": {
      const ids = [];
      const misses = [];
      for (let i = 0; i < c.texts.length; i++) {
        const [m] = await store.memories.add(c.texts[i], { userId: c.userId });
        ids.push(m.id);
        if (c.searchEvery && (i + 1) % c.searchEvery === 0) {
          const hits = await store.memories.search(c.texts[i], { userId: c.userId, limit: 3 });
          if (!hits.some((h) => h.memory.id === m.id)) misses.push(m.id);
        }
      }
      return { ids, misses };
    }
    case "add":
      return { id: (await store.memories.add(c.text, { userId: c.userId }))[0].id };
    case "search":
      return (await store.memories.search(c.query, { userId: c.userId, limit: c.limit ?? 5 })).map((h) => ({ id: h.memory.id, text: h.memory.text }));
    case "dump": {
      const users = {};
      for (const userId of store.listUsers()) {
        const memories = await store.memories.getAll({ userId });
        users[userId] = [];
        for (const m of memories) {
          const hits = await store.memories.search(m.text, { userId, limit: 3 });
          users[userId].push({ id: m.id, userId: m.userId, text: m.text, hits: hits.map((h) => h.memory.id) });
        }
      }
      return users;
    }
    case "erase":
      return await store.eraseUser(c.userId);
    case "close":
      await store.close();
      return null;
    default:
      throw new Error(`unknown op ${c.op}`);
  }
}

say({ ok: true, ready: true, pid: process.pid });
if (commandsJson !== undefined) {
  for (const c of JSON.parse(commandsJson)) {
    try {
      say({ ok: true, result: await run(c) });
    } catch (e) {
      fail(e);
    }
  }
  process.exit(0);
}
for await (const line of createInterface({ input: process.stdin })) {
  if (line.trim() === "") continue;
  const c = JSON.parse(line);
  try {
    say({ ok: true, result: await run(c) });
  } catch (e) {
    say({ ok: false, error: { name: e?.name, message: String(e?.message ?? e) } });
  }
  if (c.op === "close") break;
}
