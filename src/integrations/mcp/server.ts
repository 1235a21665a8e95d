// The MCP server of one user's memory: tools to add, search, list, read, change and delete the
// user's memories and preferences and to run a DKI turn, and resources for the memories.
//
// The user is an argument of the server, fixed by whoever starts it (the --user flag, the
// environment, or the key an HTTP request authenticated with), never an argument of a tool: a
// memory server that takes the user from the call lets any client read anyone's memories by
// naming them. Every schema is strict, so a `user_id` argument is refused, not ignored; an id of
// another user's memory reads as not found, exactly as an unknown one (the store's rule).
import { McpServer, ResourceTemplate } from "@modelcontextprotocol/sdk/server/mcp.js";
import type { CallToolResult, ReadResourceResult } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";
import type { DKISystem, DKIResponse } from "../../dki/system.js";
import type { Memory, Preference } from "../../memory/types.js";

export interface MemoryServerOptions {
  /** The system whose store, cache and model the tools use. The caller owns it. */
  system: DKISystem;
  /** The one user every tool and resource of this server acts for. */
  userId: string;
  /** The session `chat` turns go to when a call names none (a memory added without one belongs to no session). */
  defaultSessionId: string;
  /** Reported to clients in the initialize handshake. */
  version: string;
}

const id = z.string().trim().min(1, "must be a non-empty id").max(256);
const text = z.string().trim().min(1, "must be non-empty text").max(100_000);
const sessionId = z.string().trim().min(1).max(256).describe("a session of this user (default: the server's own)");
// Flat values only: the store keeps any JSON, but a nested schema would make every client's form generator work hard for little.
const metadata = z.record(z.string(), z.union([z.string(), z.number(), z.boolean(), z.null()])).describe("flat key → value metadata stored with the memory");

/** The MCP URIs of the resources. */
export const MEMORIES_URI = "dki://memories";
export const PREFERENCES_URI = "dki://preferences";
const MEMORY_URI_TEMPLATE = "dki://memories/{id}";
const memoryUri = (memoryId: string) => `${MEMORIES_URI}/${encodeURIComponent(memoryId)}`;

/** A memory as tools and resources show it. The user is left out: it is always the server's. */
function memoryView(m: Memory) {
  return { id: m.id, text: m.text, metadata: m.metadata, session_id: m.sessionId ?? null, created_at: new Date(m.createdAt).toISOString(), updated_at: new Date(m.updatedAt).toISOString() };
}

function preferenceView(p: Preference) {
  return { id: p.id, text: p.text, type: p.type, priority: p.priority, category: p.category ?? null, active: p.active, created_at: new Date(p.createdAt).toISOString() };
}

function chatView(r: DKIResponse) {
  return {
    text: r.text,
    finish_reason: r.finishReason,
    session_id: r.metadata.sessionId,
    memories_used: r.memoriesUsed.map((m) => ({ id: m.id, text: m.text, relevance: m.relevance, tokens: m.tokens })),
    injected: r.gating.inject,
    alpha: r.gating.alpha,
    gate_reason: r.gating.reason,
    tiers: r.cache.tiers.map((b) => ({ kind: b.kind, id: b.id ?? null, tier: b.tier })),
    input_tokens: r.inputTokens,
    memory_tokens: r.budget.memoryTokens,
    output_tokens: r.outputTokens,
    ttft_ms: r.latency.ttftMs,
  };
}

/** A tool's answer: the value as JSON text (what every client shows) and as structured content. */
function result(value: Record<string, unknown>): CallToolResult {
  return { content: [{ type: "text", text: JSON.stringify(value, null, 2) }], structuredContent: value };
}

function json(uri: string, value: unknown): ReadResourceResult {
  return { contents: [{ uri, mimeType: "application/json", text: JSON.stringify(value, null, 2) }] };
}

export function createMemoryServer(o: MemoryServerOptions): McpServer {
  const { system, userId } = o;
  if (typeof userId !== "string" || userId.trim() === "") throw new Error("the MCP server needs the user it serves (a non-empty user id)");
  const scope = { userId };
  const server = new McpServer(
    { name: "dki-memory", version: o.version },
    { instructions: "Long-term memory of one user (fixed by the server's configuration), and chat turns that inject the relevant memories into a local model as K/V. Memory ids are those this server returned." },
  );
  const memories = system.memories;
  // Derived K/V holds a memory's text as much as the memory does: a memory changed or deleted
  // takes the user's cached blocks with it (they are computed again from what stays).
  const dropKv = () => system.cache.clear(userId);

  server.registerTool(
    "add_memory",
    {
      title: "Add a memory",
      description: "Store a fact about the user (a preference, a detail, an event) for later turns.",
      inputSchema: z.strictObject({ text, metadata: metadata.optional(), session_id: sessionId.optional() }),
    },
    async (a) => {
      const added = await memories.add(a.text, { userId, sessionId: a.session_id, metadata: a.metadata });
      return result({ added: added.map(memoryView) });
    },
  );

  server.registerTool(
    "search_memories",
    {
      title: "Search memories",
      description: "The user's memories most relevant to a query (dense + BM25, fused), best first.",
      inputSchema: z.strictObject({ query: text, limit: z.number().int().min(1).max(100).default(5), session_id: sessionId.optional().describe("only memories added in this session") }),
      annotations: { readOnlyHint: true },
    },
    async (a) => {
      const found = await memories.search(a.query, { userId, limit: a.limit, sessionId: a.session_id });
      return result({ results: found.map((r) => ({ ...memoryView(r.memory), score: r.score })) });
    },
  );

  server.registerTool(
    "list_memories",
    {
      title: "List memories",
      description: "The user's memories, oldest first, a page at a time.",
      inputSchema: z.strictObject({ limit: z.number().int().min(1).max(1000).default(100), offset: z.number().int().min(0).default(0), session_id: sessionId.optional().describe("only memories added in this session") }),
      annotations: { readOnlyHint: true },
    },
    async (a) => {
      const all = await memories.getAll({ userId, sessionId: a.session_id });
      return result({ total: all.length, offset: a.offset, memories: all.slice(a.offset, a.offset + a.limit).map(memoryView) });
    },
  );

  server.registerTool(
    "get_memory",
    { title: "Get a memory", description: "One memory by id.", inputSchema: z.strictObject({ id }), annotations: { readOnlyHint: true } },
    async (a) => {
      const m = await memories.get(a.id, scope);
      if (m === undefined) throw new Error(`memory ${JSON.stringify(a.id)} not found`);
      return result({ memory: memoryView(m) });
    },
  );

  server.registerTool(
    "update_memory",
    { title: "Update a memory", description: "Replace a memory's text (it is embedded again).", inputSchema: z.strictObject({ id, text }), annotations: { idempotentHint: true } },
    async (a) => {
      const m = await memories.update(a.id, a.text, scope);
      await dropKv();
      return result({ memory: memoryView(m) });
    },
  );

  server.registerTool(
    "delete_memory",
    { title: "Delete a memory", description: "Delete one memory by id.", inputSchema: z.strictObject({ id }), annotations: { destructiveHint: true, idempotentHint: true } },
    async (a) => {
      // The store's delete of an unknown id is quiet; a client should hear that nothing matched.
      if ((await memories.get(a.id, scope)) === undefined) throw new Error(`memory ${JSON.stringify(a.id)} not found`);
      await memories.delete(a.id, scope);
      await dropKv();
      return result({ deleted: a.id });
    },
  );

  server.registerTool(
    "delete_all_memories",
    {
      title: "Delete all memories",
      description: "Delete every memory of the user (preferences and conversations stay). Needs confirm: true.",
      inputSchema: z.strictObject({ confirm: z.literal(true).describe("must be true: this cannot be undone") }),
      annotations: { destructiveHint: true },
    },
    async () => {
      const all = await memories.getAll(scope);
      for (const m of all) await memories.delete(m.id, scope);
      await dropKv();
      return result({ deleted: all.length });
    },
  );

  server.registerTool(
    "add_preference",
    {
      title: "Add a preference",
      description: "A standing preference of the user (injected as K/V into every chat turn).",
      inputSchema: z.strictObject({ text, type: z.string().trim().min(1).max(64).describe('what kind, e.g. "diet", "style", "language"'), priority: z.number().int().min(-1000).max(1000).optional(), category: z.string().trim().min(1).max(64).optional() }),
    },
    async (a) => result({ preference: preferenceView(await system.preferences.add(a.text, { userId, type: a.type, priority: a.priority, category: a.category })) }),
  );

  server.registerTool(
    "chat",
    {
      title: "Chat with memory",
      description: "One turn of the local model with the user's relevant memories and preferences injected as K/V; the turn is recorded in the session.",
      inputSchema: z.strictObject({
        query: text,
        session_id: sessionId.optional(),
        max_tokens: z.number().int().min(1).max(4096).default(128),
        alpha: z.number().min(0).max(1).optional().describe("force α for the routed memories (default: the gate decides)"),
        no_memory: z.boolean().default(false).describe("inject nothing this turn"),
      }),
    },
    async (a, extra) => {
      if (a.alpha !== undefined && a.no_memory) throw new Error("give at most one of alpha and no_memory");
      const r = await system.chat(a.query, { userId, sessionId: a.session_id ?? o.defaultSessionId, maxNewTokens: a.max_tokens, forceAlpha: a.alpha, allowInjection: !a.no_memory, signal: extra.signal });
      return result(chatView(r));
    },
  );

  server.registerResource("memories", MEMORIES_URI, { title: "All memories", description: "Every memory of the user, oldest first", mimeType: "application/json" }, async (uri) =>
    json(uri.href, (await memories.getAll(scope)).map(memoryView)),
  );
  server.registerResource("preferences", PREFERENCES_URI, { title: "Preferences", description: "The user's preferences, active first by priority", mimeType: "application/json" }, async (uri) =>
    json(uri.href, (await system.preferences.list({ userId, includeInactive: true })).map(preferenceView)),
  );
  server.registerResource(
    "memory",
    new ResourceTemplate(MEMORY_URI_TEMPLATE, {
      list: async () => ({ resources: (await memories.getAll(scope)).map((m) => ({ uri: memoryUri(m.id), name: m.text.length > 60 ? `${m.text.slice(0, 59)}…` : m.text, mimeType: "application/json" })) }),
    }),
    { title: "A memory", description: "One memory of the user", mimeType: "application/json" },
    async (uri, vars) => {
      const raw = vars.id;
      const memoryId = decodeURIComponent(Array.isArray(raw) ? (raw[0] ?? "") : (raw ?? ""));
      const m = memoryId === "" ? undefined : await memories.get(memoryId, scope);
      if (m === undefined) throw new Error(`memory ${JSON.stringify(memoryId)} not found`);
      return json(uri.href, memoryView(m));
    },
  );
  return server;
}
