// dki-engine/ai-sdk: the Vercel AI SDK provider (language and embedding models, specification v3).
export { createDki, type DkiProvider, type DkiProviderSettings } from "./provider.js";
export { DkiLanguageModel, PROVIDER_NAME } from "./language-model.js";
export { DkiEmbeddingModel, STORE_EMBEDDER_ID } from "./embedding-model.js";
export { DKI_MODEL_IDS, type DkiModelId, type DkiCallOptions } from "./call.js";
