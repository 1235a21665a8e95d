// `dki chat`, run as a user runs it (node bin/dki.js, built by `npm test`'s tsc step): one answer
// as JSON with the DKIResponse's fields in snake_case, one streamed with its summary line, the
// interactive session's commands, and the usage errors.
import { spawn } from "node:child_process";
import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, describe, expect, test } from "vitest";
import { MemoryStore } from "../src/memory/index.js";
import { Tokenizer } from "../src/tokenizer/tokenizer.js";
import { ctrlCTests, dki, dkiBin, dkiFails } from "./support/dki-bin.js";
import { repoRoot, tempDir } from "./support/paths.js";

let model: string;
let data: string;
let memId: string;

beforeAll(async () => {
  model = join(tempDir(), "tiny");
  await dki(["models", "make-tiny", "--arch", "llama", "--preset", "tiny", "--dtype", "f32", "--out", model]);
  data = join(tempDir(), "data");
  const store = await MemoryStore.open({ dir: data });
  [{ id: memId }] = await store.memories.add("Alice loves hiking in the Alps and is allergic to peanuts.", { userId: "alice" });
  await store.preferences.add("short answers", { userId: "alice", type: "style" });
  await store.close();
});

describe("dki chat", () => {
  test("--query --format json prints the DKIResponse with snake_case keys; the turn is recorded", async () => {
    const { stdout } = await dki(["chat", "--model", model, "--data", data, "--user", "alice", "--session", "cli", "--query", "Any tips for hiking in the Alps with a peanut allergy?", "--format", "json", "-n", "4", "--threads", "1"]);
    const r = JSON.parse(stdout);
    expect(r.memories_used.map((m: { id: string }) => m.id)).toEqual([memId]);
    expect(r.gating.inject).toBe(true);
    expect(typeof r.gating.reason).toBe("string");
    expect(r.cache.tiers.map((b: { kind: string; tier: string }) => [b.kind, b.tier])).toEqual([["preferences", "L4"], ["memory", "L4"]]);
    for (const k of ["queue_ms", "routing_ms", "gating_ms", "entropy_probe_ms", "kv_compute_ms", "prefill_ms", "decode_ms", "ttft_ms", "total_ms"]) expect(typeof r.latency[k]).toBe("number");
    expect(Object.keys(r.latency.kv_load_ms)).toEqual(["L1", "L2", "L3"]);
    expect(r.budget.dki.tokens).toBe(r.input_tokens);
    expect(r.metadata.hybrid_injection.preference_text).toBe("- [style] short answers");
    expect(r.output_tokens).toBeLessThanOrEqual(4);

    // Another process, the same data: the blocks come from the L3 files, and the history holds turn 1.
    const again = JSON.parse((await dki(["chat", "--model", model, "--data", data, "--user", "alice", "--session", "cli", "--query", "And what should I pack?", "--alpha", "0.7", "--format", "json", "-n", "2"])).stdout);
    expect(again.cache.tiers.map((b: { tier: string }) => b.tier)).toEqual(["L3", "L3"]);
    expect(again.gating).toMatchObject({ forced: true, alpha: 0.7 });
    expect(again.metadata.hybrid_injection.history_messages[0]).toMatchObject({ role: "user", content: "Any tips for hiking in the Alps with a peanut allergy?" });
  });

  test("text: the answer streamed on stdout, the turn's summary on stderr; --no-memory injects nothing", async () => {
    const { stdout, stderr } = await dki(["chat", "--model", model, "--data", data, "--user", "alice", "--query", "Hiking in the Alps with peanuts?", "-n", "3"]);
    expect(stdout.endsWith("\n")).toBe(true);
    // The memory with its relevance and the start of its text (39 characters and an ellipsis), and the session the turn went to.
    const label = `${memId} \\(relevance \\d\\.\\d\\d\\) "Alice loves hiking in the Alps and is a…"`;
    expect(stderr).toMatch(new RegExp(`^\\[memories: ${label} \\| α \\d\\.\\d\\d \\| gate: top relevance .* \\| cache: preferences L[13], ${memId} L[13] \\| ttft \\d+ ms, \\d+ tokens \\| session chat-\\d{8}T\\d{6}Z-[0-9a-f]{6}\\]\\n$`));
    const off = await dki(["chat", "--model", model, "--data", data, "--user", "alice", "--query", "Hiking in the Alps with peanuts?", "-n", "3", "--no-memory"]);
    expect(off.stderr).toMatch(/^\[memories: none \| α - \| gate: injection is off for this turn \(allowInjection: false\) \| cache: nothing injected \|/);
  });

  test("interactive: /remember, /memories, /pref, an answer with its summary, a bad /forget reported without ending the session, /exit", async () => {
    const child = spawn(process.execPath, [dkiBin, "chat", "--model", model, "--data", data, "--user", "bob", "--session", "i", "-n", "3"], { stdio: ["pipe", "pipe", "pipe"] });
    let out = "";
    let err = "";
    child.stdout.on("data", (d: Buffer) => (out += d.toString()));
    child.stderr.on("data", (d: Buffer) => (err += d.toString()));
    child.stdin.end(["/remember Bob sails in Brittany every summer.", "/memories", "/pref food vegetarian", "/pref", "Tell me about sailing in Brittany", "/forget nope", "/bogus", "/exit", "never read"].join("\n") + "\n");
    const code = await new Promise<number | null>((r) => child.on("close", r));
    expect(code, err).toBe(0);
    expect(err).toMatch(/remembered mem_\S+/);
    expect(err).toMatch(/mem_\S+ {2}Bob sails in Brittany every summer\./);
    expect(err).toMatch(/added preference \S+/);
    expect(err).toMatch(/\S+ {2}\[food\] vegetarian \(priority \d+\)/);
    expect(err).toMatch(/\[memories: mem_\S+ \(relevance \d\.\d\d\) "Bob sails in Brittany every summer\." \| α \d\.\d\d \| gate: .* \| cache: preferences L4, mem_\S+ L4 \|/);
    expect(err).toMatch(/dki: .*nope/);
    expect(err).toMatch(/unknown command \/bogus/);
    expect(out.length).toBeGreaterThan(0);
  });

  test("--rerank-model routes the memories of both modes with the cross-encoder: the trained model then answers from the right one", { timeout: 60_000 }, async () => {
    const qa = join(repoRoot, "models", "memory-qa-block-aware");
    const xenc = join(repoRoot, "models", "memory-qa-reranker");
    const store = join(tempDir(), "dogs");
    await dki(["memory", "add", "--data", store, "--user", "carol", "User: Is my dog named? My friend's dog is Pelvorin."]);
    await dki(["memory", "add", "--data", store, "--user", "carol", "User: I have a dog named Corsadro."]);
    const ask = async (extra: string[]) => {
      const instruction = 'Answer the question about the user in a few words. If it was never mentioned, answer "not mentioned".';
      const r = JSON.parse((await dki(["chat", "--model", qa, "--data", store, "--user", "carol", "--max-memories", "1", "--system", instruction, "--query", "What is the name of the user's dog?", "--format", "json", "-n", "12", "--threads", "1", ...extra])).stdout);
      return { text: (r.text as string).trim(), memories: (r.memories_used as { text: string }[]).map((m) => m.text) };
    };
    // The search alone routes the friend's dog: the model copies the wrong name out of it.
    const plain = await ask(["--alpha", "1"]);
    expect(plain.memories).toEqual(["User: Is my dog named? My friend's dog is Pelvorin."]);
    expect(plain.text).not.toMatch(/Corsadro/);
    for (const mode of [["--alpha", "1"], ["--mode", "rag"]]) {
      const r = await ask([...mode, "--rerank-model", xenc, "--rerank-depth", "5"]);
      expect(r.memories).toEqual(["User: I have a dog named Corsadro."]);
      expect(r.text).toMatch(/Corsadro/);
    }
    expect(await dkiFails(["chat", "--model", qa, "--data", store, "--user", "carol", "--rerank-depth", "5", "--query", "q"])).toMatch(/--rerank-depth needs --rerank-model/);
    expect(await dkiFails(["chat", "--model", qa, "--data", store, "--user", "carol", "--rerank-model", join(xenc, "nowhere"), "--query", "q"])).toMatch(/nowhere is not a folder/);
  });

  test("usage errors are one line naming the flag", async () => {
    const fails = (args: string[]) => dkiFails(["chat", "--model", model, "--data", data, "--user", "alice", ...args]);
    expect(await fails(["--query", "hi", "--alpha", "0.5", "--no-memory"])).toBe("dki: give at most one of --alpha and --no-memory\n");
    expect(await fails(["--format", "json"])).toBe("dki: --format json prints one answer: give --query with it\n");
    expect(await fails(["--query", "hi", "--alpha", "1.5"])).toMatch(/^dki: option '--alpha <a>' argument '1\.5' is invalid\. --alpha must be a number in \[0, 1\], got "1\.5" \(see --help\)\n$/);
    expect(await fails(["--query", "hi", "--session", " "])).toBe("dki: --session must not be empty\n");
    expect(await fails(["--query", "hi", "--alpha", "0.5", "--relevance-threshold", "0.3"])).toBe("dki: --relevance-threshold is the gate's: it does nothing with --alpha or --no-memory\n");
    expect(await fails(["--query", "hi", "--mode", "rag", "--relevance-threshold", "0.3"])).toBe("dki: --relevance-threshold applies to --mode dki only\n");
    expect(await fails(["--query", "hi", "--relevance-threshold", "-1"])).toMatch(/--relevance-threshold must be a number in \[0, 1\], got "-1"/);
  });

  test("--relevance-threshold sets the gate's τ: above the memory's relevance, nothing is injected", async () => {
    const ask = ["chat", "--model", model, "--data", data, "--user", "alice", "--session", "tau", "--query", "Any tips for hiking in the Alps with a peanut allergy?", "--format", "json", "-n", "1", "--threads", "1"];
    const gated = JSON.parse((await dki([...ask, "--relevance-threshold", "0.99"])).stdout);
    expect(gated.memories_used).toEqual([]);
    expect(gated.gating.reason).toMatch(/^top relevance 0\.\d{3} is below the threshold 0\.990: no memory injected$/);
    const open = JSON.parse((await dki([...ask, "--relevance-threshold", "0"])).stdout);
    expect(open.memories_used.map((m: { id: string }) => m.id)).toEqual([memId]);
  });

  test("--config FILE (YAML or JSON, DKIConfig's keys) sets the system's settings, flags win over it; a bad file is one error naming it and the key, before the model loads", async () => {
    const dir = tempDir();
    const yaml = join(dir, "dki.yaml");
    writeFileSync(yaml, "# the gate closed for every memory\ngating:\n  relevanceThreshold: 0.99\nmemoryMaxTokens: 512\n");
    const ask = ["chat", "--model", model, "--data", data, "--user", "alice", "--session", "cfg", "--query", "Any tips for hiking in the Alps with a peanut allergy?", "--format", "json", "-n", "1", "--threads", "1"];
    const gated = JSON.parse((await dki([...ask, "--config", yaml])).stdout);
    expect(gated.memories_used).toEqual([]);
    expect(gated.gating.reason).toMatch(/below the threshold 0\.990/);
    // The flag on top of the file: τ 0 lets the memory in; the file's other key stays.
    const open = JSON.parse((await dki([...ask, "--config", yaml, "--relevance-threshold", "0"])).stdout);
    expect(open.memories_used.map((m: { id: string }) => m.id)).toEqual([memId]);
    const json = join(dir, "dki.json");
    writeFileSync(json, JSON.stringify({ maxMemories: 0 }));
    expect(JSON.parse((await dki([...ask, "--config", json])).stdout).memories_used).toEqual([]);
    // dki rag reads the same file.
    expect(JSON.parse((await dki(["rag", ...ask.slice(1), "--config", json])).stdout).memories_used).toEqual([]);

    const bad = async (name: string, text: string) => {
      const f = join(dir, name);
      writeFileSync(f, text);
      return dkiFails([...ask, "--config", f]);
    };
    expect(await bad("typo.yaml", "maxMemory: 2\n")).toMatch(new RegExp(`^dki: --config .*typo\.yaml: config has no key "maxMemory" \\(known: maxMemories, `));
    expect(await bad("gate.yaml", "gating:\n  alphaMx: 1\n")).toMatch(/--config .*gate\.yaml: config\.gating has no key "alphaMx"/);
    expect(await bad("value.json", JSON.stringify({ gating: { alphaMax: 2 } }))).toMatch(/--config .*value\.json: config\.gating\.alphaMax must be in \[0, 1\], got 2/);
    expect(await bad("twice.yaml", "maxMemories: 1\nmaxMemories: 2\n")).toMatch(/--config .*twice\.yaml: not valid YAML: .*[Mm]ap keys must be unique/);
    expect(await bad("broken.json", "{ maxMemories: ")).toMatch(/--config .*broken\.json: not valid JSON: /);
    expect(await bad("list.yaml", "- 1\n- 2\n")).toMatch(/--config .*list\.yaml: expected a mapping of settings \(e\.g\. maxMemories: 5\), got a list/);
    expect(await dkiFails([...ask, "--config", join(dir, "missing.yaml")])).toMatch(/--config .*missing\.yaml: cannot read it \(no such file\)/);
  });
});

describe("dki chat: sessions, checks before the model loads, limits, Ctrl-C", () => {
  const base = () => ["chat", "--model", model, "--data", data, "-n", "2", "--threads", "1"];

  test("one-shot turns go to a new session each unless --session is given (named in JSON and text); rag's never share chat's", async () => {
    const ask = async (q: string, extra: string[] = []) => JSON.parse((await dki([...base(), "--user", "carol", "--query", q, "--format", "json", ...extra])).stdout);
    const a = await ask("First question?");
    const b = await ask("Second question?");
    expect(a.metadata.session_id).toMatch(/^chat-\d{8}T\d{6}Z-[0-9a-f]{6}$/);
    expect(b.metadata.session_id).toMatch(/^chat-/);
    expect(b.metadata.session_id).not.toBe(a.metadata.session_id);
    expect(b.metadata.hybrid_injection.history_messages).toEqual([]);
    const rag = JSON.parse((await dki(["rag", "--model", model, "--data", data, "-n", "2", "--user", "carol", "--query", "Third question?", "--format", "json"])).stdout);
    expect(rag.metadata.session_id).toMatch(/^rag-\d{8}T\d{6}Z-[0-9a-f]{6}$/);
    expect(rag.metadata.history_total).toBe(0);
    // Named, the session carries the conversation on.
    await ask("Named one?", ["--session", "mine"]);
    const named = await ask("Named two?", ["--session", "mine"]);
    expect(named.metadata.session_id).toBe("mine");
    expect(named.metadata.hybrid_injection.history_messages[0]).toMatchObject({ role: "user", content: "Named one?" });
    // Each turn was recorded in the session it named.
    const store = await MemoryStore.open({ dir: data });
    try {
      for (const [s, q] of [[a.metadata.session_id, "First question?"], [b.metadata.session_id, "Second question?"], [rag.metadata.session_id, "Third question?"]]) {
        expect((await store.conversations.list({ userId: "carol", sessionId: s })).map((t) => t.content)[0]).toBe(q);
      }
    } finally {
      await store.close();
    }
  });

  test("a store that does not exist and a --cache that is not a cache folder are refused before the model loads; nothing is created", async () => {
    const missing = join(tempDir(), "typo");
    expect(await dkiFails(["chat", "--model", model, "--data", missing, "--user", "alice", "--query", "hi"])).toBe(`dki: --data ${missing}: no memory store there (${missing}); check the path (dki memory add or dki memory import creates a store)\n`);
    expect(await dkiFails(["rag", "--model", model, "--data", missing, "--user", "alice", "--query", "hi"])).toMatch(/^dki: --data .*typo: no memory store there/);
    expect(existsSync(missing)).toBe(false);
    expect(existsSync(`${missing}.kv-cache`)).toBe(false);
    // A model folder as the cache: refused by name, left as it was.
    expect(await dkiFails([...base(), "--user", "alice", "--query", "hi", "--cache", model])).toMatch(new RegExp(`^dki: --cache ${model} is not a K/V cache folder: it holds \\S+, \\S+, \\S+ and \\d+ more; give an empty or new folder\\n$`));
    expect(await dkiFails(["rag", "--model", model, "--data", data, "--user", "alice", "--query", "hi", "--cache", model])).toMatch(/is not a K\/V cache folder/);
    // An empty folder becomes a cache, and is one the next time.
    const cache = tempDir();
    for (let i = 0; i < 2; i++) {
      const r = JSON.parse((await dki([...base(), "--user", "alice", "--query", "Hiking in the Alps?", "--cache", cache, "--format", "json"])).stdout);
      expect(r.cache.tiers.map((t: { tier: string }) => t.tier)).toEqual(i === 0 ? ["L4", "L4"] : ["L3", "L3"]);
    }
  });

  test("--memory-max-tokens: a memory over it is left out, and every output says so and why; --max-memories 0 routes none; --device", async () => {
    const tokens = (await Tokenizer.fromFolder(model)).encode("Alice loves hiking in the Alps and is allergic to peanuts.", { addSpecialTokens: false }).length;
    const reason = `its ${tokens} tokens exceed the 3 left of memoryMaxTokens (3)`;
    const q = ["--user", "alice", "--query", "Any tips for hiking in the Alps with a peanut allergy?", "--memory-max-tokens", "3", "--relevance-threshold", "0"];
    const r = JSON.parse((await dki([...base(), ...q, "--format", "json"])).stdout);
    expect(r.memories_used).toEqual([]);
    expect(r.metadata.memories_left_out).toEqual([{ id: memId, reason }]);
    expect(r.cache.tiers.map((t: { kind: string }) => t.kind)).toEqual(["preferences"]);
    const text = await dki([...base(), ...q]);
    expect(text.stderr).toContain(`[memories: none | left out: ${memId} (${reason}) | α - |`);
    const none = JSON.parse((await dki([...base(), "--user", "alice", "--query", "Hiking in the Alps?", "--max-memories", "0", "--format", "json", "--device", "cpu"])).stdout);
    expect(none.memories_used).toEqual([]);
    expect(none.metadata.memories_left_out).toEqual([]);
    expect(await dkiFails([...base(), "--user", "alice", "--query", "hi", "--device", "tpu"])).toMatch(/--device must be one of cpu, cuda, auto, got "tpu"/);
    expect(await dkiFails([...base(), "--user", "alice", "--query", "hi", "--max-memories", "-1"])).toMatch(/--max-memories must be an integer in \[0, 1000\], got "-1"/);
  });

  // A long answer (a huge token limit and context) that only Ctrl-C ends.
  const endless = () => ["chat", "--model", model, "--data", data, "--user", "alice", "--query", "Tell me about hiking in the Alps.", "-n", "100000", "--context-size", "16384"];

  ctrlCTests("chat", endless);
});
