// The RAG baseline and the knowledge base.
export { RAGSystem, resolveRagConfig, DEFAULT_RAG_CONFIG, NO_RELEVANT_INFORMATION, type RAGSystemOptions, type RAGChatOptions, type RAGResponse, type RAGMemoryUsed, type RAGConfig, type ContextSource, type KbMode, type StepsOptions, type PipelineTrace, type AdaptiveChoice, type SelfRagSummary, type CitationQuality, type RAGBatchItem } from "./rag-system.js";
export { buildRagPrompt, contextLine, historyLine, type RagPromptInput, type RagBudget, type RagPromptInfo, type RagPromptBuild, type PromptLayout, type HistoryMessage as RagHistoryMessage } from "./prompt-builder.js";
export { extractCitations, contextBlock, sourceLabel, type Citation, type CitationMap, type CitationSource } from "./citations.js";
export { KnowledgeBase, checkCollectionName, checkOwner, CollectionSettingsError, KB_SCHEMA_VERSION, type KnowledgeBaseOptions, type DocumentMetadata, type CollectionInfo, type CollectionSettings, type DeleteResult, type KbDocument, type KbChunk, type IngestOptions, type IngestResult } from "./kb/knowledge-base.js";
export { InMemoryRetriever, type InMemoryDocument, type RetrieveCall } from "./kb/in-memory-retriever.js";
export { KbTenantView, ownerAdmits, type CollectionOwner, type KbRetriever, type KbRetrieveOptions } from "./kb/tenancy.js";
export { parseDocument, docTypeOf, markdownSections, htmlToText, DOC_TYPES, type DocType, type ParsedDocument, type Section } from "./kb/parse.js";
export { chunkDocument, resolveChunkOptions, textBreaks, CHUNK_STRATEGIES, type ChunkOptions, type ChunkStrategy, type TextChunk } from "./kb/chunk.js";
export { checkFilter as checkKbFilter, DOCUMENT_FIELDS } from "./kb/filter.js";
export { parseRewrites, RRF_K, type KbSearchOptions, type KbSearchResult, type KbSearchDetail, type KbSearchMode, type QueryExpansion } from "./kb/search.js";
// The query pipeline (seed 001): LLM steps, query transformation, rerank, prompt modes, Self-RAG, Adaptive RAG, citation quality, answer cache.
export { ModelStepBackend, StepRunner, parseChoice, yesProbability, DEFAULT_STEP_TIMEOUT_MS, type StepBackend, type StepRecord, type StepRunnerOptions, type ChoiceResult, type CompleteOptions } from "./pipeline/steps.js";
export { rewriteQuery, decomposeQuery, stepBackQuery, refineSubQuery, parseSingleQuery, parseSubQueries, type QueryTransformOptions, type TransformHistory } from "./pipeline/query-transform.js";
export { retrieveTransformed, interleave, type RetrievalHop, type TransformedRetrieval, type Searcher } from "./pipeline/transformed-retrieval.js";
export { rerank, lexicalScores, llmScores, crossEncoderScores, termCoverage, RERANK_METHODS, type RerankMethod, type RerankCandidate, type Reranked, type RerankDeps } from "./pipeline/rerank.js";
export { withPromptMode, PROMPT_MODES, PROMPT_MODE_INSTRUCTIONS, type PromptMode } from "./pipeline/prompt-modes.js";
export { runSelfRag, resolveSelfRag, DEFAULT_SELF_RAG, ANSWER_DIMENSIONS, type SelfRagConfig, type SelfRagTrace, type SelfRagRound, type SelfRagDeps, type SelfRagResult, type AnswerDimension } from "./pipeline/self-rag.js";
export { classifyQuery, resolveStrategies, StrategyLedger, DEFAULT_STRATEGIES, QUERY_CLASSES, STRATEGIES, type QueryClass, type Strategy, type StrategyStats } from "./pipeline/adaptive.js";
export { citationConfidence, unsupportedClaims, formatCitations, sentences, CONFIDENCE_WEIGHTS, CITATION_FORMATS, type CitationFormat, type ScoredCitation, type UnsupportedClaim, type ScoredBlock } from "./pipeline/citation-quality.js";
export { SemanticAnswerCache, resolveAnswerCache, DEFAULT_ANSWER_CACHE, type AnswerCacheOptions, type CacheHit } from "./pipeline/answer-cache.js";
