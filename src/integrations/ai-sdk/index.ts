// dki-engine/ai-sdk: the Vercel AI SDK provider (language and embedding models, specification v3),
// over an in-process DKISystem or a `dki serve` URL.
export { createDki, type DkiModels, type DkiProvider, type DkiProviderSettings, type DkiServerProvider } from "./provider.js";
export type { DkiServerSettings } from "./remote.js";
export { DkiLanguageModel, PROVIDER_NAME } from "./language-model.js";
export { DkiEmbeddingModel, STORE_EMBEDDER_ID } from "./embedding-model.js";
export { DKI_MODEL_IDS, type DkiModelId, type DkiCallOptions } from "./call.js";
export type { DkiTurnMetadata, RagTurnMetadata, TurnMetadata } from "./turn.js";
