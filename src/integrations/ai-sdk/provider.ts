// createDki: an AI SDK provider over an in-process DKISystem. The provider is made at once, as
// the SDK's providers are; the model, the memory store and the K/V cache are opened by the first
// call that needs them and kept until close(). "rag" runs RAGSystem on the same model and the
// same store (borrowed, so that one process never holds two handles on one store).
import { NoSuchModelError, type ProviderV3 } from "@ai-sdk/provider";
import { Model } from "../../engine/model.js";
import { DkiArgumentError } from "../../errors.js";
import { DKISystem } from "../../dki/system.js";
import type { SystemOpenOptions } from "../../dki/open.js";
import type { MemoryStoreApi } from "../../memory/types.js";
import { RAGSystem, type RAGConfig } from "../../rag/rag-system.js";
import { DKI_MODEL_IDS, type DkiModelId } from "./call.js";
import { DkiEmbeddingModel, embedderTexts, STORE_EMBEDDER_ID } from "./embedding-model.js";
import { DkiLanguageModel } from "./language-model.js";
import { priorWarnings, runTurn, type DkiSystems } from "./turn.js";

export interface DkiProviderSettings extends Omit<SystemOpenOptions, "openStore"> {
  /** Settings of the "rag" model's RAGSystem (its config is `config`, shared with DKI). */
  rag?: Partial<RAGConfig>;
}

export interface DkiProvider extends ProviderV3 {
  /** The language model: "dki" (memory as K/V), "rag" (memory as prompt text) or "none" (no memory). */
  (modelId: DkiModelId): DkiLanguageModel;
  languageModel(modelId: DkiModelId): DkiLanguageModel;
  /** The memory store's embedder ("store", the only one). */
  embeddingModel(modelId?: string): DkiEmbeddingModel;
  textEmbeddingModel(modelId?: string): DkiEmbeddingModel;
  imageModel(modelId: string): never;
  /** The DKISystem the models run on (opened now if no call has opened it yet): its memories, preferences, stats. */
  system(): Promise<DKISystem>;
  /** Waits for the turns in flight, then closes the systems, the store, the cache and a model loaded from a path. Later calls are refused. */
  close(): Promise<void>;
}

interface Opened {
  dki: DKISystem;
  model: Model;
  ownsModel: boolean;
  rag: Promise<RAGSystem> | null;
}

export function createDki(settings: DkiProviderSettings): DkiProvider {
  if (settings === null || typeof settings !== "object") throw new DkiArgumentError("createDki needs { model, dataDir }");
  if (typeof settings.dataDir !== "string" || settings.dataDir === "") throw new DkiArgumentError("createDki: dataDir must be the memory store's folder");
  if (!(settings.model instanceof Model) && (typeof settings.model !== "string" || settings.model === "")) throw new DkiArgumentError("createDki: model must be a loaded Model or a model path");

  let opening: Promise<Opened> | null = null;
  let closed = false;

  const open = async (): Promise<Opened> => {
    const ownsModel = typeof settings.model === "string";
    // Loaded here rather than by DKISystem, so that the RAG system can run on the same weights.
    const model = typeof settings.model === "string" ? await Model.load(settings.model, settings.loadOptions) : settings.model;
    try {
      return { dki: await DKISystem.open({ ...settings, model }), model, ownsModel, rag: null };
    } catch (e) {
      if (ownsModel) model.dispose();
      throw e;
    }
  };
  const opened = (): Promise<Opened> => {
    if (closed) return Promise.reject(new DkiArgumentError("this DKI provider has been closed"));
    // A failed open is not kept: the next call tries again (a model folder written meanwhile).
    opening ??= open().catch((e: unknown) => {
      opening = null;
      throw e;
    });
    return opening;
  };
  const systems = async (): Promise<DkiSystems> => {
    const o = await opened();
    return {
      dki: o.dki,
      rag: () => {
        o.rag ??= RAGSystem.open({ model: o.model, dataDir: settings.dataDir, embedder: settings.embedder, config: settings.config, rag: settings.rag, openStore: async () => borrowed(o.dki.store) }).catch((e: unknown) => {
          o.rag = null;
          throw e;
        });
        return o.rag;
      },
    };
  };

  const languageModel = (modelId: DkiModelId): DkiLanguageModel => {
    if (!(DKI_MODEL_IDS as readonly unknown[]).includes(modelId)) {
      throw new NoSuchModelError({ modelId: String(modelId), modelType: "languageModel", message: `no DKI language model ${JSON.stringify(modelId)}: use ${DKI_MODEL_IDS.map((m) => JSON.stringify(m)).join(", ")}` });
    }
    return new DkiLanguageModel(modelId, {
      warnings: async (call) => priorWarnings((await systems()).dki.store, call),
      run: async (call, signal, onText) => runTurn(await systems(), call, signal, onText),
    });
  };
  const embeddingModel = (modelId: string = STORE_EMBEDDER_ID): DkiEmbeddingModel => {
    if (modelId !== STORE_EMBEDDER_ID) {
      throw new NoSuchModelError({ modelId: String(modelId), modelType: "embeddingModel", message: `no DKI embedding model ${JSON.stringify(modelId)}: the provider embeds with its memory store's embedder, "${STORE_EMBEDDER_ID}"` });
    }
    return new DkiEmbeddingModel(embedderTexts(async () => (await opened()).dki.store.embedder));
  };

  const provider = (modelId: DkiModelId) => languageModel(modelId);
  return Object.assign(provider, {
    specificationVersion: "v3" as const,
    languageModel,
    embeddingModel,
    textEmbeddingModel: embeddingModel,
    imageModel: (modelId: string): never => {
      throw new NoSuchModelError({ modelId, modelType: "imageModel", message: "the DKI provider has no image models" });
    },
    system: async () => (await opened()).dki,
    close: async () => {
      closed = true;
      const o = await opening?.catch(() => null);
      opening = null;
      if (!o) return;
      try {
        // RAG first: it borrows DKI's store.
        const rag = await o.rag?.catch(() => null);
        await rag?.close();
      } finally {
        try {
          await o.dki.close();
        } finally {
          if (o.ownsModel) o.model.dispose();
        }
      }
    },
  });
}

/** The store for a second system in this process: the same handle, with a close() that leaves it open to its owner. */
function borrowed(store: MemoryStoreApi): MemoryStoreApi {
  return {
    get embedder() {
      return store.embedder;
    },
    memories: store.memories,
    preferences: store.preferences,
    conversations: store.conversations,
    audit: store.audit,
    close: async () => {},
  };
}
