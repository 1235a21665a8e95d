// Conversation import: LoCoMo and LongMemEval files in their published shapes become one user per
// conversation and one memory per turn; a file of the wrong shape is refused naming the path
// inside it, before anything is written.
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, expect, it } from "vitest";
import { ImportFormatError } from "../src/memory/errors.js";
import { MemoryStore } from "../src/memory/memory-store.js";
import { locomoSample, longMemEvalSample } from "./support/conversation-samples.js";
import { tempDir } from "./support/paths.js";

const open: MemoryStore[] = [];
async function openStore(options: Partial<Parameters<typeof MemoryStore.open>[0]> = {}): Promise<MemoryStore> {
  const s = await MemoryStore.open({ dir: tempDir(), durability: "commit", ...options });
  open.push(s);
  return s;
}
afterEach(async () => {
  for (const s of open.splice(0)) await s.close();
});

function file(data: unknown): string {
  const path = join(tempDir(), "data.json");
  writeFileSync(path, typeof data === "string" ? data : JSON.stringify(data));
  return path;
}

it("imports LoCoMo: one user per sample (sample_id, else conv-<index>), one memory per turn, sessions at either level", async () => {
  const store = await openStore();
  const result = await store.importConversations(file(locomoSample()));
  expect(result).toEqual({
    format: "locomo",
    as: "memories",
    users: [
      { userId: "conv-26", memories: 7, messages: 0 },
      { userId: "conv-1", memories: 3, messages: 0 },
    ],
    memories: 10,
    messages: 0,
    invalidUtf8: 0,
  });
  const caroline = await store.memories.getAll({ userId: "conv-26" });
  expect(caroline[0]).toMatchObject({
    sessionId: "session_1",
    text: "Caroline: Hey Mel! I went to an LGBTQ support group yesterday and it was so powerful.",
    metadata: { turnId: "D1:1", speaker: "Caroline", sessionId: "session_1", date: "1:56 pm on 8 May, 2023" },
  });
  expect(caroline[3].text).toBe("Melanie: Look at this one I painted last week. [image: a photo of a painting of a sunset over a lake]");
  // session_10 sorts after session_1 by number.
  expect((await store.memories.getAll({ userId: "conv-1" })).map((m) => m.metadata.turnId)).toEqual(["D1:1", "D1:2", "D10:1"]);
  const hit = await store.memories.search("counseling career", { userId: "conv-26", limit: 1 });
  expect(hit[0].memory.metadata.turnId).toBe("D1:3");
  // A second import of the same users is refused rather than doubled.
  await expect(store.importConversations(file(locomoSample()))).rejects.toThrow(/user "conv-26" already exists in the store/);
  expect(store.stats().memories).toBe(10);
});

it("imports LongMemEval: one user per question_id, turnId <session id>:<turn index>", async () => {
  const store = await openStore();
  const result = await store.importConversations(file(longMemEvalSample()), { format: "auto" });
  expect(result).toEqual({ format: "longmemeval", as: "memories", users: [{ userId: "e47becba", memories: 4, messages: 0 }], memories: 4, messages: 0, invalidUtf8: 0 });
  const all = await store.memories.getAll({ userId: "e47becba", sessionId: "answer_280352e9" });
  expect(all[0]).toMatchObject({ text: "User: I graduated with a degree in Business Administration, what jobs fit?", metadata: { turnId: "answer_280352e9:0", speaker: "user", date: "2023/05/22 (Mon) 10:00" } });
});

it("imports as history: each turn a message of its session, in file order, roles from the speakers, the source's turn ids kept; no memories", async () => {
  const store = await openStore();
  const result = await store.importConversations(file(locomoSample()), { as: "history" });
  expect(result).toMatchObject({ as: "history", users: [{ userId: "conv-26", memories: 0, messages: 7 }, { userId: "conv-1", memories: 0, messages: 3 }], memories: 0, messages: 10 });
  expect(await store.memories.getAll({ userId: "conv-26" })).toEqual([]);
  const all = await store.conversations.listUser({ userId: "conv-26" });
  expect(all.map((t) => [t.sessionId, t.role, t.metadata?.turnId])).toEqual([
    ["session_1", "user", "D1:1"],
    ["session_1", "assistant", "D1:2"],
    ["session_1", "user", "D1:3"],
    ["session_1", "assistant", "D1:4"],
    ["session_2", "assistant", "D2:1"],
    ["session_2", "user", "D2:2"],
    ["session_2", "assistant", "D2:3"],
  ]);
  expect(all[3]).toMatchObject({ content: "Melanie: Look at this one I painted last week. [image: a photo of a painting of a sunset over a lake]", metadata: { speaker: "Melanie", date: "1:56 pm on 8 May, 2023" } });
  expect((await store.conversations.list({ userId: "conv-26", sessionId: "session_2" })).map((t) => t.metadata?.turnId)).toEqual(["D2:1", "D2:2", "D2:3"]);
  // No speaker_a: whoever speaks first is the user's side. session_10 after session_1.
  expect((await store.conversations.listUser({ userId: "conv-1" })).map((t) => [t.role, t.metadata?.turnId])).toEqual([["user", "D1:1"], ["assistant", "D1:2"], ["user", "D10:1"]]);
  // A turn id resolves through the store's scope like any turn: another user's reads as not found.
  expect(await store.conversations.get(all[0].id, { userId: "conv-26" })).toMatchObject({ content: all[0].content });
  expect(await store.conversations.get(all[0].id, { userId: "conv-1" })).toBeUndefined();
  expect((await store.audit.list({ userId: "conv-26", action: "history_import" }))[0].metadata).toEqual({ messages: 7 });
  await expect(store.importConversations(file(locomoSample()), { as: "history" })).rejects.toThrow(/user "conv-26" already exists in the store/);

  const lme = await store.importConversations(file(longMemEvalSample()), { as: "history" });
  expect(lme.messages).toBe(4);
  expect((await store.conversations.listUser({ userId: "e47becba" })).map((t) => t.role)).toEqual(["user", "assistant", "user", "assistant"]);
  const badRole = longMemEvalSample() as { haystack_sessions: { role: string }[][] }[];
  badRole[0].haystack_sessions[0][1].role = "narrator";
  await expect(store.importConversations(file(badRole), { as: "history" })).rejects.toThrow(/\[0\]\.haystack_sessions\[0\]\[1\]\.role: expected "user", "assistant" or "system", got "narrator"/);
  await expect(store.importConversations(file(locomoSample()), { as: "notes" as "history" })).rejects.toThrow(/cannot import as "notes" \(expected "memories" or "history"\)/);
});

it("refuses files of the wrong shape, naming the path inside the file, and writes nothing", async () => {
  const store = await openStore({ maxTextChars: 100 });
  const bad = (mutate: (d: any) => void, format: "auto" | "locomo" | "longmemeval" = "auto") => {
    const d = format === "longmemeval" ? longMemEvalSample() : locomoSample();
    mutate(d);
    return store.importConversations(file(d), { format });
  };
  await expect(bad((d) => (d[0].conversation.session_2[1].text = 42))).rejects.toThrow(/\[0\]\.conversation\.session_2\[1\]\.text: expected a string, got a number/);
  await expect(bad((d) => delete d[1].session_1[0].dia_id)).rejects.toThrow(/\[1\]\.session_1\[0\]\.dia_id: expected a string, got nothing \(missing\)/);
  await expect(bad((d) => (d[0].conversation.session_1 = {}))).rejects.toThrow(/\[0\]\.conversation\.session_1: expected a list of turns/);
  await expect(bad((d) => (d[1].sample_id = "conv-26"))).rejects.toThrow(/\[1\]: user id "conv-26" is also that of \[0\]/);
  await expect(bad((d) => (d[0].conversation.session_1[0].text = "x".repeat(200)))).rejects.toThrow(/\[0\]\.conversation\.session_1\[0\]: the turn is \d+ characters long as a memory; the store's maximum is 100/);
  await expect(bad((d) => d[0].haystack_dates.pop(), "longmemeval")).rejects.toThrow(/\[0\]: haystack_sessions \(2\), haystack_session_ids \(2\) and haystack_dates \(1\) differ/);
  await expect(bad((d) => (d[0].haystack_sessions[1][0] = "hi"), "longmemeval")).rejects.toThrow(/\[0\]\.haystack_sessions\[1\]\[0\]: expected an object, got a string/);
  await expect(store.importConversations(file({ hello: "world" }))).rejects.toThrow(/\$: neither LoCoMo .* nor LongMemEval/);
  await expect(store.importConversations(file(longMemEvalSample()), { format: "locomo" })).rejects.toThrow(/\[0\]: no session_<n> keys/);
  await expect(store.importConversations(file("[{"))).rejects.toThrow(ImportFormatError);
  await expect(store.importConversations(join(tempDir(), "missing.json"))).rejects.toThrow(/cannot read it/);
  // A sparse file: its size is what counts, and it is refused before being read.
  const huge = join(tempDir(), "huge.json");
  const { truncateSync } = await import("node:fs");
  writeFileSync(huge, "");
  truncateSync(huge, 600 * 2 ** 20);
  await expect(store.importConversations(huge)).rejects.toThrow(/huge\.json: \$: 600 MiB; a file is parsed whole, and above 512 MiB/);
  expect(store.listUsers()).toEqual([]);
});
