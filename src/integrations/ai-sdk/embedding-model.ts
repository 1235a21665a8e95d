// The AI SDK's embedding model (specification v3) over the memory store's embedder: the vectors
// the store routes with, so an application can compare its own texts with the memories in the
// same space. In process the embedder is called directly; over `dki serve` its /v1/embeddings.
import type { EmbeddingModelV3, EmbeddingModelV3CallOptions, EmbeddingModelV3Result } from "@ai-sdk/provider";
import type { Embedder } from "../../memory/types.js";
import { PROVIDER_NAME } from "./language-model.js";

/** The one embedding model a provider serves. */
export const STORE_EMBEDDER_ID = "store";

/** Vectors of some texts, and the embedder that made them. */
export interface StoreEmbeddings {
  embeddings: number[][];
  /** The store's embedder's id. */
  embedder: string;
  dimensions: number;
}

/** Where a provider's embeddings come from. */
export type EmbedTexts = (values: string[], signal: AbortSignal | undefined) => Promise<StoreEmbeddings>;

/** The embeddings of an in-process store's embedder. */
export function embedderTexts(embedder: () => Promise<Embedder>): EmbedTexts {
  return async (values) => {
    const e = await embedder();
    const vectors = await e.embed(values);
    return { embeddings: vectors.map((v) => Array.from(v)), embedder: e.id, dimensions: e.dim };
  };
}

export class DkiEmbeddingModel implements EmbeddingModelV3 {
  readonly specificationVersion = "v3";
  readonly provider = PROVIDER_NAME;
  readonly modelId = STORE_EMBEDDER_ID;
  readonly maxEmbeddingsPerCall = undefined;
  // The ONNX embedder runs one batch at a time; the SDK then sends batches one after another.
  readonly supportsParallelCalls = false;

  constructor(private readonly embedTexts: EmbedTexts) {}

  async doEmbed(o: EmbeddingModelV3CallOptions): Promise<EmbeddingModelV3Result> {
    o.abortSignal?.throwIfAborted();
    const r = await this.embedTexts(o.values, o.abortSignal);
    o.abortSignal?.throwIfAborted();
    // No token count: the hashing embedder has no tokens, and a count the embedder does not
    // report is left out rather than given as 0. (dki serve's usage counts the served model's
    // tokens, not the embedder's, so it is left out too.)
    return {
      embeddings: r.embeddings,
      providerMetadata: { [PROVIDER_NAME]: { embedder: r.embedder, dimensions: r.dimensions } },
      warnings: [],
    };
  }
}
