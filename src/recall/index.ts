// Recall v4 (seed 003 §5): multi-signal history recall, summaries with trace ids, fact calls.
export { DEFAULT_RECALL, resolveRecallConfig, type RecallConfig, type RecallConfigInput, type RecallScope, type RecallSignalWeights } from "./config.js";
export { MessageIndex, type IndexedMessage } from "./message-index.js";
export { MultiSignalRecall, resolveReference, type RecallRequest, type RecallResult, type RecalledMessage, type RecallSignals, type RecallReason, type ReferenceResolution } from "./recall.js";
export { extractiveSummary, salientFacts, clipToTokens, type ExtractiveSummary } from "./summary.js";
export { SuffixBuilder, CONSTRAINT_INSTRUCTIONS, type AssembledSuffix, type SuffixItem, type SuffixRequest } from "./suffix.js";
export { detectFactCall, FactRetriever, formatFact, runFactCallLoop, type FactRequest, type FactChunk, type FactScope, type FactCallBackend, type FactCallRound, type FactLoopResult, type FactLoopOptions, type GenerationOutput } from "./facts.js";
export { RecallHistoryProvider, type RecallOutcome, type RecallQuery } from "./provider.js";
export { BUILTIN_FORMATS, PROMPT_FORMATTERS, formattedTokenizer, type BuiltinFormat, type FormattableTokenizer, type PromptFormatterName } from "./formatters.js";
