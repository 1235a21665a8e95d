// Prompt formatters (seed 003 §5: generic, DeepSeek, GLM; here also ChatML/Qwen and Llama 3): how
// a Recall v4 turn's prompt is framed. `recall.prompt_formatter`:
//   "auto"     the model's own chat template when it has one (config.chatTemplate "auto"), else
//              the generic form: what every turn does without Recall v4
//   "generic"  the plain `User: … / Assistant:` form, whatever the model ships
//   "chatml" | "llama3" | "deepseek" | "glm"
//              that family's chat format, built in: for a model file without a template (or with
//              a wrong one). Its special tokens are the family's; a tokenizer without them reads
//              them as text.
// A built-in format is a Jinja chat template rendered like a model's own (renderChat), so the
// system prompt's turn, the encoding prefix and the prompt all follow it.
import { renderChat, renderChatAsync, type ChatMessage } from "../tokenizer/chat-template.js";

export const BUILTIN_FORMATS = {
  chatml:
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" +
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
  llama3:
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content | trim }}<|eot_id|>{% endfor %}" +
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}",
  // DeepSeek-V2/V3 chat: the system prompt bare after BOS, then <｜User｜> and <｜Assistant｜> turns.
  deepseek:
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}\n\n{% elif m.role == 'user' %}<｜User｜>{{ m.content }}" +
    "{% else %}<｜Assistant｜>{{ m.content }}<｜end▁of▁sentence｜>{% endif %}{% endfor %}{% if add_generation_prompt %}<｜Assistant｜>{% endif %}",
  // GLM-4 chat: [gMASK]<sop>, then <|role|> and a newline before each turn.
  glm: "[gMASK]<sop>{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}",
} as const;

export type BuiltinFormat = keyof typeof BUILTIN_FORMATS;
export type PromptFormatterName = "auto" | "generic" | BuiltinFormat;
export const PROMPT_FORMATTERS: readonly PromptFormatterName[] = ["auto", "generic", "chatml", "llama3", "deepseek", "glm"];

/** What prompt building reads of a tokenizer (the engine's Tokenizer has it). */
export interface FormattableTokenizer {
  readonly chatTemplate: string | null;
  readonly bosId: number | null;
  readonly bosToken: string | null;
  readonly eosToken: string | null;
  encode(text: string, opts?: { addSpecialTokens?: boolean }): number[];
  applyChatTemplate(messages: ChatMessage[], opts?: { addGenerationPrompt?: boolean }): string;
  applyChatTemplateAsync(messages: ChatMessage[], opts?: { addGenerationPrompt?: boolean }): Promise<string>;
}

/**
 * `tok` as the formatter frames prompts: itself for "auto"; without a chat template for
 * "generic" (the prompt builder then writes the plain form); with the built-in template otherwise.
 */
export function formattedTokenizer(tok: FormattableTokenizer, name: PromptFormatterName): FormattableTokenizer {
  if (name === "auto") return tok;
  const template = name === "generic" ? null : BUILTIN_FORMATS[name];
  const options = (opts: { addGenerationPrompt?: boolean } = {}) => ({ template, bosToken: tok.bosToken ?? "", eosToken: tok.eosToken ?? "", addGenerationPrompt: opts.addGenerationPrompt ?? false });
  return {
    chatTemplate: template,
    bosId: tok.bosId,
    bosToken: tok.bosToken,
    eosToken: tok.eosToken,
    encode: (text, opts) => tok.encode(text, opts),
    applyChatTemplate: (messages, opts) => renderChat(messages, options(opts)),
    applyChatTemplateAsync: (messages, opts) => renderChatAsync(messages, options(opts)),
  };
}
