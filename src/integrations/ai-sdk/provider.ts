// createDki: an AI SDK provider over an in-process DKISystem, or over a `dki serve` URL. The
// provider is made at once, as the SDK's providers are. In process, the model, the memory store and
// the K/V cache are opened by the first call that needs them and kept until close(); "rag" runs
// RAGSystem on the same model and the same store (borrowed, so that one process never holds two
// handles on one store). Over a URL each call is a request to the server's OpenAI routes, and the
// models answer with the same results, so an application switches by configuration alone.
import { NoSuchModelError, type ProviderV3 } from "@ai-sdk/provider";
import { Model } from "../../engine/model.js";
import { DkiArgumentError } from "../../errors.js";
import { DKISystem } from "../../dki/system.js";
import type { SystemOpenOptions } from "../../dki/open.js";
import type { MemoryStoreApi } from "../../memory/types.js";
import { RAGSystem, type RAGConfig } from "../../rag/rag-system.js";
import { DKI_MODEL_IDS, type DkiModelId } from "./call.js";
import { DkiEmbeddingModel, embedderTexts, STORE_EMBEDDER_ID, type EmbedTexts } from "./embedding-model.js";
import { DkiLanguageModel, type DkiTurns } from "./language-model.js";
import { DkiServerClient, serverEmbeddings, serverTurns, type DkiServerSettings } from "./remote.js";
import { priorWarnings, runTurn, type DkiSystems } from "./turn.js";

export interface DkiProviderSettings extends Omit<SystemOpenOptions, "openStore"> {
  /** Settings of the "rag" model's RAGSystem (its config is `config`, shared with DKI). */
  rag?: Partial<RAGConfig>;
}

/** The models of a provider, in process or over a URL. */
export interface DkiModels extends ProviderV3 {
  /** The language model: "dki" (memory as K/V), "rag" (memory as prompt text) or "none" (no memory). */
  (modelId: DkiModelId): DkiLanguageModel;
  languageModel(modelId: DkiModelId): DkiLanguageModel;
  /** The memory store's embedder ("store", the only one). */
  embeddingModel(modelId?: string): DkiEmbeddingModel;
  textEmbeddingModel(modelId?: string): DkiEmbeddingModel;
  imageModel(modelId: string): never;
  /** In process: waits for the turns in flight, then closes the systems, the store, the cache and a model loaded from a path. Over a URL: nothing to close. Later calls are refused either way. */
  close(): Promise<void>;
}

/** The provider over an in-process DKISystem. */
export interface DkiProvider extends DkiModels {
  /** The DKISystem the models run on (opened now if no call has opened it yet): its memories, preferences, stats. */
  system(): Promise<DKISystem>;
}

/** The provider over a `dki serve` URL (memories, sessions and users are the server's REST API's). */
export interface DkiServerProvider extends DkiModels {
  readonly url: string;
}

interface Opened {
  dki: DKISystem;
  model: Model;
  ownsModel: boolean;
  rag: Promise<RAGSystem> | null;
}

/** The models over a backend: the ids checked, the language and embedding models made on it. */
function models(turns: DkiTurns, embed: EmbedTexts, isClosed: () => boolean): ((modelId: DkiModelId) => DkiLanguageModel) & Omit<DkiModels, "close"> {
  const closedError = () => new DkiArgumentError("this DKI provider has been closed");
  // Refused at the call, not at the model's making: the SDK makes models up front.
  const open: DkiTurns = {
    warnings: (call, signal) => (isClosed() ? Promise.reject(closedError()) : turns.warnings(call, signal)),
    run: (call, signal, onText) => (isClosed() ? Promise.reject(closedError()) : turns.run(call, signal, onText)),
  };
  const openEmbed: EmbedTexts = (values, signal) => (isClosed() ? Promise.reject(closedError()) : embed(values, signal));
  const languageModel = (modelId: DkiModelId): DkiLanguageModel => {
    if (!(DKI_MODEL_IDS as readonly unknown[]).includes(modelId)) {
      throw new NoSuchModelError({ modelId: String(modelId), modelType: "languageModel", message: `no DKI language model ${JSON.stringify(modelId)}: use ${DKI_MODEL_IDS.map((m) => JSON.stringify(m)).join(", ")}` });
    }
    return new DkiLanguageModel(modelId, open);
  };
  const embeddingModel = (modelId: string = STORE_EMBEDDER_ID): DkiEmbeddingModel => {
    if (modelId !== STORE_EMBEDDER_ID) {
      throw new NoSuchModelError({ modelId: String(modelId), modelType: "embeddingModel", message: `no DKI embedding model ${JSON.stringify(modelId)}: the provider embeds with its memory store's embedder, "${STORE_EMBEDDER_ID}"` });
    }
    return new DkiEmbeddingModel(openEmbed);
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
  });
}

/** A provider over a `dki serve` at `settings.url`, or over an in-process DKISystem on `settings.model` and `settings.dataDir`. */
export function createDki(settings: DkiServerSettings): DkiServerProvider;
export function createDki(settings: DkiProviderSettings): DkiProvider;
export function createDki(settings: DkiProviderSettings | DkiServerSettings): DkiModels;
export function createDki(settings: DkiProviderSettings | DkiServerSettings): DkiProvider | DkiServerProvider {
  if (settings === null || typeof settings !== "object") throw new DkiArgumentError("createDki needs { model, dataDir } (in process) or { url } (a dki serve)");
  if ("url" in settings) {
    if ("model" in settings || "dataDir" in settings) throw new DkiArgumentError("createDki: give either { url } (a dki serve, which has its own model and store) or { model, dataDir }, not both");
    return createServerProvider(settings);
  }
  return createLocalProvider(settings);
}

function createServerProvider(settings: DkiServerSettings): DkiServerProvider {
  if (typeof settings.url !== "string" || settings.url === "") throw new DkiArgumentError("createDki: url must be the dki serve's base URL, e.g. \"http://127.0.0.1:8080\"");
  if (settings.apiKey !== undefined && (typeof settings.apiKey !== "string" || settings.apiKey === "")) throw new DkiArgumentError("createDki: apiKey must be a non-empty string (a key of the server's --api-key-file)");
  let client: DkiServerClient;
  try {
    client = new DkiServerClient(settings);
  } catch (e) {
    throw new DkiArgumentError((e as Error).message);
  }
  let closed = false;
  return Object.assign(models(serverTurns(client), serverEmbeddings(client), () => closed), {
    url: client.baseUrl,
    close: async () => {
      closed = true;
    },
  });
}

function createLocalProvider(settings: DkiProviderSettings): DkiProvider {
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
        o.rag ??= RAGSystem.open({ model: o.model, dataDir: settings.dataDir, embedder: settings.embedder, config: settings.config, rag: settings.rag, memoryRerank: settings.memoryRerank, openStore: async () => borrowed(o.dki.store) }).catch((e: unknown) => {
          o.rag = null;
          throw e;
        });
        return o.rag;
      },
    };
  };

  const turns: DkiTurns = {
    warnings: async (call) => priorWarnings((await systems()).dki.store, call),
    run: async (call, signal, onText) => runTurn(await systems(), call, signal, onText),
  };
  return Object.assign(models(turns, embedderTexts(async () => (await opened()).dki.store.embedder), () => closed), {
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
