// Knowledge-base collections over HTTP: list, ingest a document, search, remove a document. A
// knowledge base is shared knowledge, not a user's memory: any key may list and search it (a
// chat in rag mode reads it with dki.collection), and only an admin key may change it.
import type { FastifyInstance, FastifyRequest } from "fastify";
import type { Filter } from "../memory/types.js";
import type { DocumentMetadata } from "../rag/kb/knowledge-base.js";
import { MAX_ID_LENGTH, type ServerContext } from "./context.js";
import { ApiError, notFound } from "./errors.js";

/** Largest document a request may carry (characters); the body limit applies first. */
export const MAX_DOCUMENT_CHARS = 4 * 1024 * 1024;

const name = { type: "string", minLength: 1, maxLength: 64 } as const;
const docId = { type: "string", minLength: 1, maxLength: MAX_ID_LENGTH } as const;

function requireAdmin(request: FastifyRequest): void {
  if (!request.principal.admin) throw new ApiError(403, "permission_error", "changing a knowledge base needs an admin key", null, "admin_only");
}

export function registerKbRoutes(app: FastifyInstance, ctx: ServerContext): void {
  const kb = () => ctx.systems().kb;
  const collection = (c: string) => {
    if (!kb().listCollections().some((x) => x.name === c)) throw notFound("collection", "collection");
    return c;
  };

  app.get("/v1/collections", async () => ({
    results: kb().listCollections().map((c) => ({ name: c.name, documents: c.documents, chunks: c.chunks, embedder: c.embedderId, custom_fields: c.customFields, created_at: new Date(c.createdAt).toISOString() })),
  }));

  app.get<{ Params: { collection: string } }>("/v1/collections/:collection/documents", { schema: { params: { type: "object", properties: { collection: name } } } }, async (request) => ({
    results: kb()
      .listDocuments(collection(request.params.collection))
      .map((d) => ({ doc_id: d.docId, title: d.title ?? null, doc_type: d.docType, chunks: d.chunkIds.length, chars: d.chars, fields: d.fields, ingested_at: new Date(d.ingestedAt).toISOString() })),
  }));

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

  app.post<{ Params: { collection: string }; Body: { query: string; limit?: number; filter?: Filter; min_score?: number; mode?: "hybrid" | "dense" | "bm25" } }>(
    "/v1/collections/:collection/search",
    {
      schema: {
        params: { type: "object", properties: { collection: name } },
        body: { type: "object", additionalProperties: false, required: ["query"], properties: { query: { type: "string", minLength: 1, maxLength: 10_000 }, limit: { type: "integer", minimum: 1, maximum: 100 }, filter: { type: "object" }, min_score: { type: "number", minimum: 0, maximum: 1 }, mode: { enum: ["hybrid", "dense", "bm25"] } } },
      },
    },
    async (request) => {
      const b = request.body;
      const found = await kb().search(b.query, { collection: collection(request.params.collection), limit: b.limit ?? 5, filter: b.filter, minScore: b.min_score, mode: b.mode });
      return { results: found.map((r) => ({ chunk_id: r.chunk.id, doc_id: r.chunk.docId, text: r.chunk.text, score: r.score, signals: r.signals, heading_path: r.source.headingPath, start: r.source.start, end: r.source.end })) };
    },
  );

  app.delete<{ Params: { collection: string; doc: string } }>("/v1/collections/:collection/documents/:doc", { schema: { params: { type: "object", properties: { collection: name, doc: docId } } } }, async (request) => {
    requireAdmin(request);
    if (!(await kb().removeDocument(collection(request.params.collection), request.params.doc))) throw notFound("document", "doc");
    return { message: "Document deleted successfully!", doc_id: request.params.doc };
  });
}
