// The RAG baseline and the knowledge base.
export { RAGSystem, resolveRagConfig, DEFAULT_RAG_CONFIG, type RAGSystemOptions, type RAGChatOptions, type RAGResponse, type RAGMemoryUsed, type RAGConfig, type ContextSource, type KbMode } from "./rag-system.js";
export { buildRagPrompt, contextLine, historyLine, type RagPromptInput, type RagBudget, type RagPromptInfo, type RagPromptBuild, type PromptLayout, type HistoryMessage as RagHistoryMessage } from "./prompt-builder.js";
export { extractCitations, contextBlock, sourceLabel, type Citation, type CitationMap, type CitationSource } from "./citations.js";
export { KnowledgeBase, checkCollectionName, checkOwner, CollectionSettingsError, KB_SCHEMA_VERSION, type KnowledgeBaseOptions, type DocumentMetadata, type CollectionInfo, type CollectionSettings, type DeleteResult, type KbDocument, type KbChunk, type IngestOptions, type IngestResult } from "./kb/knowledge-base.js";
export { InMemoryRetriever, type InMemoryDocument, type RetrieveCall } from "./kb/in-memory-retriever.js";
export { KbTenantView, ownerAdmits, type CollectionOwner, type KbRetriever, type KbRetrieveOptions } from "./kb/tenancy.js";
export { parseDocument, docTypeOf, markdownSections, htmlToText, DOC_TYPES, type DocType, type ParsedDocument, type Section } from "./kb/parse.js";
export { chunkDocument, resolveChunkOptions, textBreaks, CHUNK_STRATEGIES, type ChunkOptions, type ChunkStrategy, type TextChunk } from "./kb/chunk.js";
export { checkFilter as checkKbFilter, DOCUMENT_FIELDS } from "./kb/filter.js";
export { parseRewrites, RRF_K, type KbSearchOptions, type KbSearchResult, type KbSearchDetail, type KbSearchMode, type QueryExpansion } from "./kb/search.js";
