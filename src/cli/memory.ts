// `dki memory`, `dki pref`, `dki user` and `dki stats`: the memory store from the command line. Every
// command opens the store in --data, does one thing and closes it. Output is text, or JSON with
// snake_case keys (--format json); a memory's metadata is printed as it was stored. Index
// rebuilds and re-embedding are reported on stderr, never silently.
import { existsSync, lstatSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline/promises";
import type { Command } from "commander";
import { TieredKVCache, type CacheModel } from "../cache/tiered-cache.js";
import { FolderLockedError } from "../cache/tiers/folder-lock.js";
import { readL3Folder } from "../cache/tiers/l3-files.js";
import { defaultCacheDir } from "../dki/open.js";
import { MemoryStore } from "../memory/memory-store.js";
import type { ImportAs, ImportFormat } from "../memory/import.js";
import type { Filter, Memory, Metadata, Preference } from "../memory/types.js";
import { decodeUtf8, replacementCharacters } from "../util/utf8.js";
import { knowledgeBaseDir, openKnowledgeBase } from "./kb.js";
import { KnowledgeBase } from "../rag/kb/knowledge-base.js";
import { snakeKeys, stderrBar } from "./output.js";
import { choiceOption, EMBEDDER_HELP, embedderOption, intOption, jsonOption, numberOption, snippet } from "./options.js";
import { checkCacheFolder, checkStoreExists } from "./paths.js";

type OutputFormat = "text" | "json";

interface StoreFlags {
  data: string;
  embedder?: string;
  reembed?: boolean;
}

/**
 * Opens the store; a re-embedding shows a progress bar on a terminal, and every index rebuild a
 * line on stderr. Only the commands that add (memory add, import, pref add) may create the store;
 * every other one refuses a folder without one, so a mistyped --data creates nothing.
 */
async function withStore<T>(flags: StoreFlags, mode: "may create" | "must exist", fn: (store: MemoryStore) => Promise<T>): Promise<T> {
  if (mode === "must exist") checkStoreExists(flags.data);
  const embedder = await embedderOption(flags.embedder);
  const bar = stderrBar("re-embedding [{bar}] {value}/{total} memories");
  let started = false;
  const store = await MemoryStore.open({
    dir: flags.data,
    embedder,
    reembed: flags.reembed === true,
    onProgress: (done, total) => {
      if (!started) {
        started = true;
        process.stderr.write(`dki: re-embedding ${total} memories with ${embedder?.id ?? "the hashing embedder"}\n`);
        bar?.start(total, 0);
      }
      bar?.update(done);
      if (done === total) bar?.stop();
    },
    onRebuild: (r) => process.stderr.write(`dki: rebuilt the index of user ${JSON.stringify(r.scope)} (${r.reason}: ${r.detail}): ${r.documents} memories in ${r.ms.toFixed(0)} ms\n`),
  });
  try {
    return await fn(store);
  } finally {
    await store.close();
  }
}

function memoryJson(m: Memory): Record<string, unknown> {
  return { id: m.id, user_id: m.userId, session_id: m.sessionId ?? null, text: m.text, metadata: m.metadata, created_at: m.createdAt, updated_at: m.updatedAt };
}

function preferenceJson(p: Preference): Record<string, unknown> {
  return { id: p.id, user_id: p.userId, text: p.text, type: p.type, priority: p.priority, category: p.category ?? null, active: p.active, created_at: p.createdAt, updated_at: p.updatedAt };
}

function print(format: OutputFormat, json: unknown, text: string): void {
  process.stdout.write(format === "json" ? `${JSON.stringify(json)}\n` : text.endsWith("\n") || text === "" ? text : `${text}\n`);
}

const oneLine = (s: string) => s.replace(/\s+/g, " ");

/**
 * The K/V cache folder of erase and stats: --cache (which must exist), else `<data>.kv-cache`
 * (where `dki chat` keeps it) when it exists; refused when it is not a cache folder.
 */
async function cacheFolder(data: string, cache?: string): Promise<string | undefined> {
  if (cache !== undefined && !existsSync(cache)) throw new Error(`--cache ${cache}: no such folder`);
  const beside = defaultCacheDir(data);
  const folder = cache ?? (existsSync(beside) ? beside : undefined);
  if (folder !== undefined) await checkCacheFolder(folder, cache === undefined ? "the K/V cache folder" : "--cache");
  return folder;
}

/**
 * Erasing needs the cache open but no model: clear() only deletes. This stands in for the model
 * and refuses to compute, so nothing can be added to the cache on the way.
 */
const ERASE_ONLY_MODEL: CacheModel = {
  info: { fingerprint: "dki-user-erase", device: "cpu" },
  nativeHandle() {
    throw new Error("dki user erase opens the K/V cache only to delete from it");
  },
  computeBlock() {
    return Promise.reject(new Error("dki user erase opens the K/V cache only to delete from it"));
  },
};

export function registerMemoryCommands(program: Command): void {
  const store = (c: Command) =>
    c
      .requiredOption("--data <dir>", "the memory store's folder")
      .option("--embedder <dir>", EMBEDDER_HELP)
      .option("--reembed", "if the store's vectors came from another embedder, re-embed them all (else that is refused)");
  const scoped = (c: Command) => store(c).requiredOption("--user <id>", "the user whose records these are");
  const output = (c: Command) => c.option("--format <format>", "text or json", choiceOption("--format", ["text", "json"] as const), "text");

  const memory = program.command("memory").description("a user's memories: add, list, search, get, rm, history, and import conversation datasets");
  output(scoped(memory.command("add <text>").description("add one memory (TEXT -: read it from stdin)")))
    .option("--session <id>", "session the memory belongs to")
    .option("--metadata <json>", "a JSON object stored with the memory")
    .action((arg: string, f: StoreFlags & { user: string; session?: string; metadata?: string; format: OutputFormat }) =>
      withStore(f, "may create", async (s) => {
        const metadata = f.metadata === undefined ? undefined : (jsonOption("--metadata", f.metadata) as Metadata);
        const text = await memoryText(arg);
        const [m] = await s.memories.add(text, { userId: f.user, sessionId: f.session, metadata });
        print(f.format, memoryJson(m), `added ${m.id}`);
      }),
    );
  output(scoped(memory.command("list").description("list a user's memories, oldest first")))
    .option("--session <id>", "only this session's")
    .option("--filter <json>", 'metadata filter: {"eq": {...}}, {"in": {...}}, {"and": [...]}, {"or": [...]}')
    .action((f: StoreFlags & { user: string; session?: string; filter?: string; format: OutputFormat }) =>
      withStore(f, "must exist", async (s) => {
        const filter = f.filter === undefined ? undefined : (jsonOption("--filter", f.filter) as Filter);
        const all = await s.memories.getAll({ userId: f.user, sessionId: f.session, filter });
        print(f.format, { memories: all.map(memoryJson) }, all.length === 0 ? "(no memories)" : all.map((m) => `${m.id}\t${oneLine(m.text)}`).join("\n"));
      }),
    );
  output(scoped(memory.command("search <query>").description("hybrid search (dense + BM25, fused) of a user's memories")))
    .option("--session <id>", "only this session's")
    .option("--filter <json>", "metadata filter (as for list)")
    .option("--limit <n>", "results (default 5)", intOption("--limit", 1, 1000), 5)
    .option("--min-score <x>", "leave out results with a lower fused score", numberOption("--min-score", { min: 0, max: 1 }))
    .option("--fusion <method>", "rrf or weighted", choiceOption("--fusion", ["rrf", "weighted"] as const), "rrf")
    .action((query: string, f: StoreFlags & { user: string; session?: string; filter?: string; limit: number; minScore?: number; fusion: "rrf" | "weighted"; format: OutputFormat }) =>
      withStore(f, "must exist", async (s) => {
        const filter = f.filter === undefined ? undefined : (jsonOption("--filter", f.filter) as Filter);
        const results = await s.memories.search(query, { userId: f.user, sessionId: f.session, filter, limit: f.limit, minScore: f.minScore, fusion: { method: f.fusion } });
        print(
          f.format,
          { results: results.map((r) => ({ id: r.memory.id, text: r.memory.text, score: r.score, signals: r.signals, metadata: r.memory.metadata })) },
          // Relevance is the cosine of query and memory (what DKI's gate reads); the fused score only ranks.
          results.length === 0 ? "(no results)" : results.map((r, i) => `[${i + 1}] relevance ${r.signals.dense.toFixed(3)}  ${r.memory.id}  ${snippet(r.memory.text, 120)}`).join("\n"),
        );
      }),
    );
  output(scoped(memory.command("get <id>").description("one memory"))).action((id: string, f: StoreFlags & { user: string; format: OutputFormat }) =>
    withStore(f, "must exist", async (s) => {
      const m = await s.memories.get(id, { userId: f.user });
      if (m === undefined) throw new Error(`memory ${JSON.stringify(id)} not found for user ${JSON.stringify(f.user)}`);
      print(f.format, memoryJson(m), `${m.id}${m.sessionId === undefined ? "" : ` (session ${m.sessionId})`}\n${m.text}\nmetadata ${JSON.stringify(m.metadata)}`);
    }),
  );
  output(scoped(memory.command("rm <id>").description("delete one memory"))).action((id: string, f: StoreFlags & { user: string; format: OutputFormat }) =>
    withStore(f, "must exist", async (s) => {
      await s.memories.delete(id, { userId: f.user });
      print(f.format, { removed: id }, `removed ${id}`);
    }),
  );
  output(scoped(memory.command("history <id>").description("a memory's audit trail: added, updated, deleted"))).action((id: string, f: StoreFlags & { user: string; format: OutputFormat }) =>
    withStore(f, "must exist", async (s) => {
      const h = await s.memories.history(id, { userId: f.user });
      print(
        f.format,
        { history: h.map((e) => ({ id: e.id, at: e.at, action: e.action, metadata: e.metadata })) },
        h.length === 0 ? "(no history)" : h.map((e) => `${new Date(e.at).toISOString()} ${e.action}`).join("\n"),
      );
    }),
  );
  store(memory.command("import <file>").description("import a LoCoMo or LongMemEval file: one user per conversation, one memory (or history message) per turn; prints a JSON summary"))
    .option("--format <format>", "the file's format: locomo, longmemeval or auto", choiceOption("--format", ["locomo", "longmemeval", "auto"] as const), "auto")
    .option("--as <what>", "memories (one per turn) or history (the user's conversation sessions, which recall searches)", choiceOption("--as", ["memories", "history"] as const), "memories")
    .action((file: string, f: StoreFlags & { format: ImportFormat; as: ImportAs }) =>
      withStore(f, "may create", async (s) => {
        const bar = stderrBar("importing [{bar}] {value}/{total} conversations");
        const r = await s.importConversations(file, {
          format: f.format,
          as: f.as,
          onProgress: (done, total) => (done === 0 ? bar?.start(total, 0) : bar?.update(done)),
        });
        bar?.stop();
        if (r.invalidUtf8 > 0) warnInvalidUtf8(file, r.invalidUtf8);
        const users = r.users.map((u) => ({ user_id: u.userId, ...(r.as === "memories" ? { memories: u.memories } : { messages: u.messages }) }));
        print("json", { format: r.format, as: r.as, users, ...(r.as === "memories" ? { memories: r.memories } : { messages: r.messages }), invalid_utf8: r.invalidUtf8 }, "");
      }),
    );

  const pref = program.command("pref").description("a user's preferences: add, list, rm");
  output(scoped(pref.command("add <text>").description("add a preference")))
    .requiredOption("--type <type>", "kind of preference (dietary, allergy, style, …)")
    .option("--priority <n>", "higher comes first (default 0)", intOption("--priority", -1_000_000, 1_000_000), 0)
    .option("--category <c>", "category")
    .action((text: string, f: StoreFlags & { user: string; type: string; priority: number; category?: string; format: OutputFormat }) =>
      withStore(f, "may create", async (s) => {
        const p = await s.preferences.add(text, { userId: f.user, type: f.type, priority: f.priority, category: f.category });
        print(f.format, preferenceJson(p), `added ${p.id}`);
      }),
    );
  output(scoped(pref.command("list").description("a user's preferences, highest priority first")))
    .option("--all", "include inactive ones")
    .action((f: StoreFlags & { user: string; all?: boolean; format: OutputFormat }) =>
      withStore(f, "must exist", async (s) => {
        const list = await s.preferences.list({ userId: f.user, includeInactive: f.all === true });
        print(f.format, { preferences: list.map(preferenceJson) }, list.length === 0 ? "(no preferences)" : list.map((p) => `${p.id}\t${p.priority}\t${p.type}\t${oneLine(p.text)}${p.active ? "" : "\t(inactive)"}`).join("\n"));
      }),
    );
  output(scoped(pref.command("rm <id>").description("delete a preference"))).action((id: string, f: StoreFlags & { user: string; format: OutputFormat }) =>
    withStore(f, "must exist", async (s) => {
      await s.preferences.delete(id, { userId: f.user });
      print(f.format, { removed: id }, `removed ${id}`);
    }),
  );

  const user = program.command("user").description("users: list, erase");
  output(store(user.command("list").description("the users with any record, sorted"))).action((f: StoreFlags & { format: OutputFormat }) =>
    withStore(f, "must exist", async (s) => {
      const users = s.listUsers();
      print(f.format, { users }, users.length === 0 ? "(no users)" : users.join("\n"));
    }),
  );
  output(
    store(user.command("erase <user>").description("erase every record of a user: memories, preferences, conversations, audit entries, index files, cached K/V and the knowledge-base collections the user owns alone"))
      .option("--cache <dir>", "the K/V cache folder to clear too (default <data>.kv-cache when it exists)")
      .option("-y, --yes", "erase without asking (needed when stdin is not a terminal)"),
  ).action(async (userId: string, f: StoreFlags & { cache?: string; yes?: boolean; format: OutputFormat }) => {
    checkStoreExists(f.data);
    const folder = await cacheFolder(f.data, f.cache);
    // The collections the user owns alone are the user's data too, as `DELETE /v1/users/:id` removes them.
    const kbDir = KnowledgeBase.exists(knowledgeBaseDir(f.data)) ? knowledgeBaseDir(f.data) : undefined;
    const also = [folder === undefined ? "" : `its K/V in ${folder}`, kbDir === undefined ? "" : `the collections it owns in ${kbDir}`].filter((x) => x !== "").join(" and ");
    // Asked before the store opens, so a question left unanswered holds no lock.
    if (!(await confirmed(`erase every record of user ${JSON.stringify(userId)} in ${f.data}${also === "" ? "" : ` and ${also}`}? This cannot be undone. [y/N] `, f.yes === true))) {
      throw new Error("not confirmed: nothing erased");
    }
    await withStore(f, "must exist", async (s) => {
      const cache =
        folder === undefined
          ? undefined
          : await TieredKVCache.open({ model: ERASE_ONLY_MODEL, dir: folder, budgets: { l1Bytes: 0, l2Bytes: 0, l3Bytes: Number.MAX_SAFE_INTEGER } }).catch((e: unknown) => {
              // A running chat or server holds the cache; a server can erase the user itself, its L1/L2 blocks included.
              if (e instanceof FolderLockedError) throw new Error(`${e.message}; if a dki serve owns this store, erase through it: DELETE /v1/users/${encodeURIComponent(userId)}`);
              throw e;
            });
      try {
        const r = await s.eraseUser(userId, { cache });
        let collections: string[] = [];
        if (kbDir !== undefined) {
          // Removing reads no vectors: the default embedder opens any knowledge base for it.
          const kb = await openKnowledgeBase(f.data, { mustExist: true });
          try {
            collections = await kb.removeCollectionsOwnedBy(userId);
          } finally {
            await kb.close();
          }
        }
        print(
          f.format,
          { user_id: userId, memories: r.memories, preferences: r.preferences, turns: r.turns, audit_entries: r.auditEntries, cache_cleared: r.cacheCleared, cache: folder ?? null, collections },
          `erased ${userId}: ${r.memories} memories, ${r.preferences} preferences, ${r.turns} conversation turns, ${r.auditEntries} audit entries${folder === undefined ? "; no K/V cache folder" : `; K/V cleared from ${folder}`}` +
            (kbDir === undefined ? "" : `; ${collections.length} knowledge-base collection${collections.length === 1 ? "" : "s"} removed${collections.length === 0 ? "" : ` (${collections.join(", ")})`}`),
        );
      } finally {
        await cache?.close();
      }
    });
  });

  output(
    store(program.command("stats").description("what a store holds and what its files take on disk: users, memories, sessions; store, index, knowledge base and K/V cache")).option(
      "--cache <dir>",
      "the K/V cache folder (default <data>.kv-cache when it exists)",
    ),
  ).action((f: StoreFlags & { cache?: string; format: OutputFormat }) => storeStats(f));
}

/** The text of `memory add`: the argument, or stdin for "-"; characters that were not UTF-8 are warned about. */
async function memoryText(arg: string): Promise<string> {
  if (arg !== "-") {
    const n = replacementCharacters(arg);
    if (n > 0) process.stderr.write(`dki: warning: the text argument holds ${n} U+FFFD replacement character${n === 1 ? "" : "s"} (bytes that were not UTF-8?); stored as given\n`);
    return arg;
  }
  if (process.stdin.isTTY) process.stderr.write("dki: reading the memory's text from the terminal; end it with Ctrl-D\n");
  const chunks: Buffer[] = [];
  for await (const c of process.stdin) chunks.push(c as Buffer);
  const { text, replaced } = decodeUtf8(Buffer.concat(chunks));
  if (replaced > 0) warnInvalidUtf8("stdin", replaced);
  // `echo TEXT |` ends with a newline that is no part of the memory.
  return text.replace(/\r?\n$/, "");
}

function warnInvalidUtf8(source: string, n: number): void {
  process.stderr.write(`dki: warning: ${source}: ${n} character${n === 1 ? " was" : "s were"} not UTF-8 and ${n === 1 ? "is" : "are"} stored as U+FFFD\n`);
}

/** true with --yes; else asks on a terminal (y or yes); with stdin not a terminal, refuses: a script must say --yes. */
async function confirmed(question: string, yes: boolean): Promise<boolean> {
  if (yes) return true;
  if (!process.stdin.isTTY) throw new Error("erasing cannot be undone: give --yes to confirm (stdin is not a terminal to ask on)");
  const rl = createInterface({ input: process.stdin, output: process.stderr });
  try {
    return /^y(es)?$/i.test((await rl.question(question)).trim());
  } finally {
    rl.close();
  }
}

/** Bytes a file or folder takes on disk (allocated blocks, as du counts them); 0 when missing. */
function diskBytes(path: string): number {
  let st;
  try {
    st = lstatSync(path);
  } catch {
    return 0;
  }
  if (!st.isDirectory()) return st.blocks * 512;
  return readdirSync(path).reduce((n, name) => n + diskBytes(join(path, name)), st.blocks * 512);
}

const mib = (bytes: number) => `${(bytes / 2 ** 20).toFixed(1)} MiB`;

/** `dki stats`: counts from the store, disk use of its files and of the knowledge base and K/V cache beside it, and the cache's L3 entries. */
async function storeStats(f: StoreFlags & { cache?: string; format: OutputFormat }): Promise<void> {
  checkStoreExists(f.data);
  const folder = await cacheFolder(f.data, f.cache);
  await withStore(f, "must exist", async (s) => {
    const st = s.stats();
    const kbDir = knowledgeBaseDir(f.data);
    const l3 = folder === undefined ? null : (await readL3Folder(folder)).entries;
    const stats = {
      users: st.users,
      memories: st.memories,
      preferences: st.preferences,
      sessions: s.sessionCount(),
      turns: st.turns,
      embedder: st.embedder,
      disk: { store: diskBytes(s.paths.storeFile), index: diskBytes(s.paths.indexDir), knowledgeBase: existsSync(kbDir) ? diskBytes(kbDir) : null, cache: folder === undefined ? null : diskBytes(folder) },
      // L1 and L2 live in the memory of the process that runs the turns; a folder has only L3.
      cache: l3 === null ? null : { dir: folder, l3Entries: l3.length, l3Bytes: l3.reduce((n, e) => n + e.bytes, 0), l3Users: new Set(l3.map((e) => e.userHash)).size },
    };
    const d = stats.disk;
    print(
      f.format,
      snakeKeys(stats),
      [
        `users ${stats.users}, memories ${stats.memories}, preferences ${stats.preferences}, sessions ${stats.sessions}, conversation turns ${stats.turns} (embedder ${st.embedder.id})`,
        `disk: store ${mib(d.store)}, index ${mib(d.index)}, knowledge base ${d.knowledgeBase === null ? "none" : mib(d.knowledgeBase)}, K/V cache ${d.cache === null ? "none" : mib(d.cache)}`,
        stats.cache === null ? "K/V cache: no folder" : `K/V cache ${stats.cache.dir}: L3 ${stats.cache.l3Entries} blocks, ${mib(stats.cache.l3Bytes)}, ${stats.cache.l3Users} users (L1 and L2 live in a running process's memory)`,
      ].join("\n"),
    );
  });
}
