// DKI against the RAG baseline: one user, the same memories, query and model for both systems,
// memory sizes 0 / 256 / 1K / 4K / 16K tokens. Both systems route with the same call and config
// (same store, same maxMemories), so what differs is how the routed memory reaches the model:
// DKI injects it as K/V blocks (0 prompt tokens), RAG puts it in the prompt (seed 000's budget:
// at most 50% of the window after the fixed part, so a large memory is cut).
// Per size and system: prompt tokens, memory tokens that reached the model, attention scores of
// the prefill, time to first token, decode tok/s, total turn latency, peak RSS of the turn; DKI
// cold (every block computed: L4) and warm from L1, L2 and L3.
// Usage: node bench/dki-vs-rag.js [--quick] [--presets smollm2-135m,llama-1b] [--sizes 0,256,1024] [--replot]
//                                 [--model DIR[,DIR] [--ctx N]] [--memory-tokens N]
//                                 [--conversation FILE.json [--max-memories N]]
//   --model: HF model folders instead of the random-weight presets (e.g. the memory-QA models),
//   with a window of --ctx tokens (default 4096); results to dki-vs-rag-cpu-<folder names>.md
//   --memory-tokens: tokens a memory (default 256); a size must be a multiple of it
//   --quick: sizes 0/256/1K on 135M and 0/256 on 1B, 2 repetitions a row instead of 3
//   --conversation: also a real conversation (--sizes none: only it) (LoCoMo or LongMemEval file, imported by the memory
//   store): its first user's turns as memories, its last turn as the query, on the first preset;
//   results to dki-vs-rag-conversation-cpu.md
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { basename, join, resolve } from "node:path";
import { Model, native } from "../dist/src/index.js";
import { DKISystem, analyzeBudget } from "../dist/src/dki/index.js";
import { RAGSystem } from "../dist/src/rag/rag-system.js";
import { MemoryStore } from "../dist/src/memory/memory-store.js";
import { machine } from "./lib/machine.js";
import { benchModel } from "./lib/models.js";
import { writeResults } from "./lib/results.js";
import { writeLinePlot } from "./lib/plot.js";

// "--name value" or "--name=value" (bench/run.js passes only arguments that start with --).
const arg = (name) => process.argv.find((a, i) => process.argv[i - 1] === name) ?? process.argv.find((a) => a.startsWith(`${name}=`))?.slice(name.length + 1);
const quick = process.argv.includes("--quick");
const loadAtStart = loadavg()[0];
/** The machine's load over the run: the bench keeps 2 threads busy; more means other work shared the cores. */
const loadNote = () => `Load average (1 min) ${loadAtStart.toFixed(1)} at the start and ${loadavg()[0].toFixed(1)} at the end (the benchmark keeps 2 threads busy; more than that means other work shared the machine and rows are noisier).`;
const presets = (arg("--presets") ?? "smollm2-135m,llama-1b").split(",");
const modelDirs = arg("--model")?.split(",").map((d) => resolve(d)) ?? [];
/** What the table calls each model: a preset's name, or a given folder's. */
const shapes = modelDirs.length > 0 ? modelDirs.map((d) => basename(d)) : presets;
const REPS = quick ? 2 : 3;
const MEMORY_TOKENS = Number(arg("--memory-tokens") ?? 256); // each memory; a size of S tokens is S / MEMORY_TOKENS memories
if (!Number.isInteger(MEMORY_TOKENS) || MEMORY_TOKENS < 1) throw new Error(`--memory-tokens must be a positive integer, got ${arg("--memory-tokens")}`);
const resultName = `dki-vs-rag-cpu${modelDirs.length > 0 ? `-${shapes.join("-")}` : ""}${MEMORY_TOKENS !== 256 ? `-m${MEMORY_TOKENS}` : ""}`;
/** writeResults puts a --quick run's table beside the full one (NAME-quick); its plots go there too. */
const quickSuffix = quick ? "-quick" : "";
const NEW_TOKENS = 16;
const sizesFor = (preset) => {
  const given = arg("--sizes");
  if (given !== undefined) return given === "" || given === "none" ? [] : given.split(",").map(Number);
  if (modelDirs.length > 0) return [0, 256, 512, 1024, 1536];
  // The 1B shape prefills ~50 tokens/s on 2 cores: RAG at 4K would take minutes a turn.
  if (preset === "llama-1b") return quick ? [0, 256] : [0, 256, 1024];
  return quick ? [0, 256, 1024] : [0, 256, 1024, 4096, 16384];
};

// Peak RSS of one turn: Linux resets the high-water mark on writing 5 to clear_refs.
const resetPeak = () => {
  try {
    writeFileSync("/proc/self/clear_refs", "5");
  } catch {
    // not Linux: the column reads the process's peak so far
  }
};
const peakMB = () => {
  try {
    return Number(/VmHWM:\s+(\d+) kB/.exec(readFileSync("/proc/self/status", "utf8"))[1]) / 1024;
  } catch {
    return process.resourceUsage().maxRSS / 1024;
  }
};

const WORDS = ("alps hiking peanuts allergy lyon vegetarian cello jazz marathon sushi kyoto tennis garden roses python rust chess " +
  "painting violin sailing tea coffee museum berlin lisbon cycling yoga ramen opera kayak mountains desert beach camping pottery").split(" ");
let seed = 12345;
const rand = () => (seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32;
/** A memory of exactly `n` tokens of this tokenizer (words added, then the token list cut and decoded). */
function memoryText(tok, i, n) {
  let text = `Memory ${i}: the user`;
  while (tok.encode(text, { addSpecialTokens: false }).length < n + 8) text += " " + WORDS[Math.floor(rand() * WORDS.length)];
  return tok.decode(tok.encode(text, { addSpecialTokens: false }).slice(0, n)).trim();
}
const QUERY = "What do you remember about my hiking in the alps and my peanut allergy?";
const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;

const rows = [];

/** The plots' points from the table's rows: TTFT per system and tier; prompt tokens per system (equal across DKI's tiers). */
function plotRowsOf(rows) {
  const ttft = rows.map((r) => ({ x: r["memory tokens"], y: r["ttft ms"], series: `${r.shape} ${r.system === "RAG" ? "RAG" : `DKI ${r.tier}`}` }));
  const prompt = rows.filter((r) => r.system === "RAG" || r.tier === "L1").map((r) => ({ x: r["memory tokens"], y: r["prompt tokens"], series: `${r.shape} ${r.system === "RAG" ? "RAG" : "DKI (every tier)"}` }));
  return { ttft, prompt };
}
async function writePlots(rows) {
  const points = plotRowsOf(rows);
  const plots = [];
  for (const [key, y, title] of [["ttft", "time to first token (ms, log)", "Time to first token against memory size (CPU, 2 threads)"], ["prompt", "prompt tokens (log)", "Prompt tokens against memory size"]]) {
    plots.push(await writeLinePlot(resultName.replace("dki-vs-rag-cpu", `dki-vs-rag-cpu-${key}`) + quickSuffix, { rows: points[key], title, x: "memory tokens (symlog)", y, series: "shape, system and tier" }));
  }
  return plots;
}
// --replot: the plots again from the table already written (a change of style needs no rerun).
if (process.argv.includes("--replot")) {
  const { rows } = JSON.parse(readFileSync(new URL(`./results/${resultName}${quickSuffix}.json`, import.meta.url), "utf8"));
  for (const p of await writePlots(rows)) process.stdout.write(`${p.png}\n`);
  process.exit(0);
}
for (const [i, preset] of shapes.entries()) {
  const dir = modelDirs[i] ?? (await benchModel(preset, "f16"));
  // The window RAG gets: the model's trained positions on the 135M shape (8192), 4096 on 1B; --ctx for a given folder.
  const contextSize = modelDirs.length > 0 ? Number(arg("--ctx") ?? 4096) : preset === "llama-1b" ? 4096 : 8192;
  const model = await Model.load(dir, { contextSize });
  const tok = model.tokenizer;
  for (const size of sizesFor(preset)) {
    const data = mkdtempSync(join(tmpdir(), "dki-vs-rag-"));
    // The K/V cache beside the store, not inside it (the store refuses a folder holding anything else).
    const cacheDir = mkdtempSync(join(tmpdir(), "dki-vs-rag-cache-"));
    const count = size / MEMORY_TOKENS;
    const maxMemories = Math.max(1, count);
    // The same config for both: every memory routed, no history (a fresh session per turn), the chat template.
    const config = { maxMemories, memoryMaxTokens: Math.max(size, 1), historyEnabled: false, preferenceEnabled: false, gating: { relevanceThreshold: 0 } };
    const store = await MemoryStore.open({ dir: data });
    for (let i = 0; i < count; i++) await store.memories.add(memoryText(tok, i, MEMORY_TOKENS), { userId: "u1" });
    await store.close();
    let turn = 0;
    const session = () => `s${turn++}`;
    const record = (system, tier, r, peak, memoryTokens, userTokens, ids) => {
      const ttft = r.latency.ttftMs;
      const budget = analyzeBudget(userTokens, memoryTokens);
      return {
        shape: preset,
        "memory tokens": size,
        system,
        tier,
        "memories reaching the model": ids.length,
        "memory tokens reaching the model": memoryTokens,
        "prompt tokens": r.inputTokens,
        "attention scores": system === "RAG" ? budget.rag.attention : budget.dki.attention,
        "ttft ms": ttft,
        "decode tok/s": r.latency.decodeMs > 0 && r.outputTokens > 1 ? ((r.outputTokens - 1) * 1000) / r.latency.decodeMs : 0,
        "turn ms": r.latency.totalMs,
        "peak RSS MB": peak,
        ids,
      };
    };
    const measure = async (system, tier, fn, reps = size >= 4096 ? 1 : REPS) => {
      const runs = [];
      for (let k = 0; k < reps; k++) {
        resetPeak();
        const out = await fn();
        runs.push({ ...out, peak: peakMB() });
      }
      const rr = runs.map((x) => record(system, tier, x.r, x.peak, x.memoryTokens, x.userTokens, x.ids));
      const row = { ...rr[0] };
      for (const k of ["ttft ms", "decode tok/s", "turn ms", "peak RSS MB"]) row[k] = mean(rr.map((x) => x[k]));
      return row;
    };

    // RAG.
    const rag = await RAGSystem.open({ model, dataDir: data, config, openStore: (o) => MemoryStore.open(o) });
    // One turn first, not measured: the store's index and the tokenizer's caches warm up, as they
    // have for DKI's warm rows.
    await rag.chat(QUERY, { userId: "u1", sessionId: session(), maxNewTokens: 1 });
    const ragRow = await measure("RAG", "-", async () => {
      const r = await rag.chat(QUERY, { userId: "u1", sessionId: session(), maxNewTokens: NEW_TOKENS });
      return { r, memoryTokens: r.metadata.contextTokens, userTokens: r.inputTokens - r.metadata.contextTokens, ids: r.memoriesUsed.map((m) => m.id) };
    });
    await rag.close();

    // DKI: cold (blocks computed), then warm from L1; L2 (1-byte L1); L3 (system reopened each turn).
    const dkiTurn = (sys) => async () => {
      const r = await sys.chat(QUERY, { userId: "u1", sessionId: session(), maxNewTokens: NEW_TOKENS, forceAlpha: size > 0 ? 1 : undefined });
      const memTokens = r.memoriesUsed.reduce((n, m) => n + m.tokens, 0);
      return { r, memoryTokens: memTokens, userTokens: r.inputTokens, ids: r.memoriesUsed.map((m) => m.id) };
    };
    const big = { l1Bytes: 2 ** 30, l2Bytes: 2 ** 30, l3Bytes: 8 * 2 ** 30 };
    let dki = await DKISystem.open({ model, dataDir: data, cacheDir, config, openStore: (o) => MemoryStore.open(o), budgets: big });
    const cold = await measure("DKI", "cold (L4)", dkiTurn(dki), 1);
    const l1 = await measure("DKI", "L1", dkiTurn(dki));
    await dki.close();
    dki = await DKISystem.open({ model, dataDir: data, cacheDir, config, openStore: (o) => MemoryStore.open(o), budgets: { ...big, l1Bytes: 1 } });
    await dkiTurn(dki)(); // blocks from L3 into L2
    const l2 = await measure("DKI", "L2", dkiTurn(dki));
    await dki.close();
    const l3 = await measure("DKI", "L3", async () => {
      const sys = await DKISystem.open({ model, dataDir: data, cacheDir, config, openStore: (o) => MemoryStore.open(o), budgets: big });
      try {
        return await dkiTurn(sys)();
      } finally {
        await sys.close();
      }
    });
    const ragIds = ragRow.ids;
    for (const row of [ragRow, cold, l1, l2, l3]) {
      // Shared retrieval: both systems were given the same memory set (RAG may cut it to its budget).
      row["same memories as RAG"] = row.system === "RAG" ? "-" : ragIds.every((id) => row.ids.includes(id)) ? (row.ids.length === ragIds.length ? "yes" : `RAG kept ${ragIds.length}/${row.ids.length}`) : "NO";
      delete row.ids;
      rows.push(row);
    }
    const warm = l1["ttft ms"];
    process.stderr.write(`${preset} ${size}: RAG ttft ${ragRow["ttft ms"].toFixed(1)} ms (${ragRow["prompt tokens"]} prompt tokens), DKI cold ${cold["ttft ms"].toFixed(1)} / L1 ${warm.toFixed(1)} / L2 ${l2["ttft ms"].toFixed(1)} / L3 ${l3["ttft ms"].toFixed(1)} ms\n`);
    rmSync(data, { recursive: true, force: true });
    rmSync(cacheDir, { recursive: true, force: true });
  }
  model.dispose();
}

// --sizes none: only the conversation below.
if (rows.length > 0) {
  const columns = ["shape", "memory tokens", "system", "tier", "memories reaching the model", "memory tokens reaching the model", "prompt tokens", "attention scores", "ttft ms", "decode tok/s", "turn ms", "peak RSS MB", "same memories as RAG"];
  const ratio = (preset, size) => {
    const rag = rows.find((r) => r.shape === preset && r["memory tokens"] === size && r.system === "RAG");
    const l1 = rows.find((r) => r.shape === preset && r["memory tokens"] === size && r.tier === "L1");
    return rag && l1 ? rag["ttft ms"] / l1["ttft ms"] : null;
  };
  const ratios = shapes.flatMap((p) => [...new Set(rows.filter((r) => r.shape === p).map((r) => r["memory tokens"]))].map((s) => `${p} ${s}: ${ratio(p, s)?.toFixed(1)}×`));
  const plots = await writePlots(rows);
  writeResults(resultName, {
    machine: machine(native()),
    columns,
    rows,
    notes: [
      `${modelDirs.length > 0 ? `Models ${modelDirs.map((d) => d.replace(`${process.cwd()}/`, "")).join(", ")}` : "Random-weight F16 models at real shapes"}; one user; memories of ${MEMORY_TOKENS} tokens (a size of S tokens is S/${MEMORY_TOKENS} memories); query "${QUERY}"; ${NEW_TOKENS} new tokens; a fresh session per turn (no history); the chat template; mean of ${REPS} turns a row (1 at 4K and above; DKI cold is 1 turn); RAG's rows come after one unmeasured turn that warms the store's index.`,
      `Both systems run the same routing call with the same config (maxMemories = number of memories), over the same store. RAG builds its prompt with seed 000's budget in a window of ${modelDirs.length > 0 ? `${Number(arg("--ctx") ?? 4096)} tokens` : "8192 tokens (135M; the shape's trained positions) or 4096 (1B)"}: 512 reserved, memory at most 50% of the rest, so past that share RAG keeps only what fits ('memory tokens reaching the model'); DKI injects every memory and spends 0 prompt tokens on them.`,
      "TTFT is from the chat() call to the first streamed token (routing, prompt, K/V assembly and prefill). DKI cold: every block computed (L4); L1: the next turn; L2: a 1-byte L1, so blocks come back from f16 RAM; L3: the system reopened before each turn (int8 files only). DKI forces α = 1 on every routed memory (no gating skip), RAG has no gate.",
      "Attention scores of the prefill: RAG (n_m + n_u)², DKI n_u·(n_m + n_u), with n_m the memory tokens reaching the model and n_u the other prompt tokens.",
      "Peak RSS: the process's high-water mark during the turn (reset before it); the model and every earlier allocation are in it, so it shows growth, not the turn's own memory.",
      `RAG TTFT / warm (L1) DKI TTFT: ${ratios.join(", ")}.`,
      loadNote(),
      `Plots: ${plots.map((p) => p.png.split("/").pop()).join(", ")} (Vega-Lite specs and SVG beside them).`,
    ],
  });
}

// A real conversation: its first user's turns are the memories, its last turn the query.
const conversation = arg("--conversation");
if (conversation) {
  const { parseConversations } = await import("../dist/src/memory/index.js");
  const preset = presets[0];
  const model = await Model.load(await benchModel(preset, "f16"), { contextSize: preset === "llama-1b" ? 4096 : 8192 });
  const data = mkdtempSync(join(tmpdir(), "dki-vs-rag-conv-"));
  const cacheDir = mkdtempSync(join(tmpdir(), "dki-vs-rag-conv-cache-"));
  const { format, conversations } = await parseConversations(conversation);
  const first = conversations[0];
  const store = await MemoryStore.open({ dir: data });
  await store.importConversations(conversation);
  await store.close();
  const last = first.turns[first.turns.length - 1].text;
  const query = last.replace(/^[^:]{1,40}:\s*/, "");
  const maxMemories = Number(arg("--max-memories") ?? 8);
  const config = { maxMemories, memoryMaxTokens: 65536, historyEnabled: false, preferenceEnabled: false, gating: { relevanceThreshold: 0 } };
  let n = 0;
  const convRows = [];
  const row = (system, tier, r, memoryTokens, ids) => ({
    system,
    tier,
    "memories reaching the model": ids.length,
    "memory tokens reaching the model": memoryTokens,
    "prompt tokens": r.inputTokens,
    "ttft ms": r.latency.ttftMs,
    "decode tok/s": r.latency.decodeMs > 0 && r.outputTokens > 1 ? ((r.outputTokens - 1) * 1000) / r.latency.decodeMs : 0,
    "turn ms": r.latency.totalMs,
  });
  const avg = (rs) => ({ ...rs[0], ...Object.fromEntries(["ttft ms", "decode tok/s", "turn ms"].map((k) => [k, mean(rs.map((x) => x[k]))])) });
  const rag = await RAGSystem.open({ model, dataDir: data, config, openStore: (o) => MemoryStore.open(o) });
  await rag.chat(query, { userId: first.userId, sessionId: `c${n++}`, maxNewTokens: 1 });
  const ragRuns = [];
  for (let k = 0; k < REPS; k++) {
    const r = await rag.chat(query, { userId: first.userId, sessionId: `c${n++}`, maxNewTokens: NEW_TOKENS });
    ragRuns.push(row("RAG", "-", r, r.metadata.contextTokens, r.memoriesUsed.map((m) => m.id)));
  }
  await rag.close();
  convRows.push(avg(ragRuns));
  const dki = await DKISystem.open({ model, dataDir: data, cacheDir, config, openStore: (o) => MemoryStore.open(o) });
  const dkiRow = async (tier) => {
    const r = await dki.chat(query, { userId: first.userId, sessionId: `c${n++}`, maxNewTokens: NEW_TOKENS, forceAlpha: 1 });
    return row("DKI", tier, r, r.memoriesUsed.reduce((a, m) => a + m.tokens, 0), r.memoriesUsed.map((m) => m.id));
  };
  convRows.push(await dkiRow("cold (L4)"));
  const warm = [];
  for (let k = 0; k < REPS; k++) warm.push(await dkiRow("L1"));
  convRows.push(avg(warm));
  await dki.close();
  model.dispose();
  rmSync(data, { recursive: true, force: true });
  rmSync(cacheDir, { recursive: true, force: true });
  writeResults("dki-vs-rag-conversation-cpu", {
    machine: machine(native()),
    columns: ["system", "tier", "memories reaching the model", "memory tokens reaching the model", "prompt tokens", "ttft ms", "decode tok/s", "turn ms"],
    rows: convRows,
    notes: [
      `${format} file ${conversation.split("/").pop()}: user ${first.userId}, ${first.turns.length} turns imported as memories; query: its last turn ("${query.slice(0, 80)}${query.length > 80 ? "…" : ""}"); maxMemories ${maxMemories} for both systems; ${preset} shape, random F16 weights; mean of ${REPS} turns (DKI cold: 1).`,
      loadNote(),
    ],
  });
}
