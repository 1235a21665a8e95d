// ui/src/app.ts
var $ = (id) => {
  const el2 = document.getElementById(id);
  if (el2 === null) throw new Error(`missing #${id}`);
  return el2;
};
function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  for (const c of children) e.append(c);
  return e;
}
var state = {
  model: "",
  /** One session per mode, so DKI and RAG turns of a comparison never read each other's history. */
  sessions: { dki: "", rag: "", none: "" }
};
function newSessions() {
  const stamp = Date.now().toString(36);
  for (const m of ["dki", "rag", "none"]) state.sessions[m] = `ui-${stamp}-${m}`;
  $("session").textContent = `ui-${stamp}`;
}
var key = () => $("api-key").value.trim();
var user = () => $("user").value.trim();
function headers() {
  const h = { "content-type": "application/json" };
  if (key() !== "") h.authorization = `Bearer ${key()}`;
  return h;
}
function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = message === "";
}
async function api(method, path, body) {
  const r = await fetch(path, { method, headers: headers(), body: body === void 0 ? void 0 : JSON.stringify(body) });
  const json = await r.json();
  if (!r.ok) throw new Error(json.error?.message ?? `${method} ${path}: ${r.status}`);
  return json;
}
async function streamTurn(query, mode, onText) {
  const r = await fetch("/v1/chat/completions", {
    method: "POST",
    headers: headers(),
    body: JSON.stringify({ model: state.model, user: user(), stream: true, max_tokens: Number($("max-tokens").value), messages: [{ role: "user", content: query }], dki: { mode, session: state.sessions[mode] } })
  });
  if (!r.ok || r.body === null) throw new Error((await r.json()).error?.message ?? `chat: ${r.status}`);
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  let last = null;
  for (; ; ) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    for (let i = buf.indexOf("\n\n"); i >= 0; i = buf.indexOf("\n\n")) {
      const data = buf.slice("data: ".length, i);
      buf = buf.slice(i + 2);
      if (data === "[DONE]") continue;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      const t = chunk.choices[0]?.delta.content;
      if (t) onText(t);
      if (chunk.dki && chunk.usage) last = { dki: chunk.dki, usage: chunk.usage };
    }
  }
  if (last === null) throw new Error("the stream ended without the turn's summary");
  return last;
}
function turnPanel(d, usage) {
  const panel = el("div", { class: "turn-info", "data-testid": "turn-info" });
  const where = d.mode === "rag" ? "in the prompt as text" : d.mode === "dki" ? "injected as K/V" : "none (memory off)";
  panel.append(el("div", { class: "info-title" }, `Memories ${where}`));
  if (d.memories.length === 0) panel.append(el("div", { class: "muted", "data-testid": "no-memories" }, "no memory used"));
  for (const m of d.memories) {
    const alpha = m.alpha === null ? "\u2014" : m.alpha.toFixed(2);
    panel.append(
      el("div", { class: "memory-used", "data-testid": "memory-used", "data-tier": m.tier }, el("div", { class: "memory-text" }, m.text), el("div", { class: "memory-meta" }, `relevance ${m.relevance.toFixed(2)} \xB7 \u03B1 ${alpha} \xB7 ${m.tier === "prompt" ? "prompt" : `tier ${m.tier}`}`))
    );
  }
  if (d.preferences_injected) panel.append(el("div", { class: "memory-meta", "data-testid": "preferences-used" }, "preferences injected as K/V (before the memories)"));
  if (d.gate) panel.append(el("div", { class: "gate", "data-testid": "gate-reason" }, `gate: ${d.gate.reason}`));
  panel.append(
    el(
      "div",
      { class: "stats", "data-testid": "turn-stats" },
      `TTFT ${d.latency.server_ttft_ms.toFixed(0)} ms \xB7 prompt ${usage.prompt_tokens} tokens \xB7 memory ${d.mode === "rag" ? `${d.memory_tokens_prompt} tokens as text` : `${d.memory_tokens_kv} tokens as K/V`} \xB7 ${usage.completion_tokens} answer tokens \xB7 attention ${(d.budget.attention_ratio * 100).toFixed(0)}% of RAG's`
    )
  );
  return panel;
}
async function answerInto(column, query, mode) {
  const label = { dki: "DKI", rag: "RAG", none: "no memory" }[mode];
  const text = el("div", { class: "answer-text", "data-testid": `answer-${mode}` });
  column.append(el("div", { class: "answer-label" }, label), text);
  try {
    const { dki, usage } = await streamTurn(query, mode, (t) => text.append(t));
    column.append(turnPanel(dki, usage));
  } catch (e) {
    column.append(el("div", { class: "error-inline" }, e.message));
  }
}
async function ask(query) {
  const mode = document.querySelector("input[name=mode]:checked").value;
  const compare = $("compare").checked;
  const turn = el("div", { class: "turn", "data-testid": "turn" }, el("div", { class: "question" }, query));
  const answers = el("div", { class: compare ? "answers compare" : "answers" });
  turn.append(answers);
  $("log").append(turn);
  const modes = compare ? ["dki", "rag"] : [mode];
  for (const m of modes) {
    const column = el("div", { class: "answer" });
    answers.append(column);
    await answerInto(column, query, m);
  }
  turn.scrollIntoView({ block: "end" });
}
async function refreshMemories() {
  const list = $("memories");
  list.replaceChildren();
  const { results } = await api("GET", `/v1/memories?user_id=${encodeURIComponent(user())}`);
  for (const m of results) {
    const del = el("button", { class: "small", title: "delete" }, "\u2715");
    del.addEventListener("click", () => void run(async () => (await api("DELETE", `/v1/memories/${m.id}?user_id=${encodeURIComponent(user())}`), refreshMemories())));
    list.append(el("li", { "data-testid": "memory-item" }, el("span", {}, m.memory), del));
  }
  if (results.length === 0) list.append(el("li", { class: "muted" }, "no memories"));
}
async function refreshPreferences() {
  const list = $("preferences");
  list.replaceChildren();
  const { results } = await api("GET", `/v1/preferences?user_id=${encodeURIComponent(user())}`);
  for (const p of results) {
    const del = el("button", { class: "small", title: "delete" }, "\u2715");
    del.addEventListener("click", () => void run(async () => (await api("DELETE", `/v1/preferences/${p.id}?user_id=${encodeURIComponent(user())}`), refreshPreferences())));
    list.append(el("li", { "data-testid": "preference-item" }, el("span", {}, `[${p.type}] ${p.preference}`), del));
  }
  if (results.length === 0) list.append(el("li", { class: "muted" }, "no preferences"));
}
async function run(action) {
  showError("");
  try {
    await action();
  } catch (e) {
    showError(e.message);
  }
}
async function connect() {
  localStorage.setItem("dki-ui", JSON.stringify({ key: key(), user: user() }));
  const { data } = await api("GET", "/v1/models");
  state.model = data[0].id;
  $("model").textContent = state.model;
  await Promise.all([refreshMemories(), refreshPreferences()]);
}
function start() {
  const saved = JSON.parse(localStorage.getItem("dki-ui") ?? "{}");
  if (saved.key) $("api-key").value = saved.key;
  if (saved.user) $("user").value = saved.user;
  newSessions();
  $("connect").addEventListener("click", () => void run(connect));
  $("new-session").addEventListener("click", () => newSessions());
  $("ask-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const input = $("query");
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
    const input = $("memory-text");
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
    const text = $("preference-text").value.trim();
    const type = $("preference-type").value.trim() || "general";
    if (text === "") return;
    void run(async () => {
      await api("POST", "/v1/preferences", { user_id: user(), preference: text, type });
      $("preference-text").value = "";
      await refreshPreferences();
    });
  });
  void run(connect);
}
start();
