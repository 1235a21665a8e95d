// The memory API, in mem0's REST shape (memories add / list / search / get / update / delete /
// history; a user's erasure), plus the preferences DKI injects and the sessions and messages it
// records. Every route acts for one user, checked against the caller's key (ServerContext.dataUser)
// and passed to the store as the scope: the store's keys start with the user, so an id of another
// user's record reads as not found, exactly as one that names nothing.
import type { FastifyInstance } from "fastify";
import type { Memory, Preference, ConversationTurn, Metadata } from "../memory/types.js";
import { MAX_ID_LENGTH, type ServerContext } from "./context.js";
import { ApiError, badRequest, notFound } from "./errors.js";
import { MAX_TEXT_CHARS } from "./openai.js";

const id = { type: "string", minLength: 1, maxLength: MAX_ID_LENGTH } as const;
const text = { type: "string", minLength: 1, maxLength: MAX_TEXT_CHARS } as const;
const limit = { type: "string", pattern: "^[0-9]{1,4}$" } as const;
const userQuery = { type: "object", additionalProperties: false, properties: { user_id: id } } as const;
const idParams = { type: "object", required: ["id"], properties: { id } } as const;

/** mem0's memory object. */
function memoryOut(m: Memory) {
  return { id: m.id, memory: m.text, user_id: m.userId, session_id: m.sessionId ?? null, metadata: m.metadata, created_at: new Date(m.createdAt).toISOString(), updated_at: new Date(m.updatedAt).toISOString() };
}

function preferenceOut(p: Preference) {
  return { id: p.id, preference: p.text, type: p.type, priority: p.priority, category: p.category ?? null, active: p.active, user_id: p.userId, created_at: new Date(p.createdAt).toISOString(), updated_at: new Date(p.updatedAt).toISOString() };
}

function messageOut(t: ConversationTurn) {
  return { id: t.id, role: t.role, content: t.content, session_id: t.sessionId, injection_mode: t.injectionMode ?? null, alpha: t.alpha ?? null, memory_ids: t.memoryIds, created_at: new Date(t.createdAt).toISOString() };
}

const limitOf = (v: string | undefined, max: number): number | undefined => {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (n < 1 || n > max) throw badRequest(`limit must be from 1 to ${max}, got ${v}`, "limit");
  return n;
};

interface AddBody {
  user_id?: string;
  session_id?: string;
  messages?: { role: "user" | "assistant" | "system"; content: string }[];
  memory?: string;
  metadata?: Metadata;
}

export function registerMemoryRoutes(app: FastifyInstance, ctx: ServerContext): void {
  const store = () => ctx.systems().store;

  // mem0: POST /v1/memories/ { messages, user_id, metadata } → the memories added. `memory` adds one text as it is.
  app.post<{ Body: AddBody }>(
    "/v1/memories",
    {
      schema: {
        body: {
          type: "object",
          additionalProperties: false,
          properties: {
            user_id: id,
            session_id: id,
            messages: { type: "array", minItems: 1, maxItems: 256, items: { type: "object", additionalProperties: false, required: ["role", "content"], properties: { role: { enum: ["user", "assistant", "system"] }, content: text } } },
            memory: text,
            metadata: { type: "object", maxProperties: 64 },
          },
        },
      },
    },
    async (request, reply) => {
      const b = request.body;
      const userId = ctx.dataUser(request, b.user_id);
      if ((b.messages === undefined) === (b.memory === undefined)) throw badRequest("give exactly one of messages and memory", b.messages === undefined ? "memory" : "messages");
      const added = await store().memories.add(b.memory ?? b.messages ?? [], { userId, sessionId: b.session_id, metadata: b.metadata });
      return reply.code(201).send({ results: added.map((m) => ({ ...memoryOut(m), event: "ADD" })) });
    },
  );

  app.get<{ Querystring: { user_id?: string; session_id?: string } }>(
    "/v1/memories",
    { schema: { querystring: { type: "object", additionalProperties: false, properties: { user_id: id, session_id: id } } } },
    async (request) => {
      const userId = ctx.dataUser(request, request.query.user_id);
      const all = await store().memories.getAll({ userId, sessionId: request.query.session_id });
      return { results: all.map(memoryOut) };
    },
  );

  app.post<{ Body: { query: string; user_id?: string; session_id?: string; limit?: number } }>(
    "/v1/memories/search",
    { schema: { body: { type: "object", additionalProperties: false, required: ["query"], properties: { query: text, user_id: id, session_id: id, limit: { type: "integer", minimum: 1, maximum: 100 } } } } },
    async (request) => {
      const b = request.body;
      const userId = ctx.dataUser(request, b.user_id);
      const found = await store().memories.search(b.query, { userId, sessionId: b.session_id, limit: b.limit ?? 10 });
      return { results: found.map((r) => ({ ...memoryOut(r.memory), score: r.score, signals: r.signals })) };
    },
  );

  app.get<{ Params: { id: string }; Querystring: { user_id?: string } }>("/v1/memories/:id", { schema: { params: idParams, querystring: userQuery } }, async (request) => {
    const userId = ctx.dataUser(request, request.query.user_id);
    const m = await store().memories.get(request.params.id, { userId });
    if (m === undefined) throw notFound("memory", "id");
    return memoryOut(m);
  });

  app.get<{ Params: { id: string }; Querystring: { user_id?: string } }>("/v1/memories/:id/history", { schema: { params: idParams, querystring: userQuery } }, async (request) => {
    const userId = ctx.dataUser(request, request.query.user_id);
    const s = store();
    // An id that names none of this user's memories (another user's included) is not found, whatever its audit holds.
    if ((await s.memories.get(request.params.id, { userId })) === undefined) throw notFound("memory", "id");
    const entries = await s.memories.history(request.params.id, { userId });
    return { results: entries.map((e) => ({ id: e.id, action: e.action, at: new Date(e.at).toISOString(), memory_ids: e.memoryIds, metadata: e.metadata })) };
  });

  app.put<{ Params: { id: string }; Body: { text: string; user_id?: string } }>(
    "/v1/memories/:id",
    { schema: { params: idParams, body: { type: "object", additionalProperties: false, required: ["text"], properties: { text, user_id: id } } } },
    async (request) => {
      const userId = ctx.dataUser(request, request.body.user_id);
      return memoryOut(await store().memories.update(request.params.id, request.body.text, { userId }));
    },
  );

  app.delete<{ Params: { id: string }; Querystring: { user_id?: string } }>("/v1/memories/:id", { schema: { params: idParams, querystring: userQuery } }, async (request) => {
    const userId = ctx.dataUser(request, request.query.user_id);
    const s = store();
    if ((await s.memories.get(request.params.id, { userId })) === undefined) throw notFound("memory", "id");
    await s.memories.delete(request.params.id, { userId });
    return { message: "Memory deleted successfully!", id: request.params.id };
  });

  // Preferences: what DKI injects as K/V ahead of every turn (the reference system's /api/preferences).
  app.get<{ Querystring: { user_id?: string; include_inactive?: "true" | "false" } }>(
    "/v1/preferences",
    { schema: { querystring: { type: "object", additionalProperties: false, properties: { user_id: id, include_inactive: { enum: ["true", "false"] } } } } },
    async (request) => {
      const userId = ctx.dataUser(request, request.query.user_id);
      return { results: (await store().preferences.list({ userId, includeInactive: request.query.include_inactive === "true" })).map(preferenceOut) };
    },
  );

  const prefFields = { preference: { ...text, maxLength: 4096 }, type: { type: "string", minLength: 1, maxLength: 64 }, priority: { type: "integer", minimum: -1000, maximum: 1000 }, category: { type: "string", minLength: 1, maxLength: 64 } } as const;
  app.post<{ Body: { user_id?: string; preference: string; type: string; priority?: number; category?: string } }>(
    "/v1/preferences",
    { schema: { body: { type: "object", additionalProperties: false, required: ["preference", "type"], properties: { user_id: id, ...prefFields } } } },
    async (request, reply) => {
      const b = request.body;
      const userId = ctx.dataUser(request, b.user_id);
      return reply.code(201).send(preferenceOut(await store().preferences.add(b.preference, { userId, type: b.type, priority: b.priority, category: b.category })));
    },
  );

  app.put<{ Params: { id: string }; Body: { user_id?: string; preference?: string; type?: string; priority?: number; category?: string; active?: boolean } }>(
    "/v1/preferences/:id",
    { schema: { params: idParams, body: { type: "object", additionalProperties: false, minProperties: 1, properties: { user_id: id, ...prefFields, active: { type: "boolean" } } } } },
    async (request) => {
      const { user_id, preference, ...rest } = request.body;
      const userId = ctx.dataUser(request, user_id);
      const patch = { ...rest, ...(preference !== undefined ? { text: preference } : {}) };
      if (Object.keys(patch).length === 0) throw badRequest("nothing to update: give preference, type, priority, category or active");
      return preferenceOut(await store().preferences.update(request.params.id, patch, { userId }));
    },
  );

  app.delete<{ Params: { id: string }; Querystring: { user_id?: string } }>("/v1/preferences/:id", { schema: { params: idParams, querystring: userQuery } }, async (request) => {
    const userId = ctx.dataUser(request, request.query.user_id);
    await store().preferences.delete(request.params.id, { userId });
    return { message: "Preference deleted successfully!", id: request.params.id };
  });

  // Sessions and their messages: the conversation the server recorded, turn by turn.
  app.get<{ Querystring: { user_id?: string } }>("/v1/sessions", { schema: { querystring: userQuery } }, async (request) => {
    const userId = ctx.dataUser(request, request.query.user_id);
    const sessions = new Map<string, { session_id: string; messages: number; first_at: number; last_at: number }>();
    for (const t of await store().conversations.listUser({ userId })) {
      const s = sessions.get(t.sessionId) ?? { session_id: t.sessionId, messages: 0, first_at: t.createdAt, last_at: t.createdAt };
      s.messages++;
      s.last_at = Math.max(s.last_at, t.createdAt);
      sessions.set(t.sessionId, s);
    }
    return { results: [...sessions.values()].map((s) => ({ ...s, first_at: new Date(s.first_at).toISOString(), last_at: new Date(s.last_at).toISOString() })) };
  });

  app.get<{ Params: { id: string }; Querystring: { user_id?: string; limit?: string } }>(
    "/v1/sessions/:id/messages",
    { schema: { params: idParams, querystring: { type: "object", additionalProperties: false, properties: { user_id: id, limit } } } },
    async (request) => {
      const userId = ctx.dataUser(request, request.query.user_id);
      const turns = await store().conversations.list({ userId, sessionId: request.params.id, limit: limitOf(request.query.limit, 10_000) });
      if (turns.length === 0) throw notFound("session", "id");
      return { results: turns.map(messageOut) };
    },
  );

  // Users: an admin key lists them; a user is erased (store, index files, every K/V tier, audited) by any key that may act for it.
  app.get("/v1/users", async (request) => {
    if (!request.principal.admin) throw new ApiError(403, "permission_error", "listing users needs an admin key", null, "admin_only");
    return { results: store().listUsers().map((u) => ({ user_id: u })) };
  });

  app.delete<{ Params: { id: string } }>("/v1/users/:id", { schema: { params: idParams } }, async (request) => {
    const userId = ctx.dataUser(request, request.params.id, "id");
    const erased = await ctx.systems().eraseUser(userId);
    return { message: "User deleted successfully!", user_id: userId, erased: { memories: erased.memories, preferences: erased.preferences, turns: erased.turns, audit_entries: erased.auditEntries, kv_cache_cleared: erased.cacheCleared, kb_collections: erased.collections } };
  });
}
