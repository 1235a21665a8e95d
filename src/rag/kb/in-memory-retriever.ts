// InMemoryRetriever: a retriever with no files, no embedder and no tokenizer, for tests of code
// built on the library (seed 002's mock retriever). It is a real one, not a stub: documents are
// indexed by the memory layer's BM25 over the same CJK-aware terms as the knowledge base, filters
// are the knowledge base's language checked the same way (an unknown field is an error),
// collections may have owners with the same tenancy rule, and RAGSystem takes it where it takes a
// KnowledgeBase. What it leaves out: chunking (each document is one chunk, as given), vectors
// (scores are BM25 alone, over the best score, so `mode` "dense" is refused) and query expansion.
// Every retrieve() call is kept in `calls`, so a test can assert what its code asked for.
import { DkiArgumentError } from "../../errors.js";
import { Bm25Index } from "../../memory/retrieval/bm25.js";
import { terms } from "../../memory/text-terms.js";
import type { Metadata } from "../../memory/types.js";
import { checkFilter, DOCUMENT_FIELDS, matchesFilter } from "./filter.js";
import { checkCollectionName, checkOwner } from "./knowledge-base.js";
import type { KbSearchDetail, KbSearchResult } from "./search.js";
import { noCollectionError, ownerAdmits, type CollectionOwner, type KbRetrieveOptions, type KbRetriever } from "./tenancy.js";

export interface InMemoryDocument {
  id: string;
  text: string;
  title?: string;
  /** Filterable fields beside docId and title (strings, numbers, booleans, null, or arrays of them). */
  metadata?: Metadata;
  headingPath?: string[];
}

interface Collection {
  owner?: CollectionOwner;
  docs: Map<string, InMemoryDocument>;
  bm25: Bm25Index;
}

export interface RetrieveCall {
  query: string;
  options: KbRetrieveOptions;
}

export class InMemoryRetriever implements KbRetriever {
  private readonly collections = new Map<string, Collection>();
  /** Every retrieve() call, in order (options as given). */
  readonly calls: RetrieveCall[] = [];

  /** Optionally, documents to start with, by collection: `{ handbook: [{ id, text }] }`. */
  constructor(documents: Record<string, InMemoryDocument[]> = {}) {
    for (const [c, docs] of Object.entries(documents)) for (const d of docs) this.add(c, d);
  }

  /** Creates a collection (shared, or a tenant's with an owner); adding to a missing one creates it shared. */
  createCollection(name: string, settings: { owner?: CollectionOwner } = {}): void {
    checkCollectionName(name);
    if (this.collections.has(name)) throw new DkiArgumentError(`collection ${JSON.stringify(name)} already exists`);
    this.collections.set(name, { ...(settings.owner !== undefined ? { owner: checkOwner(settings.owner) } : {}), docs: new Map(), bm25: new Bm25Index() });
  }

  /** Adds a document as one chunk, or replaces the one with its id. */
  add(collection: string, doc: InMemoryDocument): void {
    checkCollectionName(collection);
    if (doc === null || typeof doc !== "object" || typeof doc.id !== "string" || doc.id === "") throw new DkiArgumentError("a document needs a non-empty string id");
    if (typeof doc.text !== "string" || doc.text.trim() === "") throw new DkiArgumentError(`document ${JSON.stringify(doc.id)}: text must be a non-empty string`);
    for (const k of Object.keys(doc.metadata ?? {})) if (k === "docId" || k === "title") throw new DkiArgumentError(`document ${JSON.stringify(doc.id)}: metadata.${k} is set from the document itself`);
    if (!this.collections.has(collection)) this.createCollection(collection);
    const c = this.collections.get(collection)!;
    c.bm25.remove(doc.id);
    c.bm25.add(doc.id, terms(doc.text));
    c.docs.set(doc.id, { ...doc, metadata: { ...(doc.metadata ?? {}) } });
  }

  remove(collection: string, id: string): boolean {
    const c = this.collections.get(collection);
    if (c === undefined || !c.docs.delete(id)) return false;
    c.bm25.remove(id);
    return true;
  }

  /** The retriever interface: the best documents for a query in a collection the user may see. */
  async retrieve(query: string, o: KbRetrieveOptions): Promise<KbSearchDetail> {
    this.calls.push({ query, options: o });
    if (typeof query !== "string" || query.trim() === "") throw new DkiArgumentError("the query must be a non-empty string");
    if (o === null || typeof o !== "object" || typeof o.userId !== "string" || o.userId === "") throw new DkiArgumentError("retrieve needs options with a collection and a userId");
    const c = this.collections.get(o.collection);
    if (c === undefined || !ownerAdmits(c.owner, o.userId)) {
      const names = [...this.collections].filter(([, x]) => ownerAdmits(x.owner, o.userId)).map(([n]) => n);
      throw noCollectionError(o.collection, names, "the retriever");
    }
    const limit = o.limit ?? 5;
    const minScore = o.minScore ?? 0;
    if (!Number.isInteger(limit) || limit < 1 || limit > 1000) throw new DkiArgumentError(`limit must be an integer from 1 to 1000, got ${String(limit)}`);
    if (typeof minScore !== "number" || !(minScore >= 0 && minScore <= 1)) throw new DkiArgumentError(`minScore must be in [0, 1], got ${String(minScore)}`);
    if (o.mode === "dense") throw new DkiArgumentError('InMemoryRetriever scores by BM25 only: mode "dense" needs a KnowledgeBase');
    if (o.expand !== undefined) throw new DkiArgumentError("InMemoryRetriever does not expand queries (multi-query, HyDE): use a KnowledgeBase");
    let accept: ((id: string) => boolean) | undefined;
    if (o.filter !== undefined) {
      const known = new Set([...DOCUMENT_FIELDS, ...[...c.docs.values()].flatMap((d) => Object.keys(d.metadata ?? {}))]);
      checkFilter(o.filter, known);
      const filter = o.filter;
      accept = (id) => matchesFilter(this.fields(c.docs.get(id)!), filter);
    }
    const hits = c.bm25.search(terms(query), limit, accept);
    const best = hits[0]?.score ?? 0;
    const results: KbSearchResult[] = [];
    for (const h of hits) {
      const score = best > 0 ? h.score / best : 0;
      if (score <= 0 || score < minScore) continue;
      const d = c.docs.get(h.id)!;
      const headingPath = d.headingPath ?? [];
      results.push({
        chunk: { id: d.id, collection: o.collection, docId: d.id, index: 0, text: d.text, start: 0, end: d.text.length, tokenCount: terms(d.text).length, headingPath },
        source: { chunkId: d.id, docId: d.id, collection: o.collection, start: 0, end: d.text.length, headingPath, ...(d.title !== undefined ? { title: d.title } : {}) },
        score,
        signals: { dense: 0, bm25: h.score },
      });
    }
    return { results, queries: [query] };
  }

  private fields(d: InMemoryDocument): Metadata {
    return { ...(d.metadata ?? {}), docId: d.id, ...(d.title !== undefined ? { title: d.title } : {}) };
  }
}
