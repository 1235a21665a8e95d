// Recall v4 inside the DKI system, end to end on a generated model and the real store: the
// history provider switches with recall.enabled, a turn's suffix holds the old message the query
// is about, metadata.recallV4 reports the turn, the records keep the original query, and
// DKISystem.recall and `dki recall` give the same suffix without generating.
import { afterAll, beforeAll, expect, test } from "vitest";
import { Model } from "../src/engine/model.js";
import { makeTinyModel } from "../src/models/make-tiny.js";
import { DKISystem, resolveConfig } from "../src/dki/index.js";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { tempDir } from "./support/paths.js";
import { dki } from "./support/dki-bin.js";
import { syntheticConversation } from "./support/recall-sessions.js";

let model: Model;
let modelDir: string;
beforeAll(async () => {
  modelDir = tempDir();
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: modelDir, seed: 5 });
  model = await Model.load(modelDir, { contextSize: 2048 });
}, 600_000);
afterAll(() => model?.dispose());

const EVIDENCE = "By the way, the storage unit at Redwood Lane is number 418 and the gate code is 5521.";
const QUESTION = "What is the gate code of the storage unit at Redwood Lane?";

test("recall.enabled switches the history to Recall v4: the old evidence is in the suffix, metadata.recallV4 is reported, the records keep the query", async () => {
  const data = tempDir();
  let evidenceId = "";
  const sys = await DKISystem.open({ model, dataDir: data, config: { chatTemplate: "never", recall: { enabled: true } } });
  try {
    const turn = (query: string, response: string) => sys.conversations.recordTurn({ userId: "u", sessionId: "s", query, response, injectionMode: "none", memoryIds: [], latencyMs: 1, auditAction: "test" });
    const ev = await turn(EVIDENCE, "Noted.");
    evidenceId = ev.userTurn.id;
    for (let i = 0; i < 40; i++) await turn(`Message number ${i} about the weather and lunch.`, "Okay.");
    await sys.conversations.recordTurn({ userId: "other", sessionId: "s", query: "The gate code of my storage unit at Redwood Lane is 9999.", response: "ok", injectionMode: "none", memoryIds: [], latencyMs: 1, auditAction: "test" });

    const r = await sys.chat(QUESTION, { userId: "u", sessionId: "s", maxNewTokens: 3 });
    const h = r.metadata.hybridInjection;
    expect(h.historyStrategy).toBe("recall_v4");
    expect(h.historySuffixText).toContain(EVIDENCE);
    expect(h.historySuffixText).not.toContain("9999");
    expect(h.historyMessages.map((m) => m.id)).toContain(ev.userTurn.id);
    expect(h.finalInput).toContain(EVIDENCE);
    expect(r.metadata.recallV4).toMatchObject({ rounds: expect.any(Number), calls: expect.any(Array) });
    // A random model: no fact call expected, and then none is made.
    if (!/retrieve_fact/.test(r.text)) expect(r.metadata.recallV4).toMatchObject({ rounds: 0, stoppedBy: "no_call", calls: [] });
    const rows = await sys.conversations.list({ userId: "u", sessionId: "s", limit: 2 });
    expect(rows.map((t) => [t.role, t.content])).toEqual([["user", QUESTION], ["assistant", r.text]]);

    const direct = await sys.recall(QUESTION, { userId: "u", sessionId: "s" });
    expect(direct.included.some((m) => m.id === ev.userTurn.id && m.reason === "signal")).toBe(true);
  } finally {
    await sys.close();
  }

  // The same recall from the command line (the built CLI: npx tsc -p tsconfig.json first).
  const { stdout } = await dki(["recall", "--model", modelDir, "--data", data, "--user", "u", "--session", "s", "--query", QUESTION, "--format", "json", "--context-size", "2048"]);
  const out = JSON.parse(stdout) as { messages: { id: string; summarized: boolean; signals: { keyword: number } }[]; suffix: { text: string; tokens: number; available: number } };
  expect(out.messages.find((m) => m.id === evidenceId)?.signals.keyword).toBeGreaterThan(0);
  expect(out.suffix.text).toContain(EVIDENCE);
  expect(out.suffix.tokens).toBeLessThanOrEqual(out.suffix.available);
  await expect(dki(["recall", "--model", modelDir, "--data", data, "--user", "u", "--query", QUESTION])).rejects.toThrow(/--scope session needs --session/);
}, 900_000);

test("without recall.enabled the flat history stays, and recall() says how to turn it on; a bad recall key fails when the system opens", async () => {
  const sys = await DKISystem.open({ model, dataDir: tempDir() });
  try {
    await expect(sys.recall("hi", { userId: "u", sessionId: "s" })).rejects.toThrow(/set config\.recall\.enabled/);
    const r = await sys.chat("hello", { userId: "u", sessionId: "s", maxNewTokens: 1 });
    expect(r.metadata.hybridInjection.historyStrategy).toBe("flat_history");
    expect(r.metadata.recallV4).toBeUndefined();
  } finally {
    await sys.close();
  }
  expect(() => resolveConfig({ recall: { budget: { max_recent_turns: -1 } } })).toThrow(/config\.recall\.budget\.max_recent_turns must be an integer >= 0, got -1/);
  // A misspelt key is refused at every level, not ignored.
  expect(() => resolveConfig({ maxMemory: 2 } as never)).toThrow(/^config has no key "maxMemory" \(known: maxMemories, /);
  expect(() => resolveConfig({ gating: { alphaMx: 1 } } as never)).toThrow(/^config\.gating has no key "alphaMx"/);
  expect(() => resolveConfig({ gating: 3 } as never)).toThrow(/^config\.gating must be an object, got 3/);
}, 600_000);

test("a LoCoMo file imported as history (dki memory import --as history) is recalled across its sessions: the old evidence turn is in the suffix with its source turn id", async () => {
  // 200 turns (400 messages) of everyday chatter in sessions of 40 messages, the answer in one old message.
  const conv = syntheticConversation(3, "en", 200);
  const sessions: Record<string, unknown> = { speaker_a: "Sam", speaker_b: "Alex" };
  conv.messages.forEach((m, i) => {
    const key = `session_${Math.floor(i / 40) + 1}`;
    sessions[`${key}_date_time`] ??= `10:00 am on ${Math.floor(i / 40) + 1} May, 2023`;
    ((sessions[key] ??= []) as unknown[]).push({ speaker: m.role === "user" ? "Sam" : "Alex", dia_id: `D${Math.floor(i / 40) + 1}:${(i % 40) + 1}`, text: m.content });
  });
  const file = join(tempDir(), "history.json");
  writeFileSync(file, JSON.stringify([{ sample_id: "sam", conversation: sessions, qa: [] }]));
  const data = tempDir();
  const imported = JSON.parse((await dki(["memory", "import", file, "--data", data, "--as", "history"])).stdout) as unknown;
  expect(imported).toEqual({ format: "locomo", as: "history", users: [{ user_id: "sam", messages: 400 }], messages: 400, invalid_utf8: 0 });

  const { stdout } = await dki(["recall", "--model", modelDir, "--data", data, "--user", "sam", "--scope", "user", "--query", conv.needle.question, "--format", "json", "--context-size", "2048"]);
  const out = JSON.parse(stdout) as { searched: number; messages: { content: string; metadata?: { turn_id: string } }[]; suffix: { text: string; tokens: number; available: number } };
  expect(out.searched).toBe(400);
  const at = conv.evidenceAt;
  const evidence = out.messages.find((m) => m.content.includes(conv.needle.evidence));
  expect(evidence?.metadata?.turn_id).toBe(`D${Math.floor(at / 40) + 1}:${(at % 40) + 1}`);
  expect(out.suffix.text).toContain(conv.needle.evidence);
  expect(out.suffix.tokens).toBeLessThanOrEqual(out.suffix.available);
}, 600_000);

test("recall.prompt_formatter frames a Recall v4 turn's prompt: the model's template (auto), the plain form (generic), or a built-in family format whatever the model ships", async () => {
  const frame = async (prompt_formatter: "auto" | "generic" | "chatml" | "llama3" | "deepseek" | "glm") => {
    const sys = await DKISystem.open({ model, dataDir: tempDir(), config: { systemPrompt: "Be brief.", recall: { enabled: true, prompt_formatter } } });
    try {
      return (await sys.chat("Where is the cabin?", { userId: "u", sessionId: "s", maxNewTokens: 1 })).metadata.hybridInjection.finalInput;
    } finally {
      await sys.close();
    }
  };
  // The generated model ships ChatML: auto uses it.
  expect(await frame("auto")).toBe("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhere is the cabin?<|im_end|>\n<|im_start|>assistant\n");
  expect(await frame("chatml")).toBe(await frame("auto"));
  expect(await frame("generic")).toBe("Be brief.\n\nUser: Where is the cabin?\nAssistant:");
  const bos = model.tokenizer.bosToken ?? "";
  expect(await frame("llama3")).toBe(`${bos}<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhere is the cabin?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n`);
  expect(await frame("deepseek")).toBe(`${bos}Be brief.\n\n<｜User｜>Where is the cabin?<｜Assistant｜>`);
  expect(await frame("glm")).toBe("[gMASK]<sop><|system|>\nBe brief.<|user|>\nWhere is the cabin?<|assistant|>\n");
}, 600_000);
