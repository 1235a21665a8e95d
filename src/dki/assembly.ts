// Assembly of an injection from cached blocks. Each piece (a memory, the merged preferences, a
// knowledge-base chunk) is its own K/V block, keyed by user, model fingerprint, tokens, encoding
// prefix and position in the tiered cache, so it is computed once and reused by every later turn,
// session and process. Every block is computed at one canonical place: right after its encoding
// prefix, which sits at [0, P−1]. The turn then injects the blocks in the order given, and the
// engine moves each to where it lands ([−M, −1] or [0, M−1]) by its shift, with no copy on the
// CPU; each block's α is applied once, there.
import type { Segment } from "../engine/model.js";
import type { BlockRequest, CacheHit, Tier } from "../cache/tiered-cache.js";

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
  tokens: number[];
  alpha: number;
  scaling?: "value" | "logit";
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
    segments: hits.map((hit, i) => ({ kv: hit.block, alpha: specs[i]!.alpha, scaling: specs[i]!.scaling ?? "value" })),
    blocks: hits.map((hit, i) => ({ name: specs[i]!.name, tier: hit.tier, loadMs: hit.loadMs, tokens: hit.block.nTokens, alpha: specs[i]!.alpha, key: hit.key })),
    tokens: hits.reduce((n, hit) => n + hit.block.nTokens, 0),
    release: () => {
      for (const hit of hits) hit.release();
    },
  };
}
