// The memory layer's public pieces: the store, its types and errors, and the retrieval building
// blocks (retrieval/) a knowledge base can reuse for its own scopes.
export { MemoryStore, erasedUserId, SCHEMA_VERSION, type MemoryStoreOptions, type MemoryStoreStats, type EraseResult, type UserCache } from "./memory-store.js";
export { MemoryNotFoundError, MemoryStoreError, StoreFileError, ImportFormatError } from "./errors.js";
export { checkLmdbFile } from "./store-file.js";
export { calibrateRelevance, chooseThreshold, thresholdRates, topDenseScores, summarizeScores, type Calibration, type CalibrationSet, type ThresholdRates, type ScoreSummary } from "./calibrate.js";
export { parseConversations, type ImportAs, type ImportFormat, type ImportOptions, type ImportResult, type ImportedConversation, type ImportedTurn } from "./import.js";
export { Bm25Index, type Bm25Options, type ScoredId } from "./retrieval/bm25.js";
export { VectorIndex, IndexFileError, type VectorIndexOptions, type VectorHit } from "./retrieval/vector-index.js";
export { fuse, fusionWeights, recency, DEFAULT_FUSION, DEFAULT_WEIGHTS, type Fusion, type FusionWeights, type Signals } from "./retrieval/fusion.js";
export {
  ScopedHybridIndex,
  scopeFileBase,
  type ScopedHybridIndexOptions,
  type ScopeSource,
  type SavedIndex,
  type SaveOutcome,
  type IndexedDocument,
  type RebuildReport,
  type HybridQuery,
  type HybridSearchOptions,
  type HybridHit,
} from "./retrieval/scoped-index.js";
export type * from "./types.js";
