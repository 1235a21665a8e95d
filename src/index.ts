// Public API of dki-engine.
export { Model, resolveDevice, type Device, type LoadOptions, type ModelInfo, type PromptInput, type Segment, type PositionStrategy, type InjectionOptions, type ComputeBlockOptions, type EntropyProbe } from "./engine/model.js";
export { entropy, type GenerateOptions, type GenerateResult, type GenerationStats, type SamplingOptions, type FinishReason } from "./engine/generate.js";
export { native } from "./engine/native.js";
export { KVBlock, type BlockModel, type DeserializeOptions, type KVStorage } from "./kv/kv-block.js";
export { TieredKVCache, CorruptEntryError, FolderLockedError, blockKey, userHash, type BlockRequest, type CacheBudgets, type CacheHit, type CacheModel, type CacheStats, type Tier, type TierStats, type TieredKVCacheOptions } from "./cache/index.js";
export { Tokenizer } from "./tokenizer/tokenizer.js";
export type { ChatMessage } from "./tokenizer/chat-template.js";
export { parseHfConfig, type ModelConfig, type Arch } from "./formats/hf-config.js";
export { readHfFolder, type HfModelFiles } from "./formats/hf-folder.js";
export { readSafetensorsHeader, writeSafetensors, type TensorInfo } from "./formats/safetensors.js";
export { FormatError, DkiArgumentError, NonFiniteError } from "./errors.js";
export { readGguf, writeGguf, GgufMeta, GgmlType, ggmlTypeName, type GgufFile, type GgufEntry, type GgufMetadata, type GgufTensorInfo, type GgufTensorToWrite } from "./formats/gguf.js";
export { readGgufModel, type GgufModel } from "./formats/gguf-model.js";
export { ggufTokenizer, ggufTokenizerJson } from "./tokenizer/gguf-tokenizer.js";
export { convertHfToGguf, type ConvertOptions, type GgufOutType } from "./models/convert.js";
export { HashingEmbedder, type HashingEmbedderOptions } from "./memory/embedders/hashing.js";
export { OnnxEmbedder, type OnnxEmbedderOptions } from "./memory/embedders/onnx.js";
export { terms } from "./memory/text-terms.js";
