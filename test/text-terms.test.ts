// Golden examples of the tokenisation BM25 and the hashing embedder share.
import { describe, expect, it } from "vitest";
import { STOP_WORDS, terms } from "../src/memory/text-terms.js";

describe("terms", () => {
  it("English: NFKC, lower case, apostrophes, possessives, numbers, hyphens; stop words kept", () => {
    expect(terms("The user's favourite café is in São Paulo — don’t forget!")).toEqual([
      "the", "user", "favourite", "café", "is", "in", "são", "paulo", "don't", "forget",
    ]);
    expect(terms("Version 3.14 costs $1,000 (e-mail me)")).toEqual(["version", "3.14", "costs", "1,000", "e", "mail", "me"]);
    // Full-width letters and digits fold to ASCII under NFKC; the ﬁ ligature to "fi".
    expect(terms("ＡＢＣ１２３ ﬁle")).toEqual(["abc123", "file"]);
    // A decomposed é (e + U+0301) equals the composed one.
    expect(terms("cafe\u0301")).toEqual(terms("café"));
    expect(STOP_WORDS.has("the")).toBe(true);
  });

  it("Chinese: jieba search-mode words, then every character", () => {
    expect(terms("我喜欢在北京吃烤鸭，今天天气很好")).toEqual([
      "喜欢", "北京", "烤鸭", "我", "喜", "欢", "在", "北", "京", "吃", "烤", "鸭",
      "今天", "天天", "天气", "今天天气", "今", "天", "天", "气", "很", "好",
    ]);
    // A partial match still shares terms: "北京市" has the word 北京 inside and the characters.
    const city = terms("北京市");
    expect(city).toContain("北");
    expect(city).toContain("京");
  });

  it("mixed scripts are cut at script boundaries", () => {
    expect(terms("我用iPhone拍照")).toEqual(["我用", "我", "用", "iphone", "拍照", "拍", "照"]);
  });

  it("kana and Hangul become character bigrams", () => {
    expect(terms("안녕하세요 세계")).toEqual(["안녕", "녕하", "하세", "세요", "세계"]);
    expect(terms("タワーに")).toEqual(["タワ", "ワー", "ーに"]);
    expect(terms("の")).toEqual(["の"]);
  });

  it("text without letters or digits has no terms; a non-string is a clear error", () => {
    expect(terms("")).toEqual([]);
    expect(terms("🙂 ... !! —")).toEqual([]);
    expect(() => terms(42 as unknown as string)).toThrow(/expected a string/);
  });

  it("is deterministic", () => {
    const text = "记忆注入 memory injection 北京";
    expect(terms(text)).toEqual(terms(text));
  });
});
