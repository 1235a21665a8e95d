// The DKI system and the pieces the RAG baseline and a knowledge base's "chunks as K/V" mode reuse.
export { DKISystem, type DKISystemOptions, type ChatOptions, type DKIResponse, type DKIMetadata, type RecallV4Info, type DKIStats, type MemoryUsed, type LeftOut, type BlockOrigin, type HybridInjectionInfo } from "./system.js";
export { DEFAULT_BUDGETS, type StoreOpener, type TurnOptions } from "./open.js";
export { resolveConfig, DEFAULT_CONFIG, DEFAULT_GATING, type DKIConfig, type DKIConfigInput, type GatingConfig, type EncodingPrefix, type MemoryOrder, type MemoryEncoding, type HistoryLanguageSetting, type RelevanceThresholdSource } from "./config.js";
export { CACHEBLEND_DEFAULT_RATIO, type BlockFix, type BlockFixInput } from "./config.js";
export { decideGating, gateAlpha, type GatingDecision, type GatingInput } from "./gating.js";
export { assembleBlocks, canonicalStart, type Assembly, type AssembledBlock, type BlockSpec, type BlockSource } from "./assembly.js";
export { applyBlockFix, type BlendModel } from "./assembly.js";
export { analyzeBudget, layerCostMs, type BudgetAnalysis, type BudgetFigures, type LatencyBreakdown } from "./budget.js";
export { FlatHistoryProvider, type HistoryProvider, type HistoryRequest, type HistorySuffix } from "./history.js";
export { routeMemories, type RouteOptions, type MemoryRerank, type Routed, type RoutedMemory } from "./routing.js";
export { FairQueue } from "./fair-queue.js";
export {
  buildHybridPrompt,
  detectLanguage,
  formatHistory,
  mergePreferences,
  renderPrompt,
  tokenCounter,
  HISTORY_MARKERS,
  HISTORY_TEMPLATES,
  type FormattedHistory,
  type HistoryLanguage,
  type HistoryMessage,
  type HistoryTemplate,
  type HybridPrompt,
  type HybridPromptOptions,
  type MergedPreferences,
  type PreferenceLine,
  type PromptParts,
  type PromptTokenizer,
  type RenderedPrompt,
  type TokenCounter,
} from "./prompt.js";
