// The web UI of `dki serve` (served at /): chat with streaming, and beside each answer what the
// turn used (memories with relevance, α and tier, the gate's reason, TTFT, the token budget); a
// DKI / RAG / no-memory switch and a side-by-side comparison; memory and preference management.
// It talks to the server's own API only (the same routes as any client), with the API key the
// user enters. Built by esbuild into ui/public/app.js (npm run build:ui).

type Mode = "dki" | "rag" | "none";

interface MemoryInfo {
  id: string;
  text: string;
  relevance: number;
  alpha: number | null;
  tier: string;
}

interface DkiInfo {
  mode: Mode;
  session: string;
  memories: MemoryInfo[];
  preferences_injected: boolean;
  gate: { inject: boolean; alpha: number; reason: string } | null;
  memory_tokens_kv: number;
  memory_tokens_prompt: number;
  budget: { user_tokens: number; memory_tokens: number; tokens_saved: number; attention_ratio: number };
  latency: { ttft_ms: number; server_ttft_ms: number; total_ms: number };
}

interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
}

interface ApiErrorBody {
  error?: { message?: string };
}

const $ = <T extends HTMLElement>(id: string): T => {
  const el = document.getElementById(id);
  if (el === null) throw new Error(`missing #${id}`);
  return el as T;
};

function el<K extends keyof HTMLElementTagNameMap>(tag: K, attrs: Record<string, string> = {}, ...children: (Node | string)[]): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  for (const c of children) e.append(c);
  return e;
}

const state = {
  model: "",
  /** One session per mode, so DKI and RAG turns of a comparison never read each other's history. */
  sessions: { dki: "", rag: "", none: "" } as Record<Mode, string>,
};

function newSessions(): void {
  const stamp = Date.now().toString(36);
  for (const m of ["dki", "rag", "none"] as const) state.sessions[m] = `ui-${stamp}-${m}`;
  $("session").textContent = `ui-${stamp}`;
}

const key = () => ($("api-key") as HTMLInputElement).value.trim();
const user = () => ($("user") as HTMLInputElement).value.trim();

function headers(): Record<string, string> {
  const h: Record<string, string> = { "content-type": "application/json" };
  if (key() !== "") h.authorization = `Bearer ${key()}`;
  return h;
}

function showError(message: string): void {
  const box = $("error");
  box.textContent = message;
  box.hidden = message === "";
}

async function api<T>(method: string, path: string, body?: unknown): Promise<T> {
  const r = await fetch(path, { method, headers: headers(), body: body === undefined ? undefined : JSON.stringify(body) });
  const json = (await r.json()) as T & ApiErrorBody;
  if (!r.ok) throw new Error(json.error?.message ?? `${method} ${path}: ${r.status}`);
  return json;
}

/** Streams one turn; `onText` sees each piece, and it resolves with the last chunk's dki and usage. */
async function streamTurn(query: string, mode: Mode, onText: (t: string) => void): Promise<{ dki: DkiInfo; usage: Usage }> {
  const r = await fetch("/v1/chat/completions", {
    method: "POST",
    headers: headers(),
    body: JSON.stringify({ model: state.model, user: user(), stream: true, max_tokens: Number(($("max-tokens") as HTMLInputElement).value), messages: [{ role: "user", content: query }], dki: { mode, session: state.sessions[mode] } }),
  });
  if (!r.ok || r.body === null) throw new Error(((await r.json()) as ApiErrorBody).error?.message ?? `chat: ${r.status}`);
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  let last: { dki: DkiInfo; usage: Usage } | null = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    for (let i = buf.indexOf("\n\n"); i >= 0; i = buf.indexOf("\n\n")) {
      const data = buf.slice("data: ".length, i);
      buf = buf.slice(i + 2);
      if (data === "[DONE]") continue;
      const chunk = JSON.parse(data) as { error?: { message: string }; choices: { delta: { content?: string } }[]; dki?: DkiInfo; usage?: Usage };
      if (chunk.error) throw new Error(chunk.error.message);
      const t = chunk.choices[0]?.delta.content;
      if (t) onText(t);
      if (chunk.dki && chunk.usage) last = { dki: chunk.dki, usage: chunk.usage };
    }
  }
  if (last === null) throw new Error("the stream ended without the turn's summary");
  return last;
}

/** What a turn used, shown beside its answer. */
function turnPanel(d: DkiInfo, usage: Usage): HTMLElement {
  const panel = el("div", { class: "turn-info", "data-testid": "turn-info" });
  const where = d.mode === "rag" ? "in the prompt as text" : d.mode === "dki" ? "injected as K/V" : "none (memory off)";
  panel.append(el("div", { class: "info-title" }, `Memories ${where}`));
  if (d.memories.length === 0) panel.append(el("div", { class: "muted", "data-testid": "no-memories" }, "no memory used"));
  for (const m of d.memories) {
    const alpha = m.alpha === null ? "—" : m.alpha.toFixed(2);
    panel.append(
      el("div", { class: "memory-used", "data-testid": "memory-used", "data-tier": m.tier }, el("div", { class: "memory-text" }, m.text), el("div", { class: "memory-meta" }, `relevance ${m.relevance.toFixed(2)} · α ${alpha} · ${m.tier === "prompt" ? "prompt" : `tier ${m.tier}`}`)),
    );
  }
  if (d.preferences_injected) panel.append(el("div", { class: "memory-meta", "data-testid": "preferences-used" }, "preferences injected as K/V (before the memories)"));
  if (d.gate) panel.append(el("div", { class: "gate", "data-testid": "gate-reason" }, `gate: ${d.gate.reason}`));
  panel.append(
    el(
      "div",
      { class: "stats", "data-testid": "turn-stats" },
      `TTFT ${d.latency.server_ttft_ms.toFixed(0)} ms · prompt ${usage.prompt_tokens} tokens · memory ${d.mode === "rag" ? `${d.memory_tokens_prompt} tokens as text` : `${d.memory_tokens_kv} tokens as K/V`} · ${usage.completion_tokens} answer tokens · attention ${(d.budget.attention_ratio * 100).toFixed(0)}% of RAG's`,
    ),
  );
  return panel;
}

/** One answer column: streamed text, then its panel. */
async function answerInto(column: HTMLElement, query: string, mode: Mode): Promise<void> {
  const label = { dki: "DKI", rag: "RAG", none: "no memory" }[mode];
  const text = el("div", { class: "answer-text", "data-testid": `answer-${mode}` });
  column.append(el("div", { class: "answer-label" }, label), text);
  try {
    const { dki, usage } = await streamTurn(query, mode, (t) => text.append(t));
    column.append(turnPanel(dki, usage));
  } catch (e) {
    column.append(el("div", { class: "error-inline" }, (e as Error).message));
  }
}

async function ask(query: string): Promise<void> {
  const mode = (document.querySelector("input[name=mode]:checked") as HTMLInputElement).value as Mode;
  const compare = ($("compare") as HTMLInputElement).checked;
  const turn = el("div", { class: "turn", "data-testid": "turn" }, el("div", { class: "question" }, query));
  const answers = el("div", { class: compare ? "answers compare" : "answers" });
  turn.append(answers);
  $("log").append(turn);
  const modes: Mode[] = compare ? ["dki", "rag"] : [mode];
  // One after another: the model takes one turn at a time anyway, and the second sees no load from the first.
  for (const m of modes) {
    const column = el("div", { class: "answer" });
    answers.append(column);
    await answerInto(column, query, m);
  }
  turn.scrollIntoView({ block: "end" });
}

async function refreshMemories(): Promise<void> {
  const list = $("memories");
  list.replaceChildren();
  const { results } = await api<{ results: { id: string; memory: string }[] }>("GET", `/v1/memories?user_id=${encodeURIComponent(user())}`);
  for (const m of results) {
    const del = el("button", { class: "small", title: "delete" }, "✕");
    del.addEventListener("click", () => void run(async () => (await api("DELETE", `/v1/memories/${m.id}?user_id=${encodeURIComponent(user())}`), refreshMemories())));
    list.append(el("li", { "data-testid": "memory-item" }, el("span", {}, m.memory), del));
  }
  if (results.length === 0) list.append(el("li", { class: "muted" }, "no memories"));
}

async function refreshPreferences(): Promise<void> {
  const list = $("preferences");
  list.replaceChildren();
  const { results } = await api<{ results: { id: string; preference: string; type: string }[] }>("GET", `/v1/preferences?user_id=${encodeURIComponent(user())}`);
  for (const p of results) {
    const del = el("button", { class: "small", title: "delete" }, "✕");
    del.addEventListener("click", () => void run(async () => (await api("DELETE", `/v1/preferences/${p.id}?user_id=${encodeURIComponent(user())}`), refreshPreferences())));
    list.append(el("li", { "data-testid": "preference-item" }, el("span", {}, `[${p.type}] ${p.preference}`), del));
  }
  if (results.length === 0) list.append(el("li", { class: "muted" }, "no preferences"));
}

/** Runs an action, showing its error instead of throwing it away. */
async function run(action: () => Promise<unknown>): Promise<void> {
  showError("");
  try {
    await action();
  } catch (e) {
    showError((e as Error).message);
  }
}

async function connect(): Promise<void> {
  localStorage.setItem("dki-ui", JSON.stringify({ key: key(), user: user() }));
  const { data } = await api<{ data: { id: string }[] }>("GET", "/v1/models");
  state.model = data[0].id;
  $("model").textContent = state.model;
  await Promise.all([refreshMemories(), refreshPreferences()]);
}

function start(): void {
  const saved = JSON.parse(localStorage.getItem("dki-ui") ?? "{}") as { key?: string; user?: string };
  if (saved.key) ($("api-key") as HTMLInputElement).value = saved.key;
  if (saved.user) ($("user") as HTMLInputElement).value = saved.user;
  newSessions();
  $("connect").addEventListener("click", () => void run(connect));
  $("new-session").addEventListener("click", () => newSessions());
  $("ask-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const input = $("query") as HTMLInputElement;
    const q = input.value.trim();
    if (q === "") return;
    input.value = "";
    void run(async () => {
      if (state.model === "") await connect();
      await ask(q);
    });
  });
  $("memory-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const input = $("memory-text") as HTMLInputElement;
    const text = input.value.trim();
    if (text === "") return;
    void run(async () => {
      await api("POST", "/v1/memories", { user_id: user(), memory: text });
      input.value = "";
      await refreshMemories();
    });
  });
  $("preference-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = ($("preference-text") as HTMLInputElement).value.trim();
    const type = ($("preference-type") as HTMLInputElement).value.trim() || "general";
    if (text === "") return;
    void run(async () => {
      await api("POST", "/v1/preferences", { user_id: user(), preference: text, type });
      ($("preference-text") as HTMLInputElement).value = "";
      await refreshPreferences();
    });
  });
  void run(connect);
}

start();
