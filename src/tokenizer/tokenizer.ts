// The tokenizer: Hugging Face `tokenizer.json` (+ `tokenizer_config.json`) through
// @huggingface/tokenizers, a pure-JS port of the Rust `tokenizers` crate, plus what an
// inference engine needs around it: BOS/EOS ids, the chat template, and a streaming
// detokenizer that never emits half a UTF-8 character.
import { join } from "node:path";
import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers";
import { DkiArgumentError, FormatError } from "../errors.js";
import { SHAPE_LIMITS } from "../formats/hf-config.js";
import { readJsonObject } from "../formats/json-file.js";
import { checkChatTemplate, renderChat, renderChatAsync, selectChatTemplate, type ChatMessage, type RenderChatOptions } from "./chat-template.js";

export interface EncodeOptions {
  /** Let the tokenizer's post-processor add its special tokens (e.g. BOS). Default true, as in HF. */
  addSpecialTokens?: boolean;
}

export interface DecodeOptions {
  /** Drop special tokens (added tokens marked `special`) from the text. Default false. */
  skipSpecialTokens?: boolean;
}

export interface StreamDecoderOptions extends DecodeOptions {
  /**
   * Token ids already shown to the user (e.g. the end of the prompt). They are not emitted; they
   * give the first pushed tokens their context, so a decoder that strips a leading space at the
   * start of a text (SentencePiece's "▁") does not strip it mid-sentence. A character the
   * context ends inside of (part of its UTF-8 bytes) is emitted whole with the id completing it.
   */
  context?: number[];
}

/** Incremental detokenizer: `push` returns only newly completed text; `flush` returns what is held back. */
export interface StreamDecoder {
  push(id: number): string;
  flush(): string;
}

export interface TokenizerExtraIds {
  /** BOS id from the model's config.json, used when tokenizer_config.json names no bos_token. */
  bosTokenId?: number | null;
  /** EOS ids from the model's config.json / generation_config.json, added to tokenizer_config's eos_token. */
  eosTokenIds?: number[];
}

type Json = Record<string, unknown>;

/**
 * End-of-turn / end-of-text tokens of common model families. Only used when neither
 * tokenizer_config.json nor the model config names an EOS token (a bare tokenizer.json):
 * those of them that exist as special tokens become `eosIds`.
 */
const KNOWN_EOS = ["<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "</s>", "<eos>", "<end_of_turn>"];

/** A special-token field of tokenizer_config.json: a string or an AddedToken object `{content}`. */
export function tokenString(v: unknown): string | null {
  if (typeof v === "string") return v;
  if (typeof v === "object" && v !== null && typeof (v as Json).content === "string") return (v as Json).content as string;
  return null;
}

function idList(v: unknown): number[] {
  if (typeof v === "number" && Number.isInteger(v)) return [v];
  if (Array.isArray(v)) return v.filter((x): x is number => typeof x === "number" && Number.isInteger(x));
  return [];
}

/** The largest token id the engine takes: the last of the largest vocabulary it takes. */
const MAX_TOKEN_ID = SHAPE_LIMITS.vocabSize - 1;

/**
 * Every id of the vocabulary and the added tokens is an integer from 0 to MAX_TOKEN_ID: the
 * tokenizers library sizes its tables by the largest id, so one entry of 2^31 - 1 hung the load.
 */
function checkTokenIds(json: Json, model: Json, file: string): void {
  const check = (id: unknown, what: string) => {
    if (typeof id !== "number" || !Number.isInteger(id) || id < 0 || id > MAX_TOKEN_ID) {
      throw new FormatError(file, `${what} has id ${JSON.stringify(id)}; ids must be integers from 0 to ${MAX_TOKEN_ID}`);
    }
  };
  const vocab = model.vocab;
  if (vocab && typeof vocab === "object" && !Array.isArray(vocab)) {
    for (const [token, id] of Object.entries(vocab as Json)) check(id, `vocabulary entry ${JSON.stringify(token).slice(0, 40)}`);
  }
  for (const t of (json.added_tokens as Json[] | undefined) ?? []) check(t?.id, `added token ${JSON.stringify(t?.content).slice(0, 40)}`);
}

/**
 * What `full` adds to `prefix`: the text past their common start. Usually `full` extends
 * `prefix`; where a context ends inside a character, `prefix` ends in U+FFFD and `full` has the
 * completed character there instead, which then comes out whole.
 */
function textAfter(prefix: string, full: string): string {
  if (full.startsWith(prefix)) return full.slice(prefix.length);
  let i = 0;
  while (i < prefix.length && i < full.length && prefix.charCodeAt(i) === full.charCodeAt(i)) i++;
  return full.slice(i);
}

export class Tokenizer {
  /** Ids the tokenizer knows: max id + 1 over the vocabulary and the added tokens (may be below the model's vocab_size). */
  readonly vocabSize: number;
  /** BOS id: tokenizer_config's bos_token, else the model config's bos_token_id, else null. */
  readonly bosId: number | null;
  /** Ids that end generation: tokenizer_config's eos_token plus the model config's eos_token_id(s). */
  readonly eosIds: number[];
  /** Ids of every special token (added tokens marked special and additional_special_tokens), ascending. */
  readonly specialIds: number[];
  readonly bosToken: string | null;
  readonly eosToken: string | null;
  /** The Jinja chat template of tokenizer_config.json, or null (ChatML is used then). */
  readonly chatTemplate: string | null;

  private readonly specialSet: Set<number>;

  private constructor(
    private readonly hf: HfTokenizer,
    readonly files: { tokenizer: string; config: string | null },
    config: Json,
    extra: TokenizerExtraIds,
  ) {
    let maxId = -1;
    for (const id of hf.get_vocab(true).values()) if (id > maxId) maxId = id;
    this.vocabSize = maxId + 1;

    const special = new Set<number>();
    for (const [id, tok] of hf.get_added_tokens_decoder()) if (tok.special) special.add(id);
    for (const s of Array.isArray(config.additional_special_tokens) ? config.additional_special_tokens : []) {
      const id = hf.token_to_id(tokenString(s) ?? "");
      if (id !== undefined) special.add(id);
    }
    this.specialSet = special;
    this.specialIds = [...special].sort((a, b) => a - b);

    const cfgFile = files.config ?? files.tokenizer;
    this.bosToken = tokenString(config.bos_token);
    this.eosToken = tokenString(config.eos_token);
    const bosFromCfg = this.bosToken === null ? undefined : hf.token_to_id(this.bosToken);
    this.bosId = bosFromCfg ?? (typeof extra.bosTokenId === "number" ? extra.bosTokenId : null);
    if (this.bosToken === null && this.bosId !== null) this.bosToken = hf.id_to_token(this.bosId) ?? null;

    const eos: number[] = [];
    const addEos = (id: number | undefined) => {
      if (id !== undefined && !eos.includes(id)) eos.push(id);
    };
    if (this.eosToken !== null) {
      const id = hf.token_to_id(this.eosToken);
      if (id === undefined) throw new FormatError(cfgFile, `eos_token ${JSON.stringify(this.eosToken)} is not in the vocabulary`);
      addEos(id);
    }
    for (const id of extra.eosTokenIds ?? []) addEos(id);
    if (eos.length === 0) {
      for (const s of KNOWN_EOS) {
        const id = hf.token_to_id(s);
        if (id !== undefined && special.has(id)) addEos(id);
      }
    }
    this.eosIds = eos;
    if (this.eosToken === null && eos.length > 0) this.eosToken = hf.id_to_token(eos[0]) ?? null;

    try {
      this.chatTemplate = selectChatTemplate(config.chat_template);
      if (this.chatTemplate !== null) checkChatTemplate(this.chatTemplate);
    } catch (e) {
      throw new FormatError(cfgFile, `chat_template: ${(e as Error).message}`);
    }
  }

  /**
   * Loads `tokenizer.json`, with `tokenizer_config.json` when given (special tokens, chat template,
   * clean-up flag). `extra` carries the model config's BOS/EOS ids.
   */
  static async fromFile(tokenizerJsonPath: string, tokenizerConfigPath?: string | null, extra: TokenizerExtraIds = {}): Promise<Tokenizer> {
    const config = tokenizerConfigPath ? await readJsonObject(tokenizerConfigPath) : null;
    return Tokenizer.build(tokenizerJsonPath, config, tokenizerConfigPath ?? null, extra);
  }

  private static async build(tokenizerJsonPath: string, cfg: Json | null, cfgPath: string | null, extra: TokenizerExtraIds): Promise<Tokenizer> {
    return Tokenizer.fromObject(await readJsonObject(tokenizerJsonPath), tokenizerJsonPath, cfg, cfgPath, extra);
  }

  /**
   * A tokenizer from a tokenizer.json object already in memory (e.g. built from GGUF metadata);
   * `source` names where it came from in errors. `cfg` plays the part of tokenizer_config.json.
   */
  static fromJson(json: Json, source: string, cfg: Json | null = null, extra: TokenizerExtraIds = {}): Tokenizer {
    return Tokenizer.fromObject(json, source, cfg, cfg ? source : null, extra);
  }

  private static fromObject(json: Json, tokenizerJsonPath: string, cfg: Json | null, cfgPath: string | null, extra: TokenizerExtraIds): Tokenizer {
    const config = cfg ?? {};
    const model = json.model as Json | undefined;
    if (typeof model !== "object" || model === null || Array.isArray(model)) {
      throw new FormatError(tokenizerJsonPath, "no \"model\" object: not a Hugging Face tokenizer.json");
    }
    if (json.added_tokens !== undefined && !Array.isArray(json.added_tokens)) throw new FormatError(tokenizerJsonPath, "added_tokens is not a list");
    checkTokenIds(json, model, tokenizerJsonPath);
    // transformers has cleaned up spaces ("a ." → "a.") only on request for a while now; the JS port
    // defaults to doing it, which breaks decode(encode(x)) == x. Follow tokenizer_config, default off.
    const hfConfig: Json = {
      ...config,
      bos_token: tokenString(config.bos_token) ?? undefined,
      eos_token: tokenString(config.eos_token) ?? undefined,
      // The JS port's WordLevel reads the unknown token from here only; Rust's from the model.
      unk_token: tokenString(config.unk_token) ?? (typeof model.unk_token === "string" ? model.unk_token : undefined),
      pad_token: tokenString(config.pad_token) ?? undefined,
      additional_special_tokens: Array.isArray(config.additional_special_tokens)
        ? config.additional_special_tokens.map(tokenString).filter((s): s is string => s !== null)
        : [],
      clean_up_tokenization_spaces: config.clean_up_tokenization_spaces === true,
    };
    let hf: HfTokenizer;
    try {
      hf = new HfTokenizer({ added_tokens: [], ...json }, hfConfig);
    } catch (e) {
      throw new FormatError(tokenizerJsonPath, `unsupported or malformed tokenizer (${(e as Error).message})`);
    }
    return new Tokenizer(hf, { tokenizer: tokenizerJsonPath, config: cfg ? cfgPath : null }, config, extra);
  }

  /**
   * Loads a folder's `tokenizer.json` and, when present, `tokenizer_config.json`; BOS/EOS ids of
   * `config.json` and `generation_config.json` (when present) complete those of the tokenizer config.
   */
  static async fromFolder(dir: string): Promise<Tokenizer> {
    const cfgPath = join(dir, "tokenizer_config.json");
    const cfg = await readJsonObject(cfgPath, { optional: true });
    const extra: TokenizerExtraIds = { eosTokenIds: [] };
    for (const name of ["config.json", "generation_config.json"]) {
      const c = await readJsonObject(join(dir, name), { optional: true });
      if (!c) continue;
      extra.eosTokenIds!.push(...idList(c.eos_token_id));
      if (extra.bosTokenId == null && typeof c.bos_token_id === "number") extra.bosTokenId = c.bos_token_id;
    }
    return Tokenizer.build(join(dir, "tokenizer.json"), cfg, cfgPath, extra);
  }

  encode(text: string, opts: EncodeOptions = {}): number[] {
    if (typeof text !== "string") throw new DkiArgumentError("encode: text must be a string");
    if (text.length === 0 && !(opts.addSpecialTokens ?? true)) return [];
    const ids = this.hf.encode(text, { add_special_tokens: opts.addSpecialTokens ?? true }).ids;
    // A piece missing from the vocabulary, with no unknown token to stand for it.
    if (ids.includes(undefined as unknown as number)) {
      throw new DkiArgumentError(`encode: ${JSON.stringify(text.length > 40 ? text.slice(0, 40) + "…" : text)} has a piece this tokenizer has no token for, and it names no unknown token`);
    }
    return ids;
  }

  /**
   * A pair of texts as one input, the way a cross-encoder reads a query and a passage: the
   * post-processor's pair template puts its special tokens around and between them (BERT:
   * [CLS] a [SEP] b [SEP]). `typeIds` are the template's segment ids. Throws what the tokenizer
   * throws for a post-processor without a pair template.
   */
  encodePair(a: string, b: string): { ids: number[]; typeIds: number[] } {
    if (typeof a !== "string" || typeof b !== "string") throw new DkiArgumentError("encodePair: both texts must be strings");
    const e = this.hf.encode(a, { text_pair: b, add_special_tokens: true, return_token_type_ids: true });
    if (e.ids.includes(undefined as unknown as number)) throw new DkiArgumentError("encodePair: a piece of the pair has no token in this tokenizer, and it names no unknown token");
    return { ids: e.ids, typeIds: e.token_type_ids };
  }

  decode(ids: ArrayLike<number>, opts: DecodeOptions = {}): string {
    return this.decodeRaw(this.checkIds(ids), opts.skipSpecialTokens ?? false, undefined);
  }

  tokenToId(token: string): number | undefined {
    return this.hf.token_to_id(token);
  }

  idToToken(id: number): string | undefined {
    return this.hf.id_to_token(id);
  }

  isSpecial(id: number): boolean {
    return this.specialSet.has(id);
  }

  /** Renders messages with the folder's chat template (ChatML when it has none). Encode the result with addSpecialTokens: false. */
  applyChatTemplate(messages: ChatMessage[], opts: { addGenerationPrompt?: boolean } = {}): string {
    return renderChat(messages, this.renderOptions(opts));
  }

  /** applyChatTemplate without blocking this thread while the template renders (in its own process). */
  applyChatTemplateAsync(messages: ChatMessage[], opts: { addGenerationPrompt?: boolean } = {}): Promise<string> {
    return renderChatAsync(messages, this.renderOptions(opts));
  }

  private renderOptions(opts: { addGenerationPrompt?: boolean }): RenderChatOptions {
    return { template: this.chatTemplate, bosToken: this.bosToken ?? "", eosToken: this.eosToken ?? "", addGenerationPrompt: opts.addGenerationPrompt ?? false };
  }

  /**
   * A streaming detokenizer. It decodes a sliding window of recent ids (so decoders that depend on
   * neighbouring tokens, like byte-level BPE and SentencePiece's leading-space rule, see context)
   * and emits the text past what it has already emitted, holding it back while it ends in U+FFFD
   * (a multibyte character split across tokens). The concatenation of every `push` and the final
   * `flush` equals `decode(ids)` (with the tokenizer's clean-up of spaces off).
   */
  createStreamDecoder(opts: StreamDecoderOptions = {}): StreamDecoder {
    const skip = opts.skipSpecialTokens ?? false;
    const ids: number[] = opts.context ? [...this.checkIds(opts.context)] : [];
    let prefixOffset = 0; // window start: the ids before readOffset give the decoder its context
    let readOffset = ids.length; // ids before this have been emitted
    const dec = (a: number, b: number) => (b > a ? this.decodeRaw(ids.slice(a, b), skip, false) : "");
    return {
      push: (id: number): string => {
        this.checkIds([id]);
        ids.push(id);
        const full = dec(prefixOffset, ids.length);
        if (full.endsWith("\uFFFD")) return "";
        const text = textAfter(dec(prefixOffset, readOffset), full);
        if (text === "") return "";
        prefixOffset = readOffset;
        readOffset = ids.length;
        return text;
      },
      flush: (): string => {
        const text = textAfter(dec(prefixOffset, readOffset), dec(prefixOffset, ids.length));
        prefixOffset = readOffset = ids.length;
        return text;
      },
    };
  }

  /**
   * Ids below `limit` (the model's vocabulary) that this tokenizer cannot decode: a model may have
   * more output rows than tokens (padded embeddings), and generation must never sample those.
   */
  undecodableIds(limit: number): readonly number[] {
    let out = this.undecodable.get(limit);
    if (!out) {
      out = [];
      for (let id = 0; id < limit; id++) if (!this.knows(id)) out.push(id);
      this.undecodable.set(limit, out);
    }
    return out;
  }
  private readonly undecodable = new Map<number, number[]>();

  /** Whether `id` names a token of this tokenizer (one it can decode). */
  private knows(id: number): boolean {
    return Number.isInteger(id) && id >= 0 && id < this.vocabSize && this.hf.id_to_token(id) !== undefined;
  }

  private checkIds(ids: ArrayLike<number>): number[] {
    const out = Array.from(ids);
    for (const id of out) {
      if (!this.knows(id)) {
        throw new DkiArgumentError(`token id ${id} is not in the tokenizer's vocabulary (0..${this.vocabSize - 1})`);
      }
    }
    return out;
  }

  private decodeRaw(ids: number[], skipSpecial: boolean, cleanUp: boolean | undefined): string {
    if (ids.length === 0) return "";
    if (skipSpecial) {
      ids = ids.filter((id) => !this.specialSet.has(id));
      if (ids.length === 0) return "";
    }
    return this.hf.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: cleanUp });
  }
}
