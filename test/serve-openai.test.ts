// `dki serve`'s OpenAI API through the official `openai` client, unchanged, over loopback against
// a real server on a tiny model generated here: chat completions streamed and not (with the `dki`
// object saying what was injected), the RAG and memory-less modes, completions, models,
// embeddings, OpenAI's errors; and the SSE stream as `curl -N` shows it.
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { HashingEmbedder } from "../src/memory/embedders/hashing.js";
import { MemoryStore } from "../src/memory/index.js";
import type { DkiInfo } from "../src/server/openai.js";
import { tempDir } from "./support/paths.js";
import { call, makeTinyModel, startServer, type Running } from "./support/serve.js";

let running: Running;
let client: OpenAI;
let memId: string;
const QUERY = "Any tips for hiking in the Alps with a peanut allergy?";

/** The `dki` and `usage` the server adds beyond the client's types. */
type WithDki<T> = T & { dki: DkiInfo; usage: { memory_tokens_kv: number } };

beforeAll(async () => {
  const model = await makeTinyModel();
  const data = join(tempDir(), "data");
  const store = await MemoryStore.open({ dir: data });
  [{ id: memId }] = await store.memories.add("Alice loves hiking in the Alps and is allergic to peanuts.", { userId: "alice" });
  await store.memories.add("Bob keeps bees in Provence.", { userId: "bob" });
  await store.close();
  running = await startServer(model, data);
  client = new OpenAI({ baseURL: `${running.url}/v1`, apiKey: "not-checked-without-a-key-file", maxRetries: 0 });
});

afterAll(async () => {
  await running?.server.close();
});

describe("dki serve: the openai client", () => {
  test("models: list and retrieve name the served model", async () => {
    const list = await client.models.list();
    expect(list.data.map((m) => m.id)).toEqual(["tiny"]);
    expect((await client.models.retrieve("tiny")).owned_by).toBe("dki-engine");
    await expect(client.models.retrieve("gpt-4o")).rejects.toBeInstanceOf(OpenAI.NotFoundError);
  });

  test("chat, not streamed: the answer, usage, and the dki object with the memory injected; the turn is recorded", async () => {
    const r = (await client.chat.completions.create({ model: "tiny", user: "alice", max_tokens: 6, messages: [{ role: "user", content: QUERY }] })) as WithDki<OpenAI.ChatCompletion>;
    expect(r.object).toBe("chat.completion");
    expect(r.choices[0].message.role).toBe("assistant");
    expect(r.choices[0].message.content!.length).toBeGreaterThan(0);
    expect(["stop", "length"]).toContain(r.choices[0].finish_reason);
    expect(r.usage!.completion_tokens).toBeLessThanOrEqual(6);
    expect(r.usage!.total_tokens).toBe(r.usage!.prompt_tokens + r.usage!.completion_tokens);
    expect(r.dki.mode).toBe("dki");
    expect(r.dki.user).toBe("alice");
    expect(r.dki.memories.map((m) => m.id)).toEqual([memId]);
    const m = r.dki.memories[0];
    expect(m.text).toContain("peanuts");
    expect(m.alpha).toBeGreaterThan(0);
    expect(["L1", "L2", "L3", "L4"]).toContain(m.tier);
    expect(r.dki.gate?.reason).toMatch(/relevance/);
    expect(r.usage.memory_tokens_kv).toBeGreaterThan(0);
    expect(r.dki.latency.ttft_ms).toBeGreaterThan(0);
    // Recorded in the store under alice and the session the response names: the query as sent.
    const msgs = await call(running.url, "GET", `/v1/sessions/${r.dki.session}/messages?user_id=alice`);
    expect(msgs.status).toBe(200);
    const rows = (msgs.json as { results: { role: string; content: string; injection_mode: string | null }[] }).results;
    expect(rows.map((x) => [x.role, x.content])).toEqual([["user", QUERY], ["assistant", r.choices[0].message.content]]);
    expect(rows[1].injection_mode).toBe("dki");
  });

  test("chat, streamed: chunks add up to the same greedy answer, the last one carries dki and usage; dki.session continues a session", async () => {
    const plain = (await client.chat.completions.create({ model: "tiny", user: "alice", max_tokens: 8, messages: [{ role: "user", content: QUERY }] })) as WithDki<OpenAI.ChatCompletion>;
    const stream = await client.chat.completions.create({ model: "tiny", user: "alice", max_tokens: 8, stream: true, messages: [{ role: "user", content: QUERY }] });
    const chunks: WithDki<OpenAI.ChatCompletionChunk>[] = [];
    for await (const c of stream) chunks.push(c as WithDki<OpenAI.ChatCompletionChunk>);
    expect(chunks.length).toBeGreaterThan(2);
    expect(chunks[0].choices[0].delta.role).toBe("assistant");
    expect(chunks.map((c) => c.choices[0]?.delta.content ?? "").join("")).toBe(plain.choices[0].message.content);
    const last = chunks[chunks.length - 1];
    expect(last.choices[0].finish_reason).toBe(plain.choices[0].finish_reason);
    expect(last.dki.memories.map((m) => m.id)).toEqual([memId]);
    expect(last.usage).toMatchObject({ completion_tokens: plain.usage!.completion_tokens, prompt_tokens: plain.usage!.prompt_tokens });
    for (const c of chunks.slice(0, -1)) expect(c.dki).toBeUndefined();

    // The next turn of that session reads the first from the store (history as prompt text: more prompt tokens).
    const next = (await client.chat.completions.create({ model: "tiny", user: "alice", max_tokens: 2, messages: [{ role: "user", content: QUERY }], ...{ dki: { session: last.dki.session } } })) as WithDki<OpenAI.ChatCompletion>;
    expect(next.dki.session).toBe(last.dki.session);
    expect(next.usage!.prompt_tokens).toBeGreaterThan(plain.usage!.prompt_tokens);
  });

  test("modes: rag puts the memory in the prompt (tier prompt, no α), none injects nothing, alpha is forced", async () => {
    const dkiTurn = (await client.chat.completions.create({ model: "tiny", user: "alice", max_tokens: 2, messages: [{ role: "user", content: QUERY }] })) as WithDki<OpenAI.ChatCompletion>;
    const rag = (await client.chat.completions.create({ model: "tiny", user: "alice", max_tokens: 2, messages: [{ role: "user", content: QUERY }], ...{ dki: { mode: "rag" } } })) as WithDki<OpenAI.ChatCompletion>;
    expect(rag.dki.mode).toBe("rag");
    expect(rag.dki.memories).toEqual([expect.objectContaining({ id: memId, tier: "prompt", alpha: null })]);
    expect(rag.usage.memory_tokens_kv).toBe(0);
    expect(rag.usage!.prompt_tokens).toBeGreaterThan(dkiTurn.usage!.prompt_tokens);
    const none = (await client.chat.completions.create({ model: "tiny", user: "alice", max_tokens: 2, messages: [{ role: "user", content: QUERY }], ...{ dki: { mode: "none" } } })) as WithDki<OpenAI.ChatCompletion>;
    expect(none.dki.memories).toEqual([]);
    expect(none.usage.memory_tokens_kv).toBe(0);
    const forced = (await client.chat.completions.create({ model: "tiny", user: "alice", max_tokens: 2, messages: [{ role: "system", content: "Be brief." }, { role: "user", content: QUERY }], ...{ dki: { alpha: 0.5, max_memories: 1 } } })) as WithDki<OpenAI.ChatCompletion>;
    expect(forced.dki.gate).toMatchObject({ forced: true, alpha: 0.5 });
    expect(forced.dki.memories[0].alpha).toBe(0.5);
    // τ per turn: above every relevance nothing is injected; at 0 the memory clears the gate.
    const shut = (await client.chat.completions.create({ model: "tiny", user: "alice", max_tokens: 1, messages: [{ role: "user", content: QUERY }], ...{ dki: { tau: 1 } } })) as WithDki<OpenAI.ChatCompletion>;
    expect(shut.dki.memories).toEqual([]);
    expect(shut.dki.gate?.reason).toMatch(/1\.000/);
    const open = (await client.chat.completions.create({ model: "tiny", user: "alice", max_tokens: 1, messages: [{ role: "user", content: QUERY }], ...{ dki: { tau: 0 } } })) as WithDki<OpenAI.ChatCompletion>;
    expect(open.dki.memories.map((m) => m.id)).toEqual([memId]);
    // bob's turn never sees alice's memory.
    const bob = (await client.chat.completions.create({ model: "tiny", user: "bob", max_tokens: 2, messages: [{ role: "user", content: QUERY }], ...{ dki: { alpha: 1 } } })) as WithDki<OpenAI.ChatCompletion>;
    expect(bob.dki.memories.map((m) => m.text)).toEqual(["Bob keeps bees in Provence."]);
  });

  test("completions: the model continues the prompt, streamed and not alike", async () => {
    const r = await client.completions.create({ model: "tiny", prompt: "Once upon a time", max_tokens: 6 });
    expect(r.object).toBe("text_completion");
    expect(r.choices[0].text.length).toBeGreaterThan(0);
    expect(r.usage!.completion_tokens).toBeLessThanOrEqual(6);
    const stream = await client.completions.create({ model: "tiny", prompt: "Once upon a time", max_tokens: 6, stream: true });
    let text = "";
    let finish: string | null = null;
    for await (const c of stream) {
      text += c.choices[0].text;
      finish = c.choices[0].finish_reason ?? finish;
    }
    expect(text).toBe(r.choices[0].text);
    expect(finish).toBe(r.choices[0].finish_reason);
  });

  test("embeddings: the store's embedder's vectors, as base64 (the client's default) and as floats", async () => {
    const want = await new HashingEmbedder().embed(["peanut allergy", "bees"]);
    const r = await client.embeddings.create({ model: "tiny", input: ["peanut allergy", "bees"] });
    expect(r.data.map((d) => d.index)).toEqual([0, 1]);
    expect(r.model).toBe("hashing-v1-d512");
    r.data.forEach((d, i) => expect(d.embedding).toEqual(Array.from(want[i])));
    const f = await client.embeddings.create({ model: "hashing-v1-d512", input: "bees", encoding_format: "float" });
    expect(f.data[0].embedding).toEqual(Array.from(want[1]));
    expect(f.usage.prompt_tokens).toBeGreaterThan(0);
    await expect(client.embeddings.create({ model: "tiny", input: "bees", dimensions: 3 })).rejects.toMatchObject({ status: 400, param: "dimensions" });
  });

  test("errors are OpenAI's: status, type, param and code, through the client's error classes", async () => {
    await expect(client.chat.completions.create({ model: "gpt-4o", messages: [{ role: "user", content: "hi" }] })).rejects.toMatchObject({ status: 404, code: "model_not_found", param: "model" });
    const unknown = client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "hi" }], ...{ frobnicate: true } });
    await expect(unknown).rejects.toBeInstanceOf(OpenAI.BadRequestError);
    await expect(unknown).rejects.toMatchObject({ param: "frobnicate", code: "unknown_field", type: "invalid_request_error" });
    await expect(client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "hi" }, { role: "assistant", content: "hello" }, { role: "user", content: "again" }] })).rejects.toMatchObject({ status: 400, code: "history_in_request", param: "messages[0]" });
    await expect(client.chat.completions.create({ model: "tiny", max_tokens: 1_000_000, messages: [{ role: "user", content: "hi" }] })).rejects.toMatchObject({ status: 400, param: "max_tokens", code: "max_tokens_too_large" });
    await expect(client.chat.completions.create({ model: "tiny", temperature: 7, messages: [{ role: "user", content: "hi" }] })).rejects.toMatchObject({ status: 400, param: "temperature" });
    await expect(client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "hi" }], ...{ dki: { mode: "rag", alpha: 0.5 } } })).rejects.toMatchObject({ status: 400, param: "dki.alpha" });
    await expect(client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "hi" }], ...{ dki: { alpha: 0.5, tau: 0.2 } } })).rejects.toMatchObject({ status: 400, param: "dki.tau" });
  });
});

const curl = ["/usr/bin/curl", "/bin/curl"].find((p) => existsSync(p));

describe.skipIf(curl === undefined)("dki serve: curl -N", () => {
  test("shows the SSE stream: data: lines, the last chunk with finish_reason and dki, then data: [DONE]", async () => {
    const body = JSON.stringify({ model: "tiny", user: "alice", max_tokens: 5, stream: true, messages: [{ role: "user", content: QUERY }] });
    const { stdout } = await promisify(execFile)(curl!, ["-sS", "-N", "-H", "content-type: application/json", "-d", body, `${running.url}/v1/chat/completions`]);
    const events = stdout.split("\n\n").filter((e) => e !== "");
    for (const e of events) expect(e.startsWith("data: ")).toBe(true);
    expect(events[events.length - 1].trim()).toBe("data: [DONE]");
    const last = JSON.parse(events[events.length - 2].slice(6)) as WithDki<OpenAI.ChatCompletionChunk>;
    expect(last.choices[0].finish_reason).not.toBeNull();
    expect(last.dki.memories[0].id).toBe(memId);
    const text = events.slice(0, -2).map((e) => (JSON.parse(e.slice(6)) as OpenAI.ChatCompletionChunk).choices[0].delta.content).join("");
    expect(text.length).toBeGreaterThan(0);
  });
});
