// The generation loop: sampling, streaming, stop conditions, cancellation, and not blocking Node.
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { Model } from "../src/engine/model.js";
import { entropy, runGeneration } from "../src/engine/generate.js";
import { LogitsMode, native, packageRoot, type NativeContextHandle } from "../src/engine/native.js";
import { GgufMeta, readGguf, writeGguf, type GgufEntry } from "../src/formats/gguf.js";
import { makeTinyModel } from "../src/models/make-tiny.js";
import { ggufTokenizer } from "../src/tokenizer/gguf-tokenizer.js";
import { tempDir } from "./support/paths.js";

let model: Model;
let slow: Model;
let slowDir: string;
let dir: string;

beforeAll(async () => {
  dir = tempDir();
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f16", out: dir, seed: 11 });
  model = await Model.load(dir, { contextSize: 256 });
  // Wide enough that a 1024-token prefill takes a noticeable time on any machine.
  slowDir = tempDir();
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f16", out: slowDir, seed: 12, overrides: { hiddenSize: 512, intermediateSize: 1536, numLayers: 6, numHeads: 8, numKvHeads: 4, headDim: 64 } });
  slow = await Model.load(slowDir, { contextSize: 1100 });
});
afterAll(() => {
  model.dispose();
  slow.dispose();
});

describe("generation", () => {
  test("greedy decoding follows the argmax of the logits and is not degenerate", async () => {
    const r = await model.generate("The capital of France is", { maxNewTokens: 24, stopOnEos: false });
    expect(r.tokens).toHaveLength(24);
    expect(r.finishReason).toBe("length");
    const prompt = model.encodePrompt("The capital of France is");
    const logits = await model.logits([...prompt, ...r.tokens.slice(0, -1)]);
    r.tokens.forEach((t, i) => {
      const row = logits[prompt.length - 1 + i];
      let best = 0;
      for (let j = 1; j < row.length; j++) if (row[j] > row[best]) best = j;
      expect(t).toBe(best);
    });
    expect(new Set(r.tokens).size).toBeGreaterThan(6);
  });

  test("sampling is reproducible for a seed and varies across seeds", async () => {
    const opts = (seed: number) => ({ maxNewTokens: 20, stopOnEos: false, sampling: { temperature: 1, topK: 50, topP: 0.95, seed } });
    const a = await model.generate("Once upon a time", opts(1));
    const b = await model.generate("Once upon a time", opts(1));
    const c = await model.generate("Once upon a time", opts(2));
    expect(a.tokens).toEqual(b.tokens);
    expect(a.tokens).not.toEqual(c.tokens);
  });

  test("top-k 1 equals greedy", async () => {
    const greedy = await model.generate("Hello", { maxNewTokens: 16, stopOnEos: false });
    const k1 = await model.generate("Hello", { maxNewTokens: 16, stopOnEos: false, sampling: { temperature: 0.7, topK: 1, seed: 5 } });
    expect(k1.tokens).toEqual(greedy.tokens);
  });

  test("samples follow softmax(logits / T), restricted to the top-k ids or the smallest set holding top-p of the mass", () => {
    const logits = Float32Array.from([2, 1, 0, -1]);
    const frequencies = (params: { temperature: number; topK: number; topP: number }) => {
      const s = new (native().NativeSampler)({ ...params, repetitionPenalty: 1, seed: 11 });
      const counts = [0, 0, 0, 0];
      for (let i = 0; i < 20000; i++) counts[s.sample(logits, new Int32Array(0))]++;
      return counts.map((c) => c / 20000);
    };
    const softmax = (xs: number[]) => {
      const e = xs.map(Math.exp);
      const z = e.reduce((a, b) => a + b, 0);
      return e.map((x) => x / z);
    };
    const near = (got: number[], want: number[]) => got.forEach((g, i) => expect(Math.abs(g - want[i]), `id ${i}: ${g} vs ${want[i]}`).toBeLessThan(0.015));
    near(frequencies({ temperature: 1, topK: 0, topP: 1 }), softmax([2, 1, 0, -1])); // the whole distribution, unsorted
    near(frequencies({ temperature: 2, topK: 0, topP: 1 }), softmax([1, 0.5, 0, -0.5]));
    near(frequencies({ temperature: 1, topK: 2, topP: 1 }), [...softmax([2, 1]), 0, 0]);
    near(frequencies({ temperature: 1, topK: 0, topP: 0.7 }), [...softmax([2, 1]), 0, 0]); // 0.64 alone is short of 0.7
  });

  test("entropy of softmax(logits): closed forms, -inf logits count as probability 0, NaN gives NaN", () => {
    expect(entropy(new Float32Array(49152).fill(3))).toBeCloseTo(Math.log(49152), 9);
    expect(entropy(Float32Array.from([5, -Infinity, -Infinity]))).toBe(0);
    expect(entropy(Float32Array.from([1, 1, -Infinity, 1]))).toBeCloseTo(Math.log(3), 12);
    const [a, b] = [2, -0.5]; // two logits: H = −p ln p − q ln q
    const p = 1 / (1 + Math.exp(b - a));
    expect(entropy(Float32Array.from([a, b]))).toBeCloseTo(-p * Math.log(p) - (1 - p) * Math.log(1 - p), 12);
    expect(entropy(Float32Array.from([1e30, 0]))).toBe(0); // no overflow: logits are taken relative to the max
    expect(entropy(Float32Array.from([1, Number.NaN, 2]))).toBeNaN();
    expect(entropy(Float32Array.from([1, Infinity]))).toBeNaN();
    expect(entropy(Float32Array.from([-Infinity, -Infinity]))).toBeNaN();
  });

  test("greedy picks the first largest logit, never a NaN, at any vocabulary length (the vector passes and their tails)", () => {
    const greedy = new (native().NativeSampler)({ temperature: 0, topK: 0, topP: 1, repetitionPenalty: 1, seed: 0 });
    const pick = (xs: ArrayLike<number>) => greedy.sample(Float32Array.from(xs), new Int32Array(0));
    const reference = (xs: Float32Array) => {
      let best = -1;
      xs.forEach((x, i) => {
        if (!Number.isNaN(x) && (best < 0 || x > xs[best]!)) best = i;
      });
      return Math.max(best, 0);
    };
    let seed = 7;
    const random = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31) * 20 - 10;
    for (const n of [1, 3, 15, 16, 17, 31, 32, 33, 100, 1000, 49152]) {
      const xs = Float32Array.from({ length: n }, random);
      expect(pick(xs), `length ${n}`).toBe(reference(xs));
      xs[n - 1] = 1e9; // the maximum in the scalar tail (or the last vector)
      expect(pick(xs), `length ${n}, last`).toBe(n - 1);
    }
    expect(pick([1, 3, Number.NaN, 3, 2])).toBe(1); // ties: the first; NaN skipped
    expect(pick([Number.NaN, 0.5, ...Array(20).fill(0.25)])).toBe(1);
    expect(pick(Array(40).fill(Number.NaN))).toBe(0);
    expect(pick([...Array(39).fill(-Infinity), -1e30])).toBe(39);
    expect(pick(Array(40).fill(-Infinity))).toBe(0);
  });

  test("repetition penalty follows the HF convention (positive logits divided, negative multiplied, once per token)", () => {
    const greedyWith = (penalty: number, logits: number[], recent: number[]) =>
      new (native().NativeSampler)({ temperature: 0, topK: 0, topP: 1, repetitionPenalty: penalty, seed: 0 }).sample(Float32Array.from(logits), Int32Array.from(recent));
    expect(greedyWith(1, [2.0, 1.9, -1], [0])).toBe(0);
    expect(greedyWith(2, [2.0, 1.9, -1], [0])).toBe(1); // 2.0 / 2 < 1.9
    expect(greedyWith(2, [-1, -1.5], [0])).toBe(1); // -1 * 2 < -1.5
    expect(greedyWith(2, [3.0, 1.6], [0, 0, 0])).toBe(1); // 3 / 2 (not / 8) < 1.6 ... penalised once
    expect(greedyWith(2, [3.0, 1.4], [0, 0, 0])).toBe(0);
    expect(greedyWith(2, [2.0, 1.9], [7, -3])).toBe(0); // out-of-range ids are ignored
  });

  test("streamed pieces concatenate to the returned text", async () => {
    const pieces: string[] = [];
    const r = await model.generate("Streaming test", { maxNewTokens: 30, stopOnEos: false, onToken: (t) => pieces.push(t) });
    expect(pieces.join("")).toBe(r.text);
    expect(r.text).toBe(model.tokenizer.decode(r.tokens, { skipSpecialTokens: false }));
  });

  test("a stop string ends generation and is not returned, nor streamed", async () => {
    const full = await model.generate("Stop test", { maxNewTokens: 30, stopOnEos: false });
    const stop = full.text.slice(10, 13);
    expect(stop.length).toBe(3);
    const pieces: string[] = [];
    const r = await model.generate("Stop test", { maxNewTokens: 30, stopOnEos: false, stop: [stop], onToken: (t) => pieces.push(t) });
    expect(r.finishReason).toBe("stop");
    expect(r.text).toBe(full.text.slice(0, full.text.indexOf(stop)));
    expect(pieces.join("")).toBe(r.text);
  });

  test("chat messages use the chat template", async () => {
    const ids = model.encodePrompt({ messages: [{ role: "user", content: "hi" }] });
    expect(model.tokenizer.decode(ids, { skipSpecialTokens: false })).toBe("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  });

  test("stats are reported", async () => {
    const r = await model.generate("Stats", { maxNewTokens: 8, stopOnEos: false });
    expect(r.stats.promptTokens).toBe(model.encodePrompt("Stats").length);
    expect(r.stats.generatedTokens).toBe(8);
    expect(r.stats.prefillMs).toBeGreaterThan(0);
    expect(r.stats.decodeTokPerS).toBeGreaterThan(0);
    expect(r.stats.timeToFirstTokenMs).toBeGreaterThanOrEqual(r.stats.prefillMs);
    expect(r.stats.firstTokenEntropy).toBeGreaterThan(0);
  });

  test("bad input gets clear errors", async () => {
    await expect(model.generate("x", { sampling: { temperature: -1 } })).rejects.toThrow(/temperature/);
    await expect(model.generate("x", { sampling: { topP: 0 } })).rejects.toThrow(/topP/);
    await expect(model.generate({ tokens: [1, 2, 999999] })).rejects.toThrow(/outside the vocabulary/);
    await expect(model.generate({ tokens: [] })).rejects.toThrow(/empty/);
    await expect(model.generate({ tokens: Array(300).fill(5) })).rejects.toThrow(/context window/);
    await expect(model.generate("x", { maxNewTokens: -2 })).rejects.toThrow(/maxNewTokens/);
  });
});

describe("eval into a caller's buffer", () => {
  test("the logits land in `out`, equal to a fresh array's, and `out` is what resolves", async () => {
    const V = model.config.vocabSize;
    const ctx = model.createContext(32);
    try {
      const fresh = (await ctx.eval(Int32Array.of(5, 6, 7), LogitsMode.All))!;
      ctx.reset(0);
      const out = new Float32Array(3 * V);
      expect(await ctx.eval(Int32Array.of(5, 6, 7), LogitsMode.All, out)).toBe(out);
      expect(out).toEqual(fresh);
    } finally {
      ctx.dispose();
    }
  });

  test("a buffer of the wrong size or type is refused before any work", async () => {
    const ctx = model.createContext(32);
    try {
      expect(() => ctx.eval(Int32Array.of(5, 6), LogitsMode.Last, new Float32Array(10))).toThrow(/out has 10 floats, the logits need 49152/);
      expect(() => ctx.eval(Int32Array.of(5), LogitsMode.Last, new Float64Array(49152) as unknown as Float32Array)).toThrow(/out must be a Float32Array/);
      expect(ctx.nPast).toBe(0);
    } finally {
      ctx.dispose();
    }
  });
});

describe("Node stays responsive", () => {
  test("timers keep firing during a long prefill and generation", async () => {
    let ticks = 0;
    const timer = setInterval(() => ticks++, 5);
    const t0 = performance.now();
    const prompt = Array.from({ length: 1024 }, (_, i) => 100 + i);
    await slow.generate({ tokens: prompt }, { maxNewTokens: 16, stopOnEos: false });
    const ms = performance.now() - t0;
    clearInterval(timer);
    expect(ms).toBeGreaterThan(100);
    // At least half the ticks a free event loop would see.
    expect(ticks).toBeGreaterThan(ms / 5 / 2);
  });

  test("an AbortSignal cancels a running prefill and the model stays usable", async () => {
    const ac = new AbortController();
    const prompt = Array.from({ length: 1024 }, (_, i) => 100 + i);
    setTimeout(() => ac.abort(), 20);
    const t0 = performance.now();
    await expect(slow.generate({ tokens: prompt }, { maxNewTokens: 64, signal: ac.signal })).rejects.toThrow(/abort/i);
    const r = await slow.generate("still works", { maxNewTokens: 4, stopOnEos: false });
    expect(r.tokens).toHaveLength(4);
    expect(performance.now() - t0).toBeLessThan(60_000);
  });

  test("abort during decoding", async () => {
    const ac = new AbortController();
    let n = 0;
    const p = model.generate("abort me", { maxNewTokens: 200, stopOnEos: false, signal: ac.signal, onToken: () => ++n === 5 && ac.abort() });
    await expect(p).rejects.toThrow(/abort/i);
    expect(n).toBeLessThan(10);
  });

  test("stopOnAbortSignal: an abort during decoding resolves with the text so far ('aborted'), equal to the start of an uninterrupted run", async () => {
    const ac = new AbortController();
    let streamed = "";
    let n = 0;
    const r = await model.generate("abort me", {
      maxNewTokens: 200,
      stopOnEos: false,
      signal: ac.signal,
      stopOnAbortSignal: true,
      onToken: (text) => {
        streamed += text;
        if (++n === 5) ac.abort();
      },
    });
    expect(r.finishReason).toBe("aborted");
    // onToken runs for tokens that add text, so at least 5 tokens, and far fewer than 200.
    expect(r.tokens.length).toBeGreaterThanOrEqual(5);
    expect(r.tokens.length).toBeLessThan(50);
    expect(r.text).toBe(streamed);
    expect(r.stats.generatedTokens).toBe(r.tokens.length);
    const full = await model.generate("abort me", { maxNewTokens: r.tokens.length, stopOnEos: false });
    expect(full.tokens).toEqual(r.tokens);
    expect(full.text).toBe(r.text);
  });

  test("stopOnAbortSignal: an abort during the prefill still rejects (nothing generated), and so does disposing of the model", async () => {
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 20);
    const prompt = Array.from({ length: 1024 }, (_, i) => 100 + i);
    await expect(slow.generate({ tokens: prompt }, { maxNewTokens: 8, signal: ac.signal, stopOnAbortSignal: true })).rejects.toThrow(/abort/i);
    const m = await Model.load(slowDir, { contextSize: 512 });
    let n = 0;
    const running = m.generate("dispose me", { maxNewTokens: 200, stopOnEos: false, signal: new AbortController().signal, stopOnAbortSignal: true, onToken: () => ++n === 5 && m.dispose() });
    await expect(running).rejects.toThrow(/model has been disposed/);
  });

  test("a call waiting behind another rejects as soon as its signal aborts, not when the first is done", async () => {
    const prompt = Array.from({ length: 1024 }, (_, i) => 100 + i);
    const events: string[] = [];
    const first = slow.generate({ tokens: prompt }, { maxNewTokens: 8, stopOnEos: false }).then(() => events.push("first done"));
    const ac = new AbortController();
    const queued = slow.generate("waiting", { maxNewTokens: 8, signal: ac.signal }).catch((e: Error) => events.push(`queued: ${e.name}`));
    setTimeout(() => ac.abort(), 5);
    await Promise.all([first, queued]);
    expect(events).toEqual(["queued: AbortError", "first done"]);
    // The order of the calls queued after the aborted one is kept, and the model still works.
    expect((await slow.generate("after", { maxNewTokens: 2, stopOnEos: false })).tokens).toHaveLength(2);
  });

  test("calls with a signal of their own leave nothing behind on the model (200k calls: < 2 MB of heap)", () => {
    // AbortSignal.any, which combined the caller's signal with the model's, keeps a record of every
    // signal made in the long-lived source on Node 20: 200k calls grew the heap by ~11 MB.
    const modelJs = pathToFileURL(join(packageRoot(), "dist", "src", "engine", "model.js")).href;
    const code = `
      import { Model } from ${JSON.stringify(modelJs)};
      const m = await Model.load(${JSON.stringify(dir)}, { contextSize: 16 });
      const calls = (n) => { let p = Promise.resolve(); for (let i = 0; i < n; i++) p = p.then(() => m.withContext(async () => 1, new AbortController().signal)); return p; };
      const heap = async () => { for (let i = 0; i < 2; i++) { await new Promise((r) => setTimeout(r, 20)); gc(); } return process.memoryUsage().heapUsed; };
      await calls(20000);
      const before = await heap();
      await calls(200000);
      console.log(JSON.stringify({ grew: (await heap()) - before }));
      m.dispose();`;
    const r = spawnSync(process.execPath, ["--expose-gc", "--input-type=module", "-e", code], { encoding: "utf8", timeout: 60_000 });
    expect(r.status, r.stderr).toBe(0);
    expect((JSON.parse(r.stdout) as { grew: number }).grew).toBeLessThan(2e6);
  });

  test("dispose() during a generation stops it, rejects the calls waiting, and frees the model", async () => {
    const m = await Model.load(slowDir, { contextSize: 512 });
    let n = 0;
    const running = m.generate("dispose me", { maxNewTokens: 200, stopOnEos: false, onToken: () => ++n === 5 && m.dispose() });
    const waiting = m.logits([1, 2, 3]);
    await expect(running).rejects.toThrow(/model has been disposed/);
    await expect(waiting).rejects.toThrow(/model has been disposed/);
    expect(n).toBeLessThan(10);
    await expect(m.generate("again")).rejects.toThrow(/model has been disposed/);
    expect(() => m.createContext()).toThrow(/model has been disposed/);
    m.dispose(); // twice is fine
  });
});

describe("the loop on chosen tokens", () => {
  /** A context whose every eval makes seq[step] the likeliest next token (and `runnerUp` the next). */
  function forced(seq: number[], runnerUp = -1): NativeContextHandle {
    let step = 0;
    const ctx = {
      nPast: 0,
      maxTokens: 1000,
      async eval(tokens: Int32Array, _mode: LogitsMode, out?: Float32Array) {
        ctx.nPast += tokens.length;
        out!.fill(0);
        if (runnerUp >= 0) out![runnerUp] = 9.9;
        out![seq[Math.min(step++, seq.length - 1)]] = 10;
        return out!;
      },
      cancel() {},
    };
    return ctx as unknown as NativeContextHandle;
  }
  const lone = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

  test("streamed pieces never split an emoji, even while a stop string holds text back", async () => {
    const ids = model.tokenizer.encode("ab😀cd😀ef", { addSpecialTokens: false });
    const pieces: string[] = [];
    const r = await runGeneration(model, forced(ids), [1], { maxNewTokens: ids.length, stopOnEos: false, stop: ["zz"], onToken: (t) => pieces.push(t) }, 0);
    expect(r.text).toBe("ab😀cd😀ef");
    expect(pieces.join("")).toBe(r.text);
    for (const p of pieces) expect(p, JSON.stringify(p)).not.toMatch(lone);
  });

  test("ids the tokenizer cannot decode (a model's padded vocabulary) are never sampled", async () => {
    const dir = tempDir();
    await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f16", out: dir, seed: 11, overrides: { vocabSize: 49200 } });
    const padded = await Model.load(dir, { contextSize: 64 });
    try {
      expect(padded.tokenizer.undecodableIds(49200)).toHaveLength(48);
      const r = await runGeneration(padded, forced([49170], 7), [1], { maxNewTokens: 3, stopOnEos: false }, 0);
      expect(r.tokens).toEqual([7, 7, 7]);
    } finally {
      padded.dispose();
    }
  });

  test("a SentencePiece model's text continues the prompt: the first token keeps its leading space", async () => {
    // The tokenizer a llama-family GGUF carries: "▁" for spaces, <0xNN> byte fallback, and a
    // decoder that strips the space at the start of a text. Decoding the new ids alone gave "Paris".
    const file = join(tempDir(), "spm.gguf");
    const tokens = ["<unk>", "<s>", "</s>"];
    for (let b = 0; b < 256; b++) tokens.push(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`);
    const pieces = ["▁", "▁The", "▁capital", "▁is", "▁Paris", "."];
    await writeGguf(file, {
      metadata: new Map<string, GgufEntry>([
        ["tokenizer.ggml.model", { type: "string", value: "llama" }],
        ["tokenizer.ggml.tokens", { type: "array", itemType: "string", value: [...tokens, ...pieces] }],
        ["tokenizer.ggml.scores", { type: "array", itemType: "f32", value: [...tokens, ...pieces].map(() => 0) }],
        ["tokenizer.ggml.bos_token_id", { type: "u32", value: 1 }],
      ]),
      tensors: [],
    });
    const tokenizer = ggufTokenizer(new GgufMeta(file, (await readGguf(file)).metadata));
    const spm = { tokenizer, config: { vocabSize: tokens.length + pieces.length, eosTokenIds: [] } } as unknown as Model;
    const id = (piece: string) => tokenizer.tokenToId(piece)!;
    const prompt = tokenizer.encode("The capital is");
    const gen = [id("▁Paris"), id(".")];
    const r = await runGeneration(spm, forced(gen), prompt, { maxNewTokens: 2, stopOnEos: false }, 0);
    expect(r.text).toBe(" Paris.");
    expect(tokenizer.decode([...prompt, ...r.tokens])).toBe(tokenizer.decode(prompt) + r.text);

    // A prompt that ends inside a character: the character comes out whole with the byte completing it.
    const cut = [...prompt, id("▁"), id("<0xE4>"), id("<0xBD>")];
    const rest = await runGeneration(spm, forced([id("<0xA0>"), id("▁Paris")]), cut, { maxNewTokens: 2, stopOnEos: false }, 0);
    expect(rest.text).toBe("你 Paris");
  });

  test("repetitionWindow 0 penalises nothing; 1 the last token; negative or fractional windows are refused", async () => {
    const run = (repetitionWindow: number) =>
      runGeneration(model, forced([5], 6), [5], { maxNewTokens: 1, stopOnEos: false, sampling: { repetitionPenalty: 2, repetitionWindow } }, 0);
    expect((await run(0)).tokens).toEqual([5]);
    expect((await run(1)).tokens).toEqual([6]); // 10 / 2 < 9.9
    await expect(run(-1)).rejects.toThrow(/repetitionWindow must be a non-negative integer, got -1/);
    await expect(run(1.5)).rejects.toThrow(/repetitionWindow must be a non-negative integer, got 1.5/);
  });
});
