// The AI SDK's embedding model (specification v3) over the memory store's embedder: the vectors
// the store routes with, so an application can compare its own texts with the memories in the
// same space.
import type { EmbeddingModelV3, EmbeddingModelV3CallOptions, EmbeddingModelV3Result } from "@ai-sdk/provider";
import type { Embedder } from "../../memory/types.js";
import { PROVIDER_NAME } from "./language-model.js";

/** The one embedding model a provider serves. */
export const STORE_EMBEDDER_ID = "store";

export class DkiEmbeddingModel implements EmbeddingModelV3 {
  readonly specificationVersion = "v3";
  readonly provider = PROVIDER_NAME;
  readonly modelId = STORE_EMBEDDER_ID;
  readonly maxEmbeddingsPerCall = undefined;
  // The ONNX embedder runs one batch at a time; the SDK then sends batches one after another.
  readonly supportsParallelCalls = false;

  constructor(private readonly embedder: () => Promise<Embedder>) {}

  async doEmbed(o: EmbeddingModelV3CallOptions): Promise<EmbeddingModelV3Result> {
    o.abortSignal?.throwIfAborted();
    const embedder = await this.embedder();
    const vectors = await embedder.embed(o.values);
    o.abortSignal?.throwIfAborted();
    // No token count: the hashing embedder has no tokens, and a count the embedder does not
    // report is left out rather than given as 0.
    return {
      embeddings: vectors.map((v) => Array.from(v)),
      providerMetadata: { [PROVIDER_NAME]: { embedder: embedder.id, dimensions: embedder.dim } },
      warnings: [],
    };
  }
}
