// Child of memory-durability.test.ts: opens a memory store and adds memories in a loop until it
// is killed, printing one JSON line per acknowledged add (after add() returned). Runs the built
// package: node memory-add-child.mjs <dist dir> <data dir> <options JSON>
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [dist, dir, optionsJson] = process.argv.slice(2);
const { MemoryStore } = await import(pathToFileURL(join(dist, "src/memory/memory-store.js")).href);
const options = JSON.parse(optionsJson);
const store = await MemoryStore.open({ dir, ...options });
process.stdout.write(JSON.stringify({ ready: true }) + "\n");
const words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"];
for (let i = 0; ; i++) {
  const userId = `user-${i % 7}`;
  const batch = 1 + (i % 4);
  const texts = Array.from({ length: batch }, (_, j) => `${options.tag} ${i}.${j} ${words[(i + j) % 10]} ${words[(i * 3 + j) % 10]}`);
  const added = await store.memories.add(texts.length === 1 ? texts[0] : texts.map((content) => ({ role: "user", content })), { userId });
  process.stdout.write(JSON.stringify({ userId, memories: added.map((m) => ({ id: m.id, text: m.text })) }) + "\n");
}
