// HashingEmbedder: determinism and stability, unit norm, lexical similarity in English and
// Chinese, and its argument errors.
import { describe, expect, it } from "vitest";
import { HashingEmbedder, fnv1a32 } from "../src/memory/embedders/hashing.js";
import { DkiArgumentError } from "../src/errors.js";

const dot = (a: Float32Array, b: Float32Array) => a.reduce((s, v, i) => s + v * b[i], 0);
const norm = (a: Float32Array) => Math.sqrt(dot(a, a));

describe("fnv1a32", () => {
  it("matches the published FNV-1a test vectors", () => {
    // From the FNV reference test suite (draft-eastlake-fnv, test vectors for FNV-1a 32).
    expect(fnv1a32("")).toBe(0x811c9dc5);
    expect(fnv1a32("a")).toBe(0xe40c292c);
    expect(fnv1a32("foobar")).toBe(0xbf9cf968);
  });

  it("hashes the UTF-8 bytes of non-ASCII text", () => {
    const reference = (s: string) => {
      let h = 0x811c9dc5;
      for (const b of new TextEncoder().encode(s)) h = Math.imul(h ^ b, 0x01000193) >>> 0;
      return h;
    };
    for (const s of ["é", "北京", "🙂", "ß→ü 안녕"]) expect(fnv1a32(s)).toBe(reference(s));
  });
});

describe("HashingEmbedder", () => {
  const e = new HashingEmbedder();

  it("names its settings and checks dim", () => {
    expect(e.id).toBe("hashing-v1-d512");
    expect(e.dim).toBe(512);
    expect(new HashingEmbedder({ dim: 64 }).id).toBe("hashing-v1-d64");
    for (const dim of [0, 15, 12.5, -512, Number.NaN, 2 ** 21]) {
      expect(() => new HashingEmbedder({ dim })).toThrow(/dim must be an integer from 16/);
    }
  });

  it("is deterministic across calls and instances, and stable across releases", async () => {
    const texts = ["The user prefers tea over coffee.", "用户喜欢喝茶"];
    const [a, b] = await e.embed(texts);
    const [a2, b2] = await new HashingEmbedder().embed(texts);
    expect(Array.from(a2)).toEqual(Array.from(a));
    expect(Array.from(b2)).toEqual(Array.from(b));
    // Pinned: a stored vector must equal the query-time vector of the same text forever (for
    // this id). If this fails, the features changed and the id's version must change with them.
    const nonzero = Array.from(a).flatMap((v, i) => (v !== 0 ? [i] : []));
    expect(nonzero.slice(0, 8)).toEqual(PINNED_NONZERO);
    expect(a[nonzero[0]]).toBeCloseTo(PINNED_FIRST, 6);
  });

  it("is the documented feature hashing, recomputed independently for a one-word text", async () => {
    // "zq": one term (weight 1) and the character n-grams of "<zq>" (weight 0.3 each); no bigrams.
    const fmix = (h: number) => {
      h = Math.imul(h ^ (h >>> 16), 0x85ebca6b);
      h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
      return (h ^ (h >>> 16)) >>> 0;
    };
    const dim = 64;
    const expected = new Float64Array(dim);
    for (const [key, w] of [["u:zq", 1], ["g:<zq", 0.3], ["g:zq>", 0.3], ["g:<zq>", 0.3]] as const) {
      const h = fnv1a32(key);
      expected[h % dim] += (fmix(h) & 1 ? -1 : 1) * w;
    }
    const n = Math.hypot(...expected);
    const [v] = await new HashingEmbedder({ dim }).embed(["ZQ"]);
    for (let i = 0; i < dim; i++) expect(v[i]).toBeCloseTo(expected[i] / n, 6);
  });

  it("returns unit vectors of length dim, in input order", async () => {
    const texts = ["short", "a much longer sentence about memory injection in attention", "北京", "🙂", "안녕하세요"];
    const vs = await new HashingEmbedder({ dim: 128 }).embed(texts);
    expect(vs).toHaveLength(texts.length);
    for (const v of vs) {
      expect(v).toBeInstanceOf(Float32Array);
      expect(v.length).toBe(128);
      expect(norm(v)).toBeCloseTo(1, 5);
    }
    const [again] = await new HashingEmbedder({ dim: 128 }).embed([texts[2]]);
    expect(Array.from(again)).toEqual(Array.from(vs[2]));
  });

  it("puts related English texts closer than unrelated ones, and tolerates inflection", async () => {
    const [q, near, far, plural] = await e.embed([
      "I love drinking coffee in the morning",
      "Every morning I drink a cup of coffee",
      "The stock market fell sharply today",
      "I loved drinking coffees in the mornings",
    ]);
    expect(dot(q, near)).toBeGreaterThan(dot(q, far) + 0.15);
    expect(dot(q, plural)).toBeGreaterThan(dot(q, near));
    expect(Math.abs(dot(q, far))).toBeLessThan(0.15);
  });

  it("puts related Chinese texts closer than unrelated ones", async () => {
    const [q, near, far] = await e.embed(["我喜欢在早上喝咖啡", "每天早上喝一杯咖啡", "股市今天大幅下跌"]);
    expect(dot(q, near)).toBeGreaterThan(dot(q, far) + 0.15);
    expect(Math.abs(dot(q, far))).toBeLessThan(0.15);
  });

  it("refuses empty texts and non-strings by index", async () => {
    await expect(e.embed(["fine", "  "])).rejects.toThrow(/texts\[1\] is empty/);
    await expect(e.embed(["fine", 3 as unknown as string])).rejects.toThrow(/texts\[1\] is a number/);
    await expect(e.embed("text" as unknown as string[])).rejects.toThrow(DkiArgumentError);
    expect(await e.embed([])).toEqual([]);
  });

  it("embeds a large batch without holding the event loop the whole time", async () => {
    const texts = Array.from({ length: 400 }, (_, i) => `memory number ${i} about topic ${i % 7}`);
    let ticks = 0;
    const timer = setInterval(() => ticks++, 0);
    const vs = await e.embed(texts);
    clearInterval(timer);
    expect(vs).toHaveLength(400);
    // Yields every 64 texts, so a 0 ms timer gets to run in between.
    expect(ticks).toBeGreaterThan(0);
  });
});

const PINNED_NONZERO = [0, 11, 26, 34, 36, 46, 56, 62];
const PINNED_FIRST = 0.2813776433467865;
