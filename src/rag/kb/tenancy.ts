// Knowledge-base collections per tenant. A collection made with an owner (one user id, or a user
// prefix such as "team-a/", as API keys scope users) is seen only by that tenant's scoped reads: a
// KbTenantView (KnowledgeBase.forUser), the retriever interface RAGSystem calls with its turn's
// user, and the server's routes, which build the view from the key's user. To anyone else such a
// collection does not exist: the same "no collection" error, listing only what they may see, so a
// tenant cannot even learn another tenant's collection names. Shared collections (no owner) are
// everyone's, as before tenancy.
import { DkiArgumentError } from "../../errors.js";
import type { KbDocument, KbChunk, CollectionInfo, KnowledgeBase } from "./knowledge-base.js";
import type { KbSearchDetail, KbSearchOptions, KbSearchResult } from "./search.js";

/** Who a collection belongs to: exactly one of a user id or a user-id prefix. */
export interface CollectionOwner {
  userId?: string;
  /** Every user whose id starts with it (and is longer), as an API key's userPrefix. */
  userPrefix?: string;
}

/**
 * The error for a collection a caller cannot use: missing, or another tenant's (the same words,
 * so the two cannot be told apart), listing only the collections the caller may see.
 */
export function noCollectionError(name: unknown, visible: readonly string[], holder = "the knowledge base"): DkiArgumentError {
  return new DkiArgumentError(`no collection ${JSON.stringify(name)}${visible.length > 0 ? `; collections: ${visible.join(", ")}` : ` (${holder} is empty)`}`);
}

/** Whether an owner admits a user (null: no user, who sees shared collections only). */
export function ownerAdmits(owner: CollectionOwner | undefined, userId: string | null): boolean {
  if (owner === undefined) return true;
  if (userId === null) return false;
  if (owner.userId !== undefined) return userId === owner.userId;
  return owner.userPrefix !== undefined && userId.startsWith(owner.userPrefix) && userId.length > owner.userPrefix.length;
}

export interface KbRetrieveOptions extends KbSearchOptions {
  /** The user the retrieval is for: another tenant's collection is not found. */
  userId: string;
}

/**
 * What RAGSystem retrieves knowledge through: the KnowledgeBase, or InMemoryRetriever (a small
 * corpus in memory, for tests of code built on the library). A collection the user may not see
 * must fail exactly as one that does not exist.
 */
export interface KbRetriever {
  retrieve(query: string, options: KbRetrieveOptions): Promise<KbSearchDetail>;
}

/** The knowledge base as one user sees it (see KnowledgeBase.forUser). */
export class KbTenantView implements KbRetriever {
  constructor(
    private readonly kb: KnowledgeBase,
    /** null: a caller acting for no user, who sees shared collections only. */
    readonly userId: string | null,
  ) {}

  /** The collection if this user may see it; else the error a missing collection gives, naming only visible ones. */
  private check(name: string): string {
    if (!this.kb.visibleTo(name, this.userId)) throw noCollectionError(name, this.listCollections().map((c) => c.name));
    return name;
  }

  hasCollection(name: string): boolean {
    return this.kb.visibleTo(name, this.userId);
  }

  listCollections(): CollectionInfo[] {
    return this.kb.listCollections().filter((c) => ownerAdmits(c.owner, this.userId));
  }

  getCollection(name: string): CollectionInfo {
    return this.kb.getCollection(this.check(name));
  }

  listDocuments(collection: string): KbDocument[] {
    return this.kb.listDocuments(this.check(collection));
  }

  getDocument(collection: string, docId: string): KbDocument | undefined {
    return this.kb.getDocument(this.check(collection), docId);
  }

  getChunk(collection: string, chunkId: string): KbChunk | undefined {
    return this.kb.getChunk(this.check(collection), chunkId);
  }

  async search(query: string, o: KbSearchOptions): Promise<KbSearchResult[]> {
    return (await this.searchDetailed(query, o)).results;
  }

  async searchDetailed(query: string, o: KbSearchOptions): Promise<KbSearchDetail> {
    if (o === null || typeof o !== "object") throw new DkiArgumentError("search options must be an object with a collection");
    this.check(o.collection);
    return this.kb.searchDetailed(query, o);
  }

  /** The retriever interface; the options' userId must be this view's user. */
  async retrieve(query: string, o: KbRetrieveOptions): Promise<KbSearchDetail> {
    if (o?.userId !== this.userId) throw new DkiArgumentError(`this view is for ${this.userId === null ? "no user" : `user ${JSON.stringify(this.userId)}`}; retrieve was asked for ${JSON.stringify(o?.userId)}`);
    return this.searchDetailed(query, o);
  }
}
