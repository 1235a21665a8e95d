// The tiered K/V cache (L1 blocks, L2 fp16/bf16 RAM, L3 int8 files, L4 recompute).
export {
  TieredKVCache,
  type BlockRequest,
  type CacheBudgets,
  type CacheHit,
  type CacheModel,
  type CacheStats,
  type Tier,
  type TierStats,
  type TieredKVCacheOptions,
} from "./tiered-cache.js";
export { blockKey, userHash, type KeyParts } from "./keys.js";
export { CorruptEntryError, encodeEntry, decodeEntry, ENTRY_HEADER_BYTES } from "./tiers/l3-files.js";
export { FolderLockedError } from "./tiers/folder-lock.js";
export type { L2Storage } from "./tiers/l2.js";
