// What a server owns: one model, one memory store, and the DKI system and RAG baseline over both.
// The two systems share the loaded model and the one store (a server must not hold the store open
// twice: every write would go through two index caches); the store is lent to each system and
// closed by the server, after both systems have finished their turns.
import { basename } from "node:path";
import { Model, type LoadOptions } from "../engine/model.js";
import type { DKIConfigInput } from "../dki/config.js";
import { DKISystem } from "../dki/system.js";
import { MemoryStore, type EraseResult } from "../memory/memory-store.js";
import type { Embedder, MemoryStoreApi, Reranker } from "../memory/types.js";
import type { KnowledgeBase } from "../rag/kb/knowledge-base.js";
import { openKnowledgeBase } from "../rag/kb/open.js";
import { RAGSystem } from "../rag/rag-system.js";
import type { MemoryRerank } from "../dki/routing.js";

export interface SystemsOptions {
  /** A model folder or .gguf file. */
  model: string;
  loadOptions?: LoadOptions;
  dataDir: string;
  cacheDir?: string;
  embedder?: Embedder;
  config?: DKIConfigInput;
  /**
   * Reranks the memory search for both systems and serves RAG's cross-encoder rerank. Handed over:
   * closed with the systems, or at once if they fail to open.
   */
  memoryRerank?: MemoryRerank;
}

/** The store as a system sees it: everything but close, which stays with its owner. */
function lend(store: MemoryStoreApi): MemoryStoreApi {
  return {
    embedder: store.embedder,
    memories: store.memories,
    preferences: store.preferences,
    conversations: store.conversations,
    audit: store.audit,
    close: async () => {},
  };
}

export class ServerSystems {
  private constructor(
    readonly model: Model,
    readonly store: MemoryStore,
    readonly dki: DKISystem,
    readonly rag: RAGSystem,
    /** The data folder's knowledge base (`<data>.kb`, as `dki kb` uses it); the RAG system searches its collections. */
    readonly kb: KnowledgeBase,
    /** The name clients give as `model` (the folder's or file's name). */
    readonly modelId: string,
    /** The routing's reranker (--rerank-model), closed after both systems. */
    readonly reranker: Reranker | null = null,
  ) {}

  /** Loads the model, opens the store, then both systems; whatever opened is closed again if a later step fails. */
  static async open(o: SystemsOptions): Promise<ServerSystems> {
    const reranker = o.memoryRerank?.reranker ?? null;
    let model: Model;
    try {
      model = await Model.load(o.model, o.loadOptions);
    } catch (e) {
      await reranker?.close().catch(() => {});
      throw e;
    }
    let store: MemoryStore | null = null;
    let kb: KnowledgeBase | null = null;
    let dki: DKISystem | null = null;
    try {
      store = await MemoryStore.open({ dir: o.dataDir, embedder: o.embedder });
      kb = await openKnowledgeBase(o.dataDir, { embedder: store.embedder });
      const shared = lend(store);
      const common = { model, dataDir: o.dataDir, cacheDir: o.cacheDir, embedder: store.embedder, config: o.config, openStore: async () => shared, memoryRerank: o.memoryRerank };
      dki = await DKISystem.open(common);
      // The server bounds every turn itself (--turn-timeout, answered 504), so RAG's own 60 s default is off.
      const rag = await RAGSystem.open({ ...common, knowledgeBase: kb, reranker: reranker ?? undefined, rag: { turnTimeoutMs: 0 } });
      return new ServerSystems(model, store, dki, rag, kb, modelIdOf(o.model), reranker);
    } catch (e) {
      await dki?.close().catch(() => {});
      await reranker?.close().catch(() => {});
      await kb?.close().catch(() => {});
      await store?.close().catch(() => {});
      model.dispose();
      throw e;
    }
  }

  /** A user's every record, index file and cached K/V block, in every tier (audited by the store), and the knowledge-base collections the user owns alone. */
  async eraseUser(userId: string): Promise<EraseResult & { collections: string[] }> {
    const erased = await this.store.eraseUser(userId, { cache: this.dki.cache });
    // The knowledge-base collections the user owns alone are the user's data too.
    return { ...erased, collections: await this.kb.removeCollectionsOwnedBy(userId) };
  }

  /** Waits for the turns in flight, then closes both systems, the store and the model. */
  async close(): Promise<void> {
    try {
      await Promise.all([this.rag.close(), this.dki.close()]);
      await this.reranker?.close();
    } finally {
      try {
        await this.kb.close().finally(() => this.store.close());
      } finally {
        this.model.dispose();
      }
    }
  }
}

export function modelIdOf(path: string): string {
  return basename(path.replace(/[\\/]+$/, "")).replace(/\.gguf$/i, "");
}
