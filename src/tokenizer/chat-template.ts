// Chat templates: the Jinja `chat_template` of tokenizer_config.json rendered with
// @huggingface/jinja, the way transformers' `apply_chat_template` renders it; ChatML when a
// tokenizer config carries no template. Rendering runs in a sandbox with a time and memory limit
// (template-sandbox.ts): a template comes with the model file and could loop for hours.
import { Template } from "@huggingface/jinja";
import { DkiArgumentError } from "../errors.js";
import { CHAT_TEMPLATE_TIME_LIMIT_MS, renderTemplateSandboxed, renderTemplateSandboxedAsync, TemplateError } from "./template-sandbox.js";

export type ChatRole = "system" | "user" | "assistant";

export interface ChatMessage {
  role: ChatRole;
  content: string;
}

/** tokenizer_config.json may give several named templates instead of one string. */
export interface NamedChatTemplate {
  name: string;
  template: string;
}

export interface RenderChatOptions {
  /** A Jinja chat template, a list of named templates ("default" is used), or null/absent for ChatML. */
  template?: string | NamedChatTemplate[] | null;
  bosToken?: string;
  eosToken?: string;
  /** Append the opening of an assistant turn. Default false, as in transformers. */
  addGenerationPrompt?: boolean;
  /** A render running longer is stopped with an error (default 5000 ms). */
  timeLimitMs?: number;
}

const ROLES: ReadonlySet<string> = new Set(["system", "user", "assistant"]);

/**
 * The template to use from tokenizer_config.json's `chat_template`: a string as is; from a list of
 * `{name, template}` the one named "default"; null when there is none. Throws on a malformed value.
 */
export function selectChatTemplate(raw: unknown): string | null {
  if (raw === undefined || raw === null) return null;
  if (typeof raw === "string") return raw;
  if (Array.isArray(raw)) {
    for (const entry of raw) {
      if (typeof entry !== "object" || entry === null || typeof (entry as NamedChatTemplate).name !== "string" || typeof (entry as NamedChatTemplate).template !== "string") {
        throw new Error(`chat_template list entries must be {name, template} strings, got ${JSON.stringify(entry)}`);
      }
    }
    const def = (raw as NamedChatTemplate[]).find((e) => e.name === "default");
    return def ? def.template : null;
  }
  throw new Error(`chat_template must be a string or a list of {name, template}, got ${typeof raw}`);
}

function checkMessages(messages: ChatMessage[]): void {
  if (!Array.isArray(messages)) throw new DkiArgumentError("messages must be an array");
  messages.forEach((m, i) => {
    if (typeof m !== "object" || m === null) throw new DkiArgumentError(`message ${i} is not an object`);
    if (!ROLES.has(m.role)) throw new DkiArgumentError(`message ${i}: role ${JSON.stringify(m.role)} is not one of system, user, assistant`);
    if (typeof m.content !== "string") throw new DkiArgumentError(`message ${i}: content must be a string`);
  });
}

/** ChatML, the fallback format: `<|im_start|>{role}\n{content}<|im_end|>\n` per message. */
export function renderChatML(messages: ChatMessage[], addGenerationPrompt: boolean): string {
  let out = "";
  for (const m of messages) out += `<|im_start|>${m.role}\n${m.content}<|im_end|>\n`;
  if (addGenerationPrompt) out += "<|im_start|>assistant\n";
  return out;
}

// Templates already checked; a model keeps using the same one.
const checked = new Set<string>();
const MAX_CHECKED = 32;

/**
 * Parses a Jinja template to check it (a model's template is checked when its tokenizer loads,
 * not at its first render). Throws the parser's error for a malformed template. Parsing is
 * linear in the template's length, so it runs here, outside the sandbox.
 */
export function checkChatTemplate(template: string): void {
  if (checked.has(template)) return;
  new Template(template);
  if (checked.size >= MAX_CHECKED) checked.delete(checked.values().next().value!);
  checked.add(template);
}

export function renderChat(messages: ChatMessage[], opts: RenderChatOptions = {}): string {
  const job = renderJob(messages, opts);
  if ("text" in job) return job.text;
  try {
    return renderTemplateSandboxed(job.template, job.context, job.timeLimitMs);
  } catch (e) {
    throw templateFailure(e);
  }
}

/**
 * renderChat without blocking this thread while the template renders (in its own process): the
 * caller's other work runs meanwhile. Same output, limits and errors.
 */
export async function renderChatAsync(messages: ChatMessage[], opts: RenderChatOptions = {}): Promise<string> {
  const job = renderJob(messages, opts);
  if ("text" in job) return job.text;
  try {
    return await renderTemplateSandboxedAsync(job.template, job.context, job.timeLimitMs);
  } catch (e) {
    throw templateFailure(e);
  }
}

/** The checked render: ChatML's text at once, or the template and its context for the sandbox. */
function renderJob(messages: ChatMessage[], opts: RenderChatOptions): { text: string } | { template: string; context: Record<string, unknown>; timeLimitMs: number } {
  checkMessages(messages);
  const addGenerationPrompt = opts.addGenerationPrompt ?? false;
  const template = Array.isArray(opts.template) ? selectChatTemplate(opts.template) : opts.template ?? null;
  if (template === null) return { text: renderChatML(messages, addGenerationPrompt) };
  const timeLimitMs = opts.timeLimitMs ?? CHAT_TEMPLATE_TIME_LIMIT_MS;
  if (!(timeLimitMs > 0) || !Number.isFinite(timeLimitMs)) throw new DkiArgumentError(`timeLimitMs must be a positive number, got ${timeLimitMs}`);
  const context = {
    messages: messages.map((m) => ({ role: m.role, content: m.content })),
    bos_token: opts.bosToken ?? "",
    eos_token: opts.eosToken ?? "",
    add_generation_prompt: addGenerationPrompt,
  };
  return { template, context, timeLimitMs };
}

function templateFailure(e: unknown): unknown {
  if (!(e instanceof TemplateError)) return e;
  const what = e.stage === "parse" ? "does not parse" : "failed to render";
  return new Error(`chat template ${what}: ${e.message}`, { cause: e });
}
