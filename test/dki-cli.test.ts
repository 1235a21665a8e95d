// `dki chat`, run as a user runs it (node bin/dki.js, built by `npm test`'s tsc step): one answer
// as JSON with the DKIResponse's fields in snake_case, one streamed with its summary line, the
// interactive session's commands, and the usage errors.
import { spawn } from "node:child_process";
import { join } from "node:path";
import { beforeAll, describe, expect, test } from "vitest";
import { MemoryStore } from "../src/memory/index.js";
import { dki, dkiBin, dkiFails } from "./support/dki-bin.js";
import { tempDir } from "./support/paths.js";

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
    expect(stderr).toMatch(new RegExp(`^\\[memories: ${memId} \\(\\d\\.\\d\\d\\) \\| α \\d\\.\\d\\d \\| gate: top relevance .* \\| cache: preferences L[13], ${memId} L[13] \\| ttft \\d+ ms, \\d+ tokens\\]\\n$`));
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
    expect(err).toMatch(/\[memories: mem_\S+ \(\d\.\d\d\) \| α \d\.\d\d \| gate: .* \| cache: preferences L4, mem_\S+ L4 \|/);
    expect(err).toMatch(/dki: .*nope/);
    expect(err).toMatch(/unknown command \/bogus/);
    expect(out.length).toBeGreaterThan(0);
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
});
