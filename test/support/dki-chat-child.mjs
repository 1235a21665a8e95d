// Child process of dki-crash.test.ts and dki-system.test.ts: a DKISystem in a process of its own,
// built from dist/ (npm test compiles it first). Prints JSON lines. Usage:
//   node dki-chat-child.mjs <dist folder> loop <json>   chats in a loop, one line per answered turn
//   node dki-chat-child.mjs <dist folder> turn <json>   one turn's logits and the tiers its blocks came from
// <json>: { model, dataDir, config, userId, sessionId, query?, maxNewTokens? }
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [dist, mode, json] = process.argv.slice(2);
const o = JSON.parse(json);
const { DKISystem } = await import(pathToFileURL(join(dist, "src/index.js")).href);
const { Model } = await import(pathToFileURL(join(dist, "src/index.js")).href);
const model = await Model.load(o.model, { contextSize: o.contextSize ?? 1024, threads: 1 });
const system = await DKISystem.open({ model, dataDir: o.dataDir, config: o.config });
const out = (v) => process.stdout.write(JSON.stringify(v) + "\n");

if (mode === "loop") {
  out({ ready: true });
  for (let i = 0; ; i++) {
    const query = `Question ${i}: what about my trip to the Alps and peanuts?`;
    const r = await system.chat(query, { userId: o.userId, sessionId: o.sessionId, maxNewTokens: o.maxNewTokens ?? 8 });
    out({ turn: i, query, text: r.text, memoryIds: r.memoriesUsed.map((m) => m.id) });
  }
} else if (mode === "turn") {
  const r = await system.logits(o.query, { userId: o.userId, sessionId: o.sessionId, forceAlpha: o.forceAlpha });
  out({ tiers: r.tiers.map((t) => t.tier), memoryIds: r.memoriesUsed.map((m) => m.id), last: Array.from(r.logits[r.logits.length - 1]) });
  await system.close();
  model.dispose();
} else {
  throw new Error(`unknown mode ${mode}`);
}
