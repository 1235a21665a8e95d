// Assembly of an injection from cached blocks. Each piece (a memory, the merged preferences, a
// knowledge-base chunk) is its own K/V block, keyed by user, model fingerprint, tokens, encoding
// prefix and position in the tiered cache, so it is computed once and reused by every later turn,
// session and process. Every block is computed at one canonical place: right after its encoding
// prefix, which sits at [0, P−1]. The turn then injects the blocks in the order given, and the
// engine moves each to where it lands ([−M, −1] or [0, M−1]) by its shift, with no copy on the
// CPU; each block's α is applied once, there.
import type { BlendOptions, Segment } from "../engine/model.js";
import type { BlockRequest, CacheHit, Tier } from "../cache/tiered-cache.js";
import type { KVBlock } from "../kv/kv-block.js";
import type { BlockFix } from "./config.js";

/** What an encoding prefix needs of a tokenizer; `Tokenizer` has it. */
export interface PrefixTokenizer {
  bosId: number | null;
  encode(text: string, o: { addSpecialTokens: boolean }): number[];
  applyChatTemplate(messages: { role: "system"; content: string }[], o?: { addGenerationPrompt?: boolean }): string;
}

/** The system prompt as the chat template's system turn alone, in tokens (no generation prompt). */
export function systemTurnTokens(tok: PrefixTokenizer, systemPrompt: string): number[] {
  return tok.encode(tok.applyChatTemplate([{ role: "system", content: systemPrompt }], { addGenerationPrompt: false }), { addSpecialTokens: false });
}

/** BOS (when the model has one) then `tokens`, BOS not doubled when they begin with it (a chat template may write its own). */
export function afterBos(tok: Pick<PrefixTokenizer, "bosId">, tokens: number[]): number[] {
  return tok.bosId !== null && tokens[0] !== tok.bosId ? [tok.bosId, ...tokens] : tokens;
}

/** What assembly needs of a cache; `TieredKVCache` has it. */
export interface BlockSource {
  get(req: BlockRequest): Promise<CacheHit>;
}

export interface BlockSpec {
  /** Names the block in reports ("preferences", a memory id, a chunk id). */
  name: string;
  tokens: readonly number[];
  alpha: number;
  scaling?: "value" | "logit";
  /** Divides the block's attention scores (APE); default 1. */
  temperature?: number;
}

export interface AssembledBlock {
  name: string;
  /** The tier that served it: L1–L3, or L4 when computed now. */
  tier: Tier;
  loadMs: number;
  tokens: number;
  alpha: number;
  key: string;
}

export interface Assembly {
  /** In injection order, ready for the engine's `segments`. */
  segments: Segment[];
  blocks: AssembledBlock[];
  /** Tokens of all blocks (n_m). */
  tokens: number;
  /** Cache keys of what a block fix read besides the blocks (EPIC's recomputed pieces, CacheBlend's prefix block). */
  fixKeys: string[];
  /** Lets the cache free the blocks once they have left L1; call once the injection is done. */
  release(): void;
}

/** Position every block is computed at: just after its encoding prefix. */
export const canonicalStart = (prefix: readonly number[]): number => prefix.length;

/**
 * Gets every block from the cache (computing the ones it lacks) for one user, in the order given.
 * If any get fails, the others are released and the error is thrown.
 */
export async function assembleBlocks(cache: BlockSource, userId: string, prefix: number[], specs: readonly BlockSpec[]): Promise<Assembly> {
  const startPos = canonicalStart(prefix);
  const settled = await Promise.allSettled(
    specs.map((s) => cache.get({ userId, tokens: s.tokens, startPos, prefix })),
  );
  const hits = settled.flatMap((r) => (r.status === "fulfilled" ? [r.value] : []));
  const failed = settled.find((r): r is PromiseRejectedResult => r.status === "rejected");
  if (failed) {
    for (const h of hits) h.release();
    throw failed.reason;
  }
  return {
    segments: hits.map((hit, i) => ({ kv: hit.block, alpha: specs[i]!.alpha, scaling: specs[i]!.scaling ?? "value", temperature: specs[i]!.temperature ?? 1 })),
    blocks: hits.map((hit, i) => ({ name: specs[i]!.name, tier: hit.tier, loadMs: hit.loadMs, tokens: hit.block.nTokens, alpha: specs[i]!.alpha, key: hit.key })),
    tokens: hits.reduce((n, hit) => n + hit.block.nTokens, 0),
    fixKeys: [],
    release: () => {
      for (const hit of hits) hit.release();
    },
  };
}

/** What a block fix needs of a model; `Model` has it. */
export interface BlendModel {
  blendBlocks(blocks: KVBlock[], opts: BlendOptions): Promise<KVBlock>;
}

/**
 * The assembly with `fix` applied to its segments, read as one sequence behind `prefix` in their
 * order (each block was computed right behind the prefix, at canonicalStart). EPIC replaces every
 * block after the first by [its first k tokens computed again behind the prefix and the blocks
 * before it, from the cache; the rest as cached]; CacheBlend replaces the blocks by
 * Model.blendBlocks' result cut back into one segment per block. Each segment keeps its α and
 * scaling, the engine places them one after another as before, and release() frees what the fix
 * made. "none", "ape" (whose scores are set by the specs), EPIC with k = 0 and CacheBlend with
 * ratio 0 return the assembly as it is: exactly the separate encoding.
 */
export async function applyBlockFix(a: Assembly, fix: BlockFix, src: { cache: BlockSource; model: BlendModel; userId: string; prefix: number[] }): Promise<Assembly> {
  if (a.segments.length === 0) return a;
  if (fix.kind === "epic" && fix.recomputeTokens > 0) return withSegments(a, await epicSegments(a.segments, fix.recomputeTokens, src));
  if (fix.kind === "cacheblend" && fix.ratio > 0) return withSegments(a, await blendSegments(a.segments, fix.ratio, src));
  return a;
}

interface FixedSegments {
  segments: Segment[];
  /** Blocks the fix made itself (disposed on release). */
  made: KVBlock[];
  /** Cache hits the fix read (released on release). */
  hits: CacheHit[];
}

function withSegments(a: Assembly, f: FixedSegments): Assembly {
  return {
    ...a,
    segments: f.segments,
    fixKeys: [...a.fixKeys, ...f.hits.map((h) => h.key)],
    release: () => {
      for (const b of f.made) b.dispose();
      for (const h of f.hits) h.release();
      a.release();
    },
  };
}

/** On failure, frees what was made and read so far, then rethrows. */
async function collecting(fn: (f: FixedSegments) => Promise<void>): Promise<FixedSegments> {
  const f: FixedSegments = { segments: [], made: [], hits: [] };
  try {
    await fn(f);
    return f;
  } catch (e) {
    for (const b of f.made) b.dispose();
    for (const h of f.hits) h.release();
    throw e;
  }
}

async function epicSegments(segments: readonly Segment[], k: number, src: { cache: BlockSource; userId: string; prefix: number[] }): Promise<FixedSegments> {
  return collecting(async (f) => {
    const before = [...src.prefix];
    for (const [i, s] of segments.entries()) {
      const tokens = [...s.kv.tokens];
      // The first block has nothing but the prefix before it: its cached encoding is its joint one.
      if (i === 0) f.segments.push(s);
      else {
        const n = Math.min(k, tokens.length);
        // Computed where the joint encoding puts it: right after its own encoding prefix (the
        // prefix and the earlier blocks), which its cache key names with everything else it depends on.
        const hit = await src.cache.get({ userId: src.userId, tokens: tokens.slice(0, n), startPos: canonicalStart(before), prefix: before.slice() });
        f.hits.push(hit);
        f.segments.push({ ...s, kv: hit.block });
        if (n < tokens.length) {
          const rest = await s.kv.slice(n, tokens.length);
          f.made.push(rest);
          f.segments.push({ ...s, kv: rest });
        }
      }
      before.push(...tokens);
    }
  });
}

async function blendSegments(segments: readonly Segment[], ratio: number, src: { cache: BlockSource; model: BlendModel; userId: string; prefix: number[] }): Promise<FixedSegments> {
  return collecting(async (f) => {
    // The prefix's own K/V, at [0, P−1] like every block's prefix: the same for every turn, so cached.
    let prefix: KVBlock | undefined;
    if (src.prefix.length > 0) {
      const hit = await src.cache.get({ userId: src.userId, tokens: src.prefix, startPos: 0 });
      f.hits.push(hit);
      prefix = hit.block;
    }
    const blended = await src.model.blendBlocks(
      segments.map((s) => s.kv),
      { ratio, prefix },
    );
    try {
      let at = 0;
      for (const s of segments) {
        const piece = await blended.slice(at, at + s.kv.nTokens);
        f.made.push(piece);
        f.segments.push({ ...s, kv: piece });
        at += s.kv.nTokens;
      }
    } finally {
      blended.dispose();
    }
  });
}
