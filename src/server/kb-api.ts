// Knowledge-base collections over HTTP: create (get-or-create), list, ingest a document, search,
// remove a document or every document a metadata filter matches. A shared collection is shared
// knowledge, not a user's memory: any key may list and search it (a chat in rag mode reads it with
// dki.collection). A collection created with an owner (a user, or a user prefix) is that tenant's:
// a request sees it only when it acts for a user the owner admits, through the same key → user
// scoping as the memory routes, and to anyone else it is not found, exactly as a missing one.
// Only an admin key changes a knowledge base.
import type { FastifyInstance, FastifyRequest } from "fastify";
import type { Filter } from "../memory/types.js";
import { CollectionSettingsError, type CollectionInfo, type CollectionSettings, type DocumentMetadata, type KnowledgeBase } from "../rag/kb/knowledge-base.js";
import type { ChunkStrategy } from "../rag/kb/chunk.js";
import type { KbTenantView } from "../rag/kb/tenancy.js";
import { MAX_ID_LENGTH, type ServerContext } from "./context.js";
import { ApiError, notFound } from "./errors.js";

/** Largest document a request may carry (characters); the body limit applies first. */
export const MAX_DOCUMENT_CHARS = 4 * 1024 * 1024;

const name = { type: "string", minLength: 1, maxLength: 64 } as const;
const docId = { type: "string", minLength: 1, maxLength: MAX_ID_LENGTH } as const;
const userId = { type: "string", minLength: 1, maxLength: MAX_ID_LENGTH } as const;

function requireAdmin(request: FastifyRequest): void {
  if (!request.principal.admin) throw new ApiError(403, "permission_error", "changing a knowledge base needs an admin key", null, "admin_only");
}

/** What a request may read: the whole knowledge base (an admin naming no user) or one user's view. */
type KbReader = KnowledgeBase | KbTenantView;

function collectionJson(c: CollectionInfo) {
  return {
    name: c.name,
    documents: c.documents,
    chunks: c.chunks,
    embedder: c.embedderId,
    custom_fields: c.customFields,
    chunk: { chunk_tokens: c.chunk.chunkTokens, overlap_tokens: c.chunk.overlapTokens, min_tail_tokens: c.chunk.minTailTokens, strategy: c.chunk.strategy },
    owner: c.owner === undefined ? null : c.owner.userId !== undefined ? { user_id: c.owner.userId } : { user_prefix: c.owner.userPrefix },
    created_at: new Date(c.createdAt).toISOString(),
  };
}

export function registerKbRoutes(app: FastifyInstance, ctx: ServerContext): void {
  const kb = () => ctx.systems().kb;
  /**
   * The knowledge base as the request may read it: as the user it names (one its key may act for:
   * else 404, as the memory routes answer), else as the key's one user, else everything for an
   * admin key and shared collections only for a key of several users.
   */
  const reader = (request: FastifyRequest, user: string | undefined): KbReader => {
    const p = request.principal;
    if (user !== undefined) {
      if (!p.mayActFor(user)) throw notFound("user", "user_id");
      return kb().forUser(user);
    }
    if (p.defaultUser !== undefined) return kb().forUser(p.defaultUser);
    return p.admin ? kb() : kb().forUser(null);
  };
  /** The collection if the reader may see it; a missing and a hidden one are both 404. */
  const collection = (r: KbReader, c: string) => {
    if (!r.listCollections().some((x) => x.name === c)) throw notFound("collection", "collection");
    return c;
  };

  app.get<{ Querystring: { user_id?: string } }>("/v1/collections", { schema: { querystring: { type: "object", properties: { user_id: userId } } } }, async (request) => ({
    results: reader(request, request.query.user_id).listCollections().map(collectionJson),
  }));

  app.put<{ Params: { collection: string }; Body: { chunk?: { chunk_tokens?: number; overlap_tokens?: number; min_tail_tokens?: number; strategy?: ChunkStrategy }; owner?: { user_id?: string; user_prefix?: string } } }>(
    "/v1/collections/:collection",
    {
      // A PUT with no body at all asks for the default settings.
      preValidation: async (request) => {
        if (request.body === undefined || request.body === null) request.body = {};
      },
      schema: {
        params: { type: "object", properties: { collection: name } },
        body: {
          type: "object",
          additionalProperties: false,
          properties: {
            chunk: { type: "object", additionalProperties: false, properties: { chunk_tokens: { type: "integer" }, overlap_tokens: { type: "integer" }, min_tail_tokens: { type: "integer" }, strategy: { enum: ["sentence", "tokens"] } } },
            owner: { type: "object", additionalProperties: false, properties: { user_id: userId, user_prefix: userId } },
          },
        },
      },
    },
    async (request, reply) => {
      requireAdmin(request);
      const b = request.body;
      const settings: CollectionSettings = {};
      if (b.chunk !== undefined) settings.chunk = { chunkTokens: b.chunk.chunk_tokens, overlapTokens: b.chunk.overlap_tokens, minTailTokens: b.chunk.min_tail_tokens, strategy: b.chunk.strategy };
      if (b.owner !== undefined) settings.owner = { ...(b.owner.user_id !== undefined ? { userId: b.owner.user_id } : {}), ...(b.owner.user_prefix !== undefined ? { userPrefix: b.owner.user_prefix } : {}) };
      try {
        const r = await kb().getOrCreateCollection(request.params.collection, settings);
        return reply.code(r.created ? 201 : 200).send({ ...collectionJson(r.collection), created: r.created });
      } catch (e) {
        if (e instanceof CollectionSettingsError) throw new ApiError(409, "invalid_request_error", e.message, null, "collection_settings_differ");
        throw e;
      }
    },
  );

  app.get<{ Params: { collection: string }; Querystring: { user_id?: string } }>(
    "/v1/collections/:collection/documents",
    { schema: { params: { type: "object", properties: { collection: name } }, querystring: { type: "object", properties: { user_id: userId } } } },
    async (request) => {
      const r = reader(request, request.query.user_id);
      return {
        results: r
          .listDocuments(collection(r, request.params.collection))
          .map((d) => ({ doc_id: d.docId, title: d.title ?? null, doc_type: d.docType, chunks: d.chunkIds.length, chars: d.chars, fields: d.fields, ingested_at: new Date(d.ingestedAt).toISOString() })),
      };
    },
  );

  app.post<{ Params: { collection: string }; Body: { doc_id: string; text: string; doc_type?: "text" | "markdown" | "html"; metadata?: DocumentMetadata } }>(
    "/v1/collections/:collection/documents",
    {
      schema: {
        params: { type: "object", properties: { collection: name } },
        body: { type: "object", additionalProperties: false, required: ["doc_id", "text"], properties: { doc_id: docId, text: { type: "string", minLength: 1, maxLength: MAX_DOCUMENT_CHARS }, doc_type: { enum: ["text", "markdown", "html"] }, metadata: { type: "object", maxProperties: 64 } } },
      },
    },
    async (request, reply) => {
      requireAdmin(request);
      const b = request.body;
      const r = await kb().ingestText(b.text, { collection: request.params.collection, docId: b.doc_id, docType: b.doc_type ?? "text", metadata: b.metadata });
      return reply.code(r.status === "added" ? 201 : 200).send({ doc_id: r.docId, status: r.status, chunks: r.chunks, duplicates_skipped: r.duplicatesSkipped });
    },
  );

  app.post<{ Params: { collection: string }; Body: { query: string; limit?: number; filter?: Filter; min_score?: number; mode?: "hybrid" | "dense" | "bm25"; user_id?: string } }>(
    "/v1/collections/:collection/search",
    {
      schema: {
        params: { type: "object", properties: { collection: name } },
        body: { type: "object", additionalProperties: false, required: ["query"], properties: { query: { type: "string", minLength: 1, maxLength: 10_000 }, limit: { type: "integer", minimum: 1, maximum: 100 }, filter: { type: "object" }, min_score: { type: "number", minimum: 0, maximum: 1 }, mode: { enum: ["hybrid", "dense", "bm25"] }, user_id: userId } },
      },
    },
    async (request) => {
      const b = request.body;
      const r = reader(request, b.user_id);
      const found = await r.search(b.query, { collection: collection(r, request.params.collection), limit: b.limit ?? 5, filter: b.filter, minScore: b.min_score, mode: b.mode });
      return { results: found.map((x) => ({ chunk_id: x.chunk.id, doc_id: x.chunk.docId, text: x.chunk.text, score: x.score, signals: x.signals, heading_path: x.source.headingPath, start: x.source.start, end: x.source.end })) };
    },
  );

  // Delete by metadata filter (e.g. one session's history): every matching document and its chunks, in one transaction.
  app.post<{ Params: { collection: string }; Body: { filter: Filter } }>(
    "/v1/collections/:collection/documents/delete",
    { schema: { params: { type: "object", properties: { collection: name } }, body: { type: "object", additionalProperties: false, required: ["filter"], properties: { filter: { type: "object" } } } } },
    async (request) => {
      requireAdmin(request);
      const r = await kb().deleteWhere(collection(kb(), request.params.collection), request.body.filter);
      return { deleted: r.documents, documents: r.documents.length, chunks: r.chunks };
    },
  );

  app.delete<{ Params: { collection: string; doc: string } }>("/v1/collections/:collection/documents/:doc", { schema: { params: { type: "object", properties: { collection: name, doc: docId } } } }, async (request) => {
    requireAdmin(request);
    if (!(await kb().removeDocument(collection(kb(), request.params.collection), request.params.doc))) throw notFound("document", "doc");
    return { message: "Document deleted successfully!", doc_id: request.params.doc };
  });
}
