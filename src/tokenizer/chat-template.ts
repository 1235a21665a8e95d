// Chat templates: the Jinja `chat_template` of tokenizer_config.json rendered with
// @huggingface/jinja, the way transformers' `apply_chat_template` renders it; ChatML when a
// tokenizer config carries no template.
import { Template } from "@huggingface/jinja";
import { DkiArgumentError } from "../errors.js";

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

// Parsing a template costs far more than rendering it; a model keeps using the same one.
const compiled = new Map<string, Template>();
const MAX_COMPILED = 32;

/** Parses a Jinja template (cached). Throws the parser's error for a malformed one. */
export function compileChatTemplate(template: string): Template {
  let t = compiled.get(template);
  if (!t) {
    t = new Template(template);
    if (compiled.size >= MAX_COMPILED) compiled.delete(compiled.keys().next().value!);
    compiled.set(template, t);
  }
  return t;
}

export function renderChat(messages: ChatMessage[], opts: RenderChatOptions = {}): string {
  checkMessages(messages);
  const addGenerationPrompt = opts.addGenerationPrompt ?? false;
  const template = Array.isArray(opts.template) ? selectChatTemplate(opts.template) : opts.template ?? null;
  if (template === null) return renderChatML(messages, addGenerationPrompt);
  let t: Template;
  try {
    t = compileChatTemplate(template);
  } catch (e) {
    throw new Error(`chat template does not parse: ${(e as Error).message}`, { cause: e });
  }
  try {
    return t.render({
      messages: messages.map((m) => ({ role: m.role, content: m.content })),
      bos_token: opts.bosToken ?? "",
      eos_token: opts.eosToken ?? "",
      add_generation_prompt: addGenerationPrompt,
    });
  } catch (e) {
    throw new Error(`chat template failed to render: ${(e as Error).message}`, { cause: e });
  }
}
