// The tokenizer on the real SmolLM2-135M-Instruct tokenizer.json (byte-level BPE), the stream
// detokenizer, and chat templates.
import { spawn, spawnSync } from "node:child_process";
import { copyFileSync, readdirSync, readFileSync, truncateSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { beforeAll, describe, expect, test } from "vitest";
import { packageRoot } from "../src/engine/native.js";
import { FormatError } from "../src/errors.js";
import { readHfFolder } from "../src/formats/hf-folder.js";
import { MAX_JSON_FILE_BYTES } from "../src/formats/json-file.js";
import { renderChat, renderChatAsync, selectChatTemplate, type ChatMessage } from "../src/tokenizer/chat-template.js";
import { Tokenizer } from "../src/tokenizer/tokenizer.js";
import { fixtures, hfLlamaTiny, smollm2Tokenizer, tempDir } from "./support/paths.js";

const smolJson = join(smollm2Tokenizer, "tokenizer.json");
const minilmDir = join(fixtures, "minilm-tokenizer"); // the all-MiniLM-L6-v2 tokenizer files (see its README)

// ---------------------------------------------------------------------------------------------
// An independent, minimal byte-level BPE (GPT-2 style) over the same tokenizer.json, to derive
// expected ids from the vocabulary and merges rather than from the library under test.
const smol = JSON.parse(readFileSync(smolJson, "utf8")) as { model: { vocab: Record<string, number>; merges: (string | [string, string])[] } };
const vocab = smol.model.vocab;
const mergeRank = new Map<string, number>(smol.model.merges.map((m, i) => [Array.isArray(m) ? m.join(" ") : m, i]));
const byteToChar: string[] = (() => {
  const printable = (b: number) => (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  const out: string[] = [];
  let n = 0;
  for (let b = 0; b < 256; b++) out[b] = String.fromCodePoint(printable(b) ? b : 256 + n++);
  return out;
})();
const GPT2_SPLIT = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;

function bpeWord(word: string): number[] {
  let parts = [...Buffer.from(word, "utf8")].map((b) => byteToChar[b]);
  for (;;) {
    let best = -1, bestRank = Infinity;
    for (let i = 0; i + 1 < parts.length; i++) {
      const r = mergeRank.get(parts[i] + " " + parts[i + 1]);
      if (r !== undefined && r < bestRank) { bestRank = r; best = i; }
    }
    if (best < 0) break;
    parts = [...parts.slice(0, best), parts[best] + parts[best + 1], ...parts.slice(best + 2)];
  }
  return parts.map((p) => {
    const id = vocab[p];
    if (id === undefined) throw new Error(`no vocab entry for ${p}`);
    return id;
  });
}

/** SmolLM2's pre-tokenizer: every digit on its own (Digits, individual_digits), then the GPT-2 regex. */
function referenceEncode(text: string): number[] {
  const pieces = text.split(/(\p{N})/u).filter((s) => s.length > 0);
  return pieces.flatMap((p) => (p.match(GPT2_SPLIT) ?? []).flatMap(bpeWord));
}

// ---------------------------------------------------------------------------------------------

let tok: Tokenizer;
beforeAll(async () => {
  tok = await Tokenizer.fromFile(smolJson);
});

const SAMPLES = [
  "Hello world",
  "The quick brown fox jumps over the lazy dog. It's 2024, isn't it?",
  "  leading and trailing spaces  \n\tand\ttabs\n\n",
  "你好，世界！今天天气很好。",
  "😀 emoji 👍🏽 family: 👨‍👩‍👧‍👦 flags 🇫🇷",
  "Mixed: café naïve Ω≈ç√ — 東京 and عربى and 12345.678 ¯\\_(ツ)_/¯",
  "code: for (let i = 0; i < n; i++) { x += a[i] * b[i]; }",
];

describe("SmolLM2 tokenizer", () => {
  test("Hello world → Hello, Ġworld", () => {
    expect(tok.encode("Hello world", { addSpecialTokens: false })).toEqual([vocab["Hello"], vocab["Ġworld"]]);
    expect(tok.encode("Hello world")).toEqual([19556, 905]); // no BOS: SmolLM2 has no post-processor
    expect(tok.idToToken(905)).toBe("Ġworld");
    expect(tok.tokenToId("Hello")).toBe(19556);
    expect(tok.tokenToId("no-such-token-xyz")).toBeUndefined();
  });

  test.each(SAMPLES)("encoding equals an independent byte-level BPE: %j", (text) => {
    expect(tok.encode(text, { addSpecialTokens: false })).toEqual(referenceEncode(text));
  });

  test("digits are split one by one", () => {
    expect(tok.encode("2024")).toEqual(["2", "0", "2", "4"].map((d) => vocab[d]));
  });

  test("special tokens", () => {
    expect(tok.tokenToId("<|endoftext|>")).toBe(0);
    expect(tok.tokenToId("<|im_start|>")).toBe(1);
    expect(tok.tokenToId("<|im_end|>")).toBe(2);
    expect(tok.encode("<|im_start|>user\nHi<|im_end|>")).toEqual([1, ...referenceEncode("user\nHi"), 2]);
    expect(tok.specialIds).toContain(0);
    expect(tok.specialIds).toContain(1);
    expect(tok.specialIds).toContain(2);
    expect(tok.isSpecial(2)).toBe(true);
    expect(tok.isSpecial(905)).toBe(false);
    expect(tok.vocabSize).toBe(49152);
    // bare tokenizer.json: no config names BOS/EOS; the family's end tokens are recognised
    expect(tok.bosId).toBeNull();
    expect(tok.eosIds).toEqual([2, 0]);
  });

  test("decode with and without special tokens", () => {
    const ids = [1, ...tok.encode("user\nHi", { addSpecialTokens: false }), 2];
    expect(tok.decode(ids)).toBe("<|im_start|>user\nHi<|im_end|>");
    expect(tok.decode(ids, { skipSpecialTokens: true })).toBe("user\nHi");
    expect(tok.decode([])).toBe("");
    expect(tok.decode([1, 2], { skipSpecialTokens: true })).toBe("");
    expect(() => tok.decode([49152])).toThrow(/not in the tokenizer's vocabulary/);
    expect(() => tok.decode([-1])).toThrow();
    expect(() => tok.decode([1.5])).toThrow();
  });

  test.each(SAMPLES)("decode(encode(x)) == x: %j", (text) => {
    expect(tok.decode(tok.encode(text))).toBe(text);
  });

  test("no clean-up of spaces: decode keeps \" ,\" and \" n't\"", () => {
    const text = "a , b . c n't d 's";
    expect(tok.decode(tok.encode(text))).toBe(text);
  });
});

describe("stream decoder", () => {
  const streamed = (ids: number[], opts?: Parameters<Tokenizer["createStreamDecoder"]>[0]) => {
    const d = tok.createStreamDecoder(opts);
    const parts = ids.map((id) => d.push(id));
    return { parts, tail: d.flush() };
  };

  test.each(SAMPLES)("concatenation equals the full decode, token by token: %j", (text) => {
    const ids = tok.encode(text);
    const { parts, tail } = streamed(ids);
    expect(parts.join("") + tail).toBe(tok.decode(ids));
    for (const p of parts) expect(p).not.toContain("\uFFFD"); // never half a character
  });

  test("a character split over tokens comes out whole, once complete", () => {
    const ids = tok.encode("你好");
    expect(ids.length).toBeGreaterThan(2); // 你 and 好 each span two byte-level tokens here
    const { parts, tail } = streamed(ids);
    expect(parts.filter((p) => p !== "")).toEqual(["你", "好"]);
    expect(tail).toBe("");
    const emoji = tok.encode("👍🏽!");
    const s = streamed(emoji);
    expect(s.parts.filter((p) => p !== "")).toEqual(["👍", "🏽", "!"]);
  });

  test("flush returns bytes held back at the end (an incomplete character)", () => {
    const ids = tok.encode("ok 你");
    const { parts, tail } = streamed(ids.slice(0, -1));
    expect(parts.join("")).toBe("ok ");
    expect(tail).toBe("\uFFFD");
  });

  test("special tokens stream too, or are skipped", () => {
    const ids = [1, ...tok.encode("assistant\n你好"), 2];
    expect(streamed(ids).parts.join("")).toBe("<|im_start|>assistant\n你好<|im_end|>");
    expect(streamed(ids, { skipSpecialTokens: true }).parts.join("")).toBe("assistant\n你好");
  });

  test("context ids are not emitted", () => {
    const ctx = tok.encode("Hello");
    const ids = tok.encode(" world 世界");
    const { parts, tail } = streamed(ids, { context: ctx });
    expect(parts.join("") + tail).toBe(" world 世界");
  });

  test("a context ending in a real U+FFFD emits none of it; one ending inside a character emits that character whole", () => {
    const real = streamed(tok.encode("😀 ok", { addSpecialTokens: false }), { context: tok.encode("x \uFFFD", { addSpecialTokens: false }) });
    expect(real.parts.join("") + real.tail).toBe("😀 ok");
    const ids = tok.encode("x 你 ok", { addSpecialTokens: false });
    const cut = ids.findIndex((_, i) => tok.decode(ids.slice(0, i + 1)).endsWith("\uFFFD")) + 1; // inside 你
    const split = streamed(ids.slice(cut), { context: ids.slice(0, cut) });
    expect(split.parts.join("") + split.tail).toBe("你 ok");
  });
});

describe("stream decoder on a SentencePiece-style tokenizer (byte fallback, leading-space strip)", () => {
  // The Llama 2 tokenizer.json layout: "▁" for spaces, <0xNN> byte tokens, a decoder that drops
  // the leading space of a text.
  let sp: Tokenizer;
  beforeAll(async () => {
    const dir = tempDir();
    const vocab: Record<string, number> = { "<unk>": 0, "<s>": 1, "</s>": 2 };
    for (let b = 0; b < 256; b++) vocab[`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`] = 3 + b;
    for (const t of ["▁", "▁Hello", "▁world", "H", "e", "l", "o", "w", "r", "d"]) vocab[t] = Object.keys(vocab).length;
    const json = {
      version: "1.0",
      added_tokens: [
        { id: 0, content: "<unk>", single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
        { id: 1, content: "<s>", single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
        { id: 2, content: "</s>", single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
      ],
      normalizer: { type: "Sequence", normalizers: [{ type: "Prepend", prepend: "▁" }, { type: "Replace", pattern: { String: " " }, content: "▁" }] },
      pre_tokenizer: null,
      post_processor: null,
      decoder: {
        type: "Sequence",
        decoders: [
          { type: "Replace", pattern: { String: "▁" }, content: " " },
          { type: "ByteFallback" },
          { type: "Fuse" },
          { type: "Strip", content: " ", start: 1, stop: 0 },
        ],
      },
      model: { type: "BPE", dropout: null, unk_token: "<unk>", continuing_subword_prefix: null, end_of_word_suffix: null, fuse_unk: true, byte_fallback: true, ignore_merges: false, vocab, merges: [] },
    };
    writeFileSync(join(dir, "tokenizer.json"), JSON.stringify(json));
    sp = await Tokenizer.fromFile(join(dir, "tokenizer.json"));
  });

  test("whole characters from byte tokens; the first token loses its space, later ones keep it", () => {
    const id = (t: string) => sp.tokenToId(t)!;
    const ids = [id("▁Hello"), id("▁world"), id("▁"), id("<0xE4>"), id("<0xBD>"), id("<0xA0>"), id("▁world")];
    expect(sp.decode(ids)).toBe("Hello world 你 world");
    const d = sp.createStreamDecoder();
    const parts = ids.map((x) => d.push(x));
    expect(parts).toEqual(["Hello", " world", " ", "", "", "你", " world"]);
    expect(d.flush()).toBe("");
    const c = sp.createStreamDecoder({ context: [id("▁Hello")] });
    expect(c.push(id("▁world"))).toBe(" world");
  });
});

describe("chat templates", () => {
  // The compiled module, for the tests that render in a child process of their own.
  const chat = pathToFileURL(join(packageRoot(), "dist", "src", "tokenizer", "chat-template.js")).href;
  const msgs: ChatMessage[] = [
    { role: "system", content: "You are terse." },
    { role: "user", content: "Hi!" },
    { role: "assistant", content: "Hello." },
    { role: "user", content: "2+2?" },
  ];

  test("ChatML fallback, exact string", () => {
    expect(renderChat(msgs, { addGenerationPrompt: true })).toBe(
      "<|im_start|>system\nYou are terse.<|im_end|>\n" +
        "<|im_start|>user\nHi!<|im_end|>\n" +
        "<|im_start|>assistant\nHello.<|im_end|>\n" +
        "<|im_start|>user\n2+2?<|im_end|>\n" +
        "<|im_start|>assistant\n",
    );
    expect(renderChat([{ role: "user", content: "x" }], { template: null })).toBe("<|im_start|>user\nx<|im_end|>\n");
    // a tokenizer without tokenizer_config.json uses ChatML
    expect(tok.chatTemplate).toBeNull();
    expect(tok.applyChatTemplate([{ role: "user", content: "x" }], { addGenerationPrompt: true })).toBe(
      "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n",
    );
  });

  const LLAMA3 =
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}" +
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

  test("a Jinja template with a system message, bos_token and add_generation_prompt", () => {
    const out = renderChat(msgs.slice(0, 2), { template: LLAMA3, bosToken: "<|begin_of_text|>", addGenerationPrompt: true });
    expect(out).toBe(
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>" +
        "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>" +
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
    );
    expect(renderChat(msgs.slice(0, 2), { template: LLAMA3, bosToken: "<s>" })).not.toContain("assistant");
  });

  test("template list: the entry named default", () => {
    const list = [
      { name: "tool_use", template: "TOOLS" },
      { name: "default", template: "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}" },
    ];
    expect(selectChatTemplate(list)).toBe(list[1].template);
    expect(renderChat(msgs.slice(1, 2), { template: list })).toBe("[user]Hi!");
    expect(selectChatTemplate([{ name: "tool_use", template: "x" }])).toBeNull();
    expect(() => selectChatTemplate(42)).toThrow();
  });

  test("bad messages and broken templates are refused", () => {
    expect(() => renderChat([{ role: "tool" as "user", content: "x" }])).toThrow(/role/);
    expect(() => renderChat([{ role: "user", content: 3 as unknown as string }])).toThrow(/content/);
    expect(() => renderChat(msgs, { template: "{% for m in messages %}" })).toThrow(/chat template/);
    expect(() => renderChat(msgs, { template: "{{ raise_exception('no system role') }}" })).toThrow(/no system role/);
  });

  test("a template that loops for minutes or eats memory is stopped with an error; the next render works", () => {
    // Two nested range(10000) loops take ~7 minutes in @huggingface/jinja; doubling a list 40
    // times asks for 2^40 items.
    const slow = "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}x";
    let t0 = performance.now();
    expect(() => renderChat(msgs, { template: slow, timeLimitMs: 300 })).toThrow(/the chat template was stopped after 300 ms: it loops too long/);
    expect(performance.now() - t0).toBeLessThan(3000);
    const greedy = "{% set ns = namespace(x=[1]) %}{% for i in range(40) %}{% set ns.x = ns.x + ns.x %}{% endfor %}{{ ns.x | length }}";
    t0 = performance.now();
    // The render process dies at its heap limit (~1 s here), and that is reported at once, well
    // before the time limit.
    expect(() => renderChat(msgs, { template: greedy, timeLimitMs: 20_000 })).toThrow(/the chat template needs more than 256 MB of memory/);
    expect(performance.now() - t0).toBeLessThan(10_000);
    expect(renderChat(msgs.slice(1, 2), { template: "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}" })).toBe("[user]Hi!");
    expect(() => renderChat(msgs, { template: "x", timeLimitMs: 0 })).toThrow(/timeLimitMs must be a positive number, got 0/);
  });

  test("a template that fills its heap with one large array does not abort this process (a worker thread's heap limit did)", () => {
    // Both templates aborted the whole process with "FATAL ERROR: Reached heap limit" when they
    // were rendered on a worker thread with resourceLimits (nodejs/node#47224). Run in a child
    // so that a regression fails this test instead of killing the test runner.
    const fatal = ["{% set ns = namespace(x=range(1000000)) %}{% for i in range(40) %}{% set ns.x = ns.x + ns.x %}{% endfor %}", "{{ (range(20000000) | list) | length }}"];
    const code =
      `import { renderChat } from ${JSON.stringify(chat)};\n` +
      `for (const template of ${JSON.stringify(fatal)}) {\n` +
      `  try { renderChat([{ role: "user", content: "Hi!" }], { template, timeLimitMs: 60000 }); console.log("rendered"); } catch (e) { console.log(e.message); }\n` +
      `}\n` +
      `console.log(renderChat([{ role: "user", content: "Hi!" }], { template: "[{{ messages[0].content }}]" }));`;
    const r = spawnSync(process.execPath, ["--input-type=module", "-e", code], { encoding: "utf8", timeout: 100_000 });
    expect(r.stderr).toBe("");
    expect(r.status).toBe(0);
    expect(r.stdout.trim().split("\n")).toEqual(["the chat template needs more than 256 MB of memory", "the chat template needs more than 256 MB of memory", "[Hi!]"]);
  });

  test("a render process whose parent is killed mid-render ends within seconds (Linux)", async () => {
    const slow = "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}x";
    const code = `import { renderChat } from ${JSON.stringify(chat)}; renderChat([{ role: "user", content: "Hi!" }], { template: ${JSON.stringify(slow)}, timeLimitMs: 600000 });`;
    const parent = spawn(process.execPath, ["--input-type=module", "-e", code], { stdio: "ignore" });
    /** The render processes that are alive (not zombies): pid → parent pid and CPU seconds, from /proc. */
    const renderers = () => {
      const found = new Map<number, { ppid: number; cpuS: number }>();
      for (const d of readdirSync("/proc").filter((d) => /^\d+$/.test(d))) {
        try {
          if (!readFileSync(`/proc/${d}/cmdline`, "utf8").includes("--max-old-space-size=256")) continue;
          const f = readFileSync(`/proc/${d}/stat`, "utf8").split(") ")[1].split(" ");  // state ppid ...; utime and stime are 12 and 13
          if (f[0] !== "Z") found.set(Number(d), { ppid: Number(f[1]), cpuS: (Number(f[11]) + Number(f[12])) / 100 });
        } catch {
          // gone meanwhile
        }
      }
      return found;
    };
    const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
    // Killed while it starts, the render process dies anyway (writing to a closed pipe); the case
    // here is one busy in a render, so wait for it to have used 0.5 s of CPU.
    let pid = 0;
    for (let i = 0; i < 200 && pid === 0; i++) {
      await sleep(50);
      for (const [p, r] of renderers()) if (r.ppid === parent.pid && r.cpuS >= 0.5) pid = p;
    }
    expect(pid).toBeGreaterThan(0);
    parent.kill("SIGKILL");
    for (let i = 0; i < 50 && renderers().has(pid); i++) await sleep(100);
    expect(renderers().has(pid)).toBe(false);
  });

  test("renderChatAsync leaves the thread free while the template renders, and takes turns with synchronous renders", async () => {
    // ~0.5 s of loop steps in the render process: timers here keep firing meanwhile.
    const busy = "{% for i in range(300) %}{% for j in range(300) %}{% endfor %}{% endfor %}[{{ messages[0].content }}]";
    let ticks = 0;
    const timer = setInterval(() => ticks++, 10);
    try {
      expect(await renderChatAsync(msgs.slice(1, 2), { template: busy })).toBe("[Hi!]");
    } finally {
      clearInterval(timer);
    }
    expect(ticks).toBeGreaterThanOrEqual(5);
    // Asynchronous renders in flight while a synchronous one comes in: each gets its own reply.
    const echo = (tag: string) => `${tag}{{ messages[0].content }}`;
    const pending = [renderChatAsync(msgs.slice(1, 2), { template: busy }), renderChatAsync(msgs.slice(1, 2), { template: echo("a:") })];
    expect(renderChat(msgs.slice(1, 2), { template: echo("s:") })).toBe("s:Hi!");
    expect(await Promise.all(pending)).toEqual(["[Hi!]", "a:Hi!"]);
    // The same errors and limits as the synchronous render; the next render works.
    await expect(renderChatAsync(msgs, { template: "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}", timeLimitMs: 300 })).rejects.toThrow(/the chat template was stopped after 300 ms: it loops too long/);
    await expect(renderChatAsync(msgs, { template: "{% for m in messages %}" })).rejects.toThrow(/chat template does not parse/);
    expect(await renderChatAsync(msgs.slice(1, 2), { template: null })).toBe("<|im_start|>user\nHi!<|im_end|>\n");
    expect(await renderChatAsync(msgs.slice(1, 2), { template: echo("b:") })).toBe("b:Hi!");
  });

  test("a rendered prompt over 64 MB is refused; one of 32 MB comes back whole", () => {
    const doubled = (n: number) => `{% set ns = namespace(x='a') %}{% for i in range(${n}) %}{% set ns.x = ns.x + ns.x %}{% endfor %}{{ ns.x }}`;
    expect(() => renderChat(msgs, { template: doubled(26), timeLimitMs: 60_000 })).toThrow(/the chat template rendered more than 64 MB/);
    expect(renderChat(msgs, { template: doubled(25), timeLimitMs: 60_000 })).toBe("a".repeat(2 ** 25));
  });

  test("a process whose only work is an asynchronous render waits for it (an unref'd wait let it exit with the render pending)", () => {
    const code = `import { renderChatAsync } from ${JSON.stringify(chat)}; console.log(await renderChatAsync([{ role: "user", content: "Hi!" }], { template: "[{{ messages[0].content }}]" }));`;
    const r = spawnSync(process.execPath, ["--input-type=module", "-e", code], { encoding: "utf8", timeout: 20_000 });
    expect(r.stderr).toBe("");
    expect(r.status).toBe(0);
    expect(r.stdout.trim()).toBe("[Hi!]");
  });

  test("the sandbox works in a process run with --input-type=module (its worker used to inherit the flag and never start)", () => {
    const code = `import { renderChat } from ${JSON.stringify(chat)}; console.log(renderChat([{ role: "user", content: "Hi!" }], { template: "[{{ messages[0].content }}]" }));`;
    const r = spawnSync(process.execPath, ["--input-type=module", "-e", code], { encoding: "utf8", timeout: 20_000 });
    expect(r.stderr).toBe("");
    expect(r.stdout.trim()).toBe("[Hi!]");
  });

  test("a folder's tokenizer_config.json: SmolLM2's template with its default system prompt", async () => {
    const dir = tempDir();
    copyFileSync(smolJson, join(dir, "tokenizer.json"));
    // SmolLM2-135M-Instruct's tokenizer_config.json (the fields that matter here)
    const template =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}" +
      "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}" +
      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
    writeFileSync(
      join(dir, "tokenizer_config.json"),
      JSON.stringify({ bos_token: "<|im_start|>", eos_token: "<|im_end|>", clean_up_tokenization_spaces: false, chat_template: template }),
    );
    writeFileSync(join(dir, "config.json"), JSON.stringify({ bos_token_id: 1, eos_token_id: 2 }));
    const t = await Tokenizer.fromFolder(dir);
    expect(t.bosId).toBe(1);
    expect(t.eosIds).toEqual([2]);
    expect(t.chatTemplate).toBe(template);
    expect(t.applyChatTemplate([{ role: "user", content: "Hi" }], { addGenerationPrompt: true })).toBe(
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n" +
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    );
    expect(t.applyChatTemplate(msgs.slice(0, 2))).toBe("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n");
    const ids = t.encode(t.applyChatTemplate(msgs.slice(0, 2)), { addSpecialTokens: false });
    expect(ids[0]).toBe(1);
    expect(ids.filter((x) => x === 2).length).toBe(2);
  });
});

describe("other tokenizers and errors", () => {
  test("all-MiniLM (WordPiece, BERT post-processor): [CLS] … [SEP], lower-cased", async () => {
    const t = await Tokenizer.fromFolder(minilmDir);
    const ids = t.encode("Hello World");
    expect(ids[0]).toBe(t.tokenToId("[CLS]"));
    expect(ids[ids.length - 1]).toBe(t.tokenToId("[SEP]"));
    expect(ids.slice(1, -1)).toEqual([t.tokenToId("hello"), t.tokenToId("world")]);
    expect(t.encode("Hello World", { addSpecialTokens: false })).toEqual(ids.slice(1, -1));
    expect(t.decode(ids, { skipSpecialTokens: true })).toBe("hello world");
  });

  test("llama-tiny's word-level tokenizer with the model's config.json ids", async () => {
    const t = await Tokenizer.fromFolder(hfLlamaTiny);
    expect(t.encode("t5 t6 t511")).toEqual([5, 6, 511]);
    expect(t.bosId).toBe(1);
    expect(t.eosIds).toEqual([2]);
    expect(t.vocabSize).toBe(512);
  });

  test("missing or invalid files raise a FormatError naming the file", async () => {
    const dir = tempDir();
    const missing = join(dir, "tokenizer.json");
    await expect(Tokenizer.fromFile(missing)).rejects.toThrow(FormatError);
    await expect(Tokenizer.fromFile(missing)).rejects.toThrow(missing);
    await expect(Tokenizer.fromFolder(dir)).rejects.toThrow(missing);

    writeFileSync(missing, "{ not json");
    await expect(Tokenizer.fromFile(missing)).rejects.toThrow(/tokenizer\.json: not valid JSON/);
    writeFileSync(missing, JSON.stringify({ version: "1.0" }));
    await expect(Tokenizer.fromFile(missing)).rejects.toThrow(/no "model" object/);
    writeFileSync(missing, JSON.stringify({ model: { type: "Nonsense" } }));
    await expect(Tokenizer.fromFile(missing)).rejects.toThrow(FormatError);

    const cfg = join(dir, "tokenizer_config.json");
    copyFileSync(smolJson, missing);
    writeFileSync(cfg, "[]");
    await expect(Tokenizer.fromFolder(dir)).rejects.toThrow(/tokenizer_config\.json: not a JSON object/);
    writeFileSync(cfg, JSON.stringify({ chat_template: "{% for %}" }));
    await expect(Tokenizer.fromFolder(dir)).rejects.toThrow(/tokenizer_config\.json: chat_template/);
    writeFileSync(cfg, JSON.stringify({ eos_token: "<|nope|>" }));
    await expect(Tokenizer.fromFolder(dir)).rejects.toThrow(/eos_token "<\|nope\|>" is not in the vocabulary/);
    await expect(Tokenizer.fromFile(missing, join(dir, "absent.json"))).rejects.toThrow(/absent\.json: cannot read/);
  });
});

describe("hostile tokenizer.json", () => {
  test("a JSON file larger than any real one is refused by size before it is read (parsing it could exhaust the heap and abort the process)", async () => {
    const dir = tempDir();
    copyFileSync(join(hfLlamaTiny, "config.json"), join(dir, "config.json"));
    copyFileSync(join(hfLlamaTiny, "model.safetensors"), join(dir, "model.safetensors"));
    const big = (name: string) => {
      writeFileSync(join(dir, name), "{}");
      truncateSync(join(dir, name), MAX_JSON_FILE_BYTES + 1);  // sparse: costs no disk
    };
    big("tokenizer.json");
    await expect(Tokenizer.fromFile(join(dir, "tokenizer.json"))).rejects.toThrow(/tokenizer\.json: 67108865 bytes: larger than any real model or tokenizer JSON file \(the limit is 67108864\)/);
    big("tokenizer_config.json");
    await expect(Tokenizer.fromFile(join(hfLlamaTiny, "tokenizer.json"), join(dir, "tokenizer_config.json"))).rejects.toThrow(/tokenizer_config\.json: 67108865 bytes/);
    expect((await readHfFolder(dir)).config.numLayers).toBeGreaterThan(0);
    big("config.json");
    await expect(readHfFolder(dir)).rejects.toThrow(/config\.json: 67108865 bytes/);
    // At the limit the file is read (and here, being mostly NUL bytes, is not JSON).
    truncateSync(join(dir, "tokenizer.json"), MAX_JSON_FILE_BYTES);
    await expect(Tokenizer.fromFile(join(dir, "tokenizer.json"))).rejects.toThrow(/tokenizer\.json: not valid JSON/);
  });

  test("a token id beyond 2^24 - 1 is refused by name (one id of 2^31 - 1 made the load hang), and so is a fractional one", () => {
    const base = JSON.parse(readFileSync(join(hfLlamaTiny, "tokenizer.json"), "utf8")) as { model: { vocab: Record<string, number> }; added_tokens: object[] };
    const json = (vocab: Record<string, number>, added: { id: number; content: string }[] = []) => ({
      ...base,
      model: { ...base.model, vocab: { ...base.model.vocab, ...vocab } },
      added_tokens: [...base.added_tokens, ...added.map((t) => ({ ...t, special: true, single_word: false, lstrip: false, rstrip: false, normalized: false }))],
    });
    const t0 = performance.now();
    expect(() => Tokenizer.fromJson(json({ zzzz: 2 ** 31 - 1 }), "t.json")).toThrow(/t\.json: vocabulary entry "zzzz" has id 2147483647; ids must be integers from 0 to 16777215/);
    expect(() => Tokenizer.fromJson(json({}, [{ id: 4e9, content: "<x>" }]), "t.json")).toThrow(/added token "<x>" has id 4000000000/);
    expect(() => Tokenizer.fromJson(json({ zzzz: 1.5 }), "t.json")).toThrow(FormatError);
    expect(performance.now() - t0).toBeLessThan(1000);
    expect(Tokenizer.fromJson(json({}), "t.json").vocabSize).toBeGreaterThan(0);
  });
});
