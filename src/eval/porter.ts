// The Porter stemmer as Martin Porter published it (1980, "An algorithm for suffix stripping"),
// rule for rule; words of one or two letters are left alone, as in his reference implementation.
// LoCoMo's scorer stems with NLTK's PorterStemmer, whose default mode adds a few extensions to
// the original (e.g. "dying" → "die", "-ies" → "-i" only after two letters); they change the stem
// of rare words and almost never a token F1 between an answer and a prediction of the same words.
//
// A word is [C](VC)^m[V] with C and V runs of consonants and vowels; m is its measure. y is a
// consonant at the start of a word or after a vowel, a vowel after a consonant.

function isConsonant(w: string, i: number): boolean {
  const c = w[i];
  if (c === "a" || c === "e" || c === "i" || c === "o" || c === "u") return false;
  if (c === "y") return i === 0 ? true : !isConsonant(w, i - 1);
  return true;
}

/** m of the word's first `len` letters. */
function measure(w: string, len: number): number {
  let m = 0;
  let i = 0;
  while (i < len && isConsonant(w, i)) i++;
  while (i < len) {
    while (i < len && !isConsonant(w, i)) i++;
    if (i >= len) break;
    while (i < len && isConsonant(w, i)) i++;
    m++;
  }
  return m;
}

/** *v*: the first `len` letters hold a vowel. */
function hasVowel(w: string, len: number): boolean {
  for (let i = 0; i < len; i++) if (!isConsonant(w, i)) return true;
  return false;
}

/** *d: the first `len` letters end in a double consonant. */
function doubleConsonant(w: string, len: number): boolean {
  return len >= 2 && w[len - 1] === w[len - 2] && isConsonant(w, len - 1);
}

/** *o: the first `len` letters end consonant-vowel-consonant, the last not w, x or y. */
function cvc(w: string, len: number): boolean {
  if (len < 3 || !isConsonant(w, len - 1) || isConsonant(w, len - 2) || !isConsonant(w, len - 3)) return false;
  const c = w[len - 1];
  return c !== "w" && c !== "x" && c !== "y";
}

type Rule = [suffix: string, replacement: string];

/**
 * The step's rule for the longest suffix the word ends with; when the stem before it meets
 * `condition`, the suffix is replaced. Only that rule is tried (Porter: "the longest matching S1").
 */
function applyLongest(w: string, rules: readonly Rule[], condition: (stemLen: number) => boolean): string {
  let best: Rule | null = null;
  for (const r of rules) if (w.endsWith(r[0]) && (best === null || r[0].length > best[0].length)) best = r;
  if (best === null) return w;
  const stemLen = w.length - best[0].length;
  return condition(stemLen) ? w.slice(0, stemLen) + best[1] : w;
}

const STEP2: readonly Rule[] = [
  ["ational", "ate"], ["tional", "tion"], ["enci", "ence"], ["anci", "ance"], ["izer", "ize"], ["abli", "able"],
  ["alli", "al"], ["entli", "ent"], ["eli", "e"], ["ousli", "ous"], ["ization", "ize"], ["ation", "ate"],
  ["ator", "ate"], ["alism", "al"], ["iveness", "ive"], ["fulness", "ful"], ["ousness", "ous"], ["aliti", "al"],
  ["iviti", "ive"], ["biliti", "ble"],
];
const STEP3: readonly Rule[] = [["icate", "ic"], ["ative", ""], ["alize", "al"], ["iciti", "ic"], ["ical", "ic"], ["ful", ""], ["ness", ""]];
const STEP4 = ["al", "ance", "ence", "er", "ic", "able", "ible", "ant", "ement", "ment", "ent", "ion", "ou", "ism", "ate", "iti", "ous", "ive", "ize"].map((s): Rule => [s, ""]);

/** The Porter stem of one lower-case word. */
export function porterStem(word: string): string {
  let w = word;
  if (w.length <= 2) return w;

  // Step 1a.
  w = applyLongest(w, [["sses", "ss"], ["ies", "i"], ["ss", "ss"], ["s", ""]], () => true);

  // Step 1b.
  if (w.endsWith("eed")) {
    if (measure(w, w.length - 3) > 0) w = w.slice(0, -1);
  } else {
    const suffix = w.endsWith("ed") ? "ed" : w.endsWith("ing") ? "ing" : null;
    if (suffix !== null && hasVowel(w, w.length - suffix.length)) {
      w = w.slice(0, -suffix.length);
      if (w.endsWith("at") || w.endsWith("bl") || w.endsWith("iz")) w += "e";
      else if (doubleConsonant(w, w.length) && !/[lsz]$/.test(w)) w = w.slice(0, -1);
      else if (measure(w, w.length) === 1 && cvc(w, w.length)) w += "e";
    }
  }

  // Step 1c.
  if (w.endsWith("y") && hasVowel(w, w.length - 1)) w = w.slice(0, -1) + "i";

  w = applyLongest(w, STEP2, (n) => measure(w, n) > 0);
  w = applyLongest(w, STEP3, (n) => measure(w, n) > 0);
  w = applyLongest(w, STEP4, (n) => measure(w, n) > 1 && (!w.endsWith("ion") || /[st]$/.test(w.slice(0, n))));

  // Step 5a.
  if (w.endsWith("e")) {
    const m = measure(w, w.length - 1);
    if (m > 1 || (m === 1 && !cvc(w, w.length - 1))) w = w.slice(0, -1);
  }
  // Step 5b.
  if (measure(w, w.length) > 1 && doubleConsonant(w, w.length) && w.endsWith("l")) w = w.slice(0, -1);
  return w;
}
