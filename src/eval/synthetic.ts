// The synthetic memory-QA set: seeded dialogues in LoCoMo's form in which a user states facts
// about themselves amid small talk, mentions facts about other people (distractors) and changes
// some facts later (the latest value is the answer); then one question per fact the user stated
// and a few about facts never stated (answer "not mentioned", LoCoMo's adversarial category 5).
//
// Every value comes from a vocabulary split into two disjoint halves, `train` and `heldout`, that
// include made-up words: a model trained on the train half can answer a held-out question only by
// copying the value from its memory. The vocabularies are fixed (their own seed), so the halves
// are disjoint whatever seed a set is made with; `values` replaces them per attribute, so anyone
// can make a set with values no model has seen.
import { DkiArgumentError } from "../errors.js";
import { prng } from "../util/prng.js";

export type SynthLanguage = "en" | "zh";
export type SynthSplit = "train" | "heldout";

export interface SynthTurn {
  speaker: string;
  dia_id: string;
  text: string;
}

export interface SynthQuestion {
  question: string;
  answer: string;
  evidence: string[];
  /** 4 single-hop (a fact the user stated), 5 adversarial (never stated: "not mentioned"). */
  category: 4 | 5;
  /** Category 5: a value the question could be mistaken for (a friend's, or one never said), as LoCoMo's field. */
  adversarial_answer?: string;
  /** The attribute asked about (not a LoCoMo field; readers ignore it). */
  attribute: string;
}

export interface SynthSample {
  sample_id: string;
  conversation: Record<string, string | SynthTurn[]>;
  qa: SynthQuestion[];
}

export interface SynthOptions {
  seed: number;
  split: SynthSplit;
  conversations: number;
  languages: readonly SynthLanguage[];
  /** Attribute → values, replacing the built-in vocabulary of those attributes (every split, every language). */
  values?: Readonly<Record<string, readonly string[]>>;
  /**
   * Small-talk exchanges a conversation (default: 4–7 at random). More make longer conversations
   * with the same facts: a user with over 1,000 memory tokens, for the latency of injecting many.
   */
  smallTalk?: number;
  /**
   * Extra facts about friends a conversation (default 0): distractors on any attribute, each its
   * own text, so that a user's memories reach 1,000 tokens and more without repeating themselves.
   */
  friendFacts?: number;
}

/** The answer to a question about something never mentioned (the answer instruction's words). */
export const NOT_MENTIONED = "not mentioned";

type Rand = () => number;
const pick = <T>(r: Rand, xs: readonly T[]): T => xs[Math.floor(r() * xs.length)]!;
const int = (r: Rand, lo: number, hi: number): number => lo + Math.floor(r() * (hi - lo + 1));
function shuffle<T>(r: Rand, xs: T[]): T[] {
  for (let i = xs.length - 1; i > 0; i--) {
    const j = Math.floor(r() * (i + 1));
    [xs[i], xs[j]] = [xs[j]!, xs[i]!];
  }
  return xs;
}

/** How made-up values of an attribute look. */
type Shape = "name" | "place" | "org" | "thing" | "date";

interface Phrasing {
  /** The user states their own value. */
  state: readonly string[];
  /** The user's value changed from {old} to {v}; absent: the attribute is never updated. */
  update?: string;
  /** A friend {f} has value {v}. */
  friend: string;
  question: string;
}

interface Attribute {
  shape: Shape;
  en: Phrasing;
  zh: Phrasing;
  /** Real values; made-up ones are added to them. */
  realEn: readonly string[];
  realZh: readonly string[];
}

export const ATTRIBUTES: Readonly<Record<string, Attribute>> = {
  city: {
    shape: "place",
    en: { state: ["I live in {v}.", "These days I live in {v}."], update: "I moved from {old} to {v} last month.", friend: "My friend {f} lives in {v}.", question: "Which city does the user live in?" },
    zh: { state: ["我住在{v}。", "我现在住在{v}。"], update: "我上个月从{old}搬到了{v}。", friend: "我的朋友{f}住在{v}。", question: "用户住在哪个城市？" },
    realEn: ["Oslo", "Lisbon", "Toronto", "Nairobi", "Osaka", "Lima", "Dublin", "Prague", "Auckland", "Seville", "Krakow", "Denver", "Bergen", "Porto", "Hanoi", "Quito"],
    realZh: ["北京", "上海", "成都", "杭州", "西安", "南京", "武汉", "重庆", "青岛", "厦门", "昆明", "大连"],
  },
  employer: {
    shape: "org",
    en: { state: ["I work at {v}.", "My employer is {v}."], update: "I left {old} and now I work at {v}.", friend: "My friend {f} works at {v}.", question: "Where does the user work?" },
    zh: { state: ["我在{v}工作。", "我的雇主是{v}。"], update: "我离开了{old}，现在在{v}工作。", friend: "我的朋友{f}在{v}工作。", question: "用户在哪里工作？" },
    realEn: ["Siemens", "Nokia", "Oracle", "Lufthansa", "Unilever", "Philips", "Toyota", "Roche", "Spotify", "Airbus", "Heineken", "Ikea"],
    realZh: ["华为", "腾讯", "阿里巴巴", "百度", "小米", "京东", "美团", "网易"],
  },
  pet_name: {
    shape: "name",
    en: { state: ["My dog is called {v}.", "I have a dog named {v}."], friend: "My friend {f} has a dog named {v}.", question: "What is the name of the user's dog?" },
    zh: { state: ["我的狗叫{v}。", "我养了一只狗，名叫{v}。"], friend: "我的朋友{f}有一只狗叫{v}。", question: "用户的狗叫什么名字？" },
    realEn: ["Rex", "Bella", "Max", "Luna", "Charlie", "Daisy", "Buddy", "Milo", "Rocky", "Coco"],
    realZh: ["旺财", "豆豆", "球球", "毛毛", "小黑", "大黄"],
  },
  allergy: {
    shape: "thing",
    en: { state: ["I am allergic to {v}.", "I have an allergy to {v}."], friend: "My friend {f} is allergic to {v}.", question: "What is the user allergic to?" },
    zh: { state: ["我对{v}过敏。"], friend: "我的朋友{f}对{v}过敏。", question: "用户对什么过敏？" },
    realEn: ["peanuts", "shellfish", "pollen", "cats", "penicillin", "dust", "eggs", "soy", "latex", "wasps"],
    realZh: ["花生", "海鲜", "花粉", "猫毛", "青霉素", "灰尘", "鸡蛋", "牛奶"],
  },
  food: {
    shape: "thing",
    en: { state: ["My favourite food is {v}.", "I love eating {v} more than anything."], update: "I used to love {old}, but now my favourite food is {v}.", friend: "My friend {f} loves eating {v}.", question: "What is the user's favourite food?" },
    zh: { state: ["我最喜欢吃{v}。"], update: "我以前最爱{old}，现在最喜欢吃{v}。", friend: "我的朋友{f}喜欢吃{v}。", question: "用户最喜欢吃什么？" },
    realEn: ["lasagna", "sushi", "tacos", "ramen", "paella", "curry", "dumplings", "pancakes", "risotto", "falafel", "goulash", "pierogi"],
    realZh: ["饺子", "火锅", "烤鸭", "面条", "包子", "麻婆豆腐", "炒饭", "粽子"],
  },
  sibling_name: {
    shape: "name",
    en: { state: ["My sister is named {v}.", "I have a sister called {v}."], friend: "My friend {f} has a sister named {v}.", question: "What is the name of the user's sister?" },
    zh: { state: ["我的姐姐叫{v}。", "我有一个姐姐，叫{v}。"], friend: "我的朋友{f}有个姐姐叫{v}。", question: "用户的姐姐叫什么名字？" },
    realEn: ["Emma", "Olivia", "Sophie", "Clara", "Nina", "Julia", "Hannah", "Mia", "Lucy", "Ella"],
    realZh: ["丽丽", "芳芳", "晓梅", "小燕", "婷婷", "静静"],
  },
  birthday: {
    shape: "date",
    en: { state: ["My birthday is on {v}.", "I was born on {v}."], friend: "My friend {f} has a birthday on {v}.", question: "When is the user's birthday?" },
    zh: { state: ["我的生日是{v}。"], friend: "我的朋友{f}的生日是{v}。", question: "用户的生日是哪天？" },
    realEn: [],
    realZh: [],
  },
  car: {
    shape: "org",
    en: { state: ["I drive a {v}.", "My car is a {v}."], update: "I sold my {old} and bought a {v}.", friend: "My friend {f} drives a {v}.", question: "What car does the user drive?" },
    zh: { state: ["我开的车是{v}。"], update: "我卖掉了{old}，买了一辆{v}。", friend: "我的朋友{f}开{v}。", question: "用户开什么车？" },
    realEn: ["Volvo", "Toyota Corolla", "Honda Civic", "Ford Focus", "Tesla", "Skoda", "Fiat Panda", "Subaru", "Mazda", "Peugeot"],
    realZh: ["比亚迪", "红旗", "吉利", "长城", "蔚来", "五菱"],
  },
  hobby: {
    shape: "thing",
    en: { state: ["In my free time I enjoy {v}.", "My hobby is {v}."], update: "I gave up {old} and took up {v}.", friend: "My friend {f} enjoys {v}.", question: "What is the user's hobby?" },
    zh: { state: ["我的爱好是{v}。", "业余时间我喜欢{v}。"], update: "我放弃了{old}，开始{v}。", friend: "我的朋友{f}喜欢{v}。", question: "用户的爱好是什么？" },
    realEn: ["painting", "hiking", "knitting", "chess", "gardening", "pottery", "birdwatching", "climbing", "baking", "fishing"],
    realZh: ["画画", "爬山", "下棋", "钓鱼", "书法", "养花", "摄影", "跑步"],
  },
  job: {
    shape: "thing",
    en: { state: ["My job title is {v}.", "I work as a {v}."], update: "I switched jobs from {old} to {v}.", friend: "My friend {f} works as a {v}.", question: "What is the user's job?" },
    zh: { state: ["我的职业是{v}。", "我是一名{v}。"], update: "我从{old}转行做了{v}。", friend: "我的朋友{f}是一名{v}。", question: "用户的职业是什么？" },
    realEn: ["nurse", "architect", "teacher", "pilot", "chef", "lawyer", "plumber", "dentist", "librarian", "engineer"],
    realZh: ["护士", "建筑师", "老师", "飞行员", "厨师", "律师", "医生", "工程师"],
  },
  color: {
    shape: "thing",
    en: { state: ["My favourite colour is {v}."], friend: "My friend {f} likes the colour {v}.", question: "What is the user's favourite colour?" },
    zh: { state: ["我最喜欢的颜色是{v}。"], friend: "我的朋友{f}喜欢{v}。", question: "用户最喜欢什么颜色？" },
    realEn: ["blue", "green", "red", "yellow", "purple", "orange", "teal", "maroon", "beige", "violet"],
    realZh: ["蓝色", "绿色", "红色", "黄色", "紫色", "橙色", "粉色", "灰色"],
  },
  instrument: {
    shape: "thing",
    en: { state: ["I play the {v}.", "I have been learning to play the {v}."], friend: "My friend {f} plays the {v}.", question: "Which instrument does the user play?" },
    zh: { state: ["我会弹{v}。", "我在学{v}。"], friend: "我的朋友{f}会弹{v}。", question: "用户会什么乐器？" },
    realEn: ["piano", "violin", "cello", "guitar", "flute", "drums", "trumpet", "harp", "banjo", "clarinet"],
    realZh: ["钢琴", "小提琴", "古筝", "二胡", "吉他", "笛子"],
  },
  sport: {
    shape: "thing",
    en: { state: ["My favourite sport is {v}."], friend: "My friend {f} plays {v} every week.", question: "What is the user's favourite sport?" },
    zh: { state: ["我最喜欢的运动是{v}。"], friend: "我的朋友{f}每周都打{v}。", question: "用户最喜欢什么运动？" },
    realEn: ["tennis", "football", "rugby", "cricket", "volleyball", "badminton", "hockey", "golf", "rowing", "handball"],
    realZh: ["乒乓球", "篮球", "足球", "羽毛球", "排球", "游泳"],
  },
  hometown: {
    shape: "place",
    en: { state: ["I grew up in {v}.", "My hometown is {v}."], friend: "My friend {f} grew up in {v}.", question: "Where did the user grow up?" },
    zh: { state: ["我在{v}长大。", "我的老家是{v}。"], friend: "我的朋友{f}在{v}长大。", question: "用户在哪里长大？" },
    realEn: ["Galway", "Leeds", "Graz", "Tartu", "Aarhus", "Ghent", "Malaga", "Bremen", "Turku", "Split"],
    realZh: ["苏州", "洛阳", "桂林", "绍兴", "扬州", "开封"],
  },
  book: {
    shape: "name",
    en: { state: ["My favourite book is {v}.", "The book I love most is {v}."], friend: "My friend {f} keeps rereading {v}.", question: "What is the user's favourite book?" },
    zh: { state: ["我最喜欢的书是{v}。"], friend: "我的朋友{f}最爱读{v}。", question: "用户最喜欢哪本书？" },
    realEn: ["Dune", "Emma", "Ulysses", "Beloved", "Middlemarch", "Rebecca", "Frankenstein", "Dracula"],
    realZh: ["红楼梦", "西游记", "水浒传", "三国演义", "围城", "边城"],
  },
  partner_name: {
    shape: "name",
    en: { state: ["My partner's name is {v}.", "I live with my partner {v}."], friend: "My friend {f} is dating someone called {v}.", question: "What is the name of the user's partner?" },
    zh: { state: ["我的伴侣叫{v}。"], friend: "我的朋友{f}的对象叫{v}。", question: "用户的伴侣叫什么名字？" },
    realEn: ["Daniel", "Lucas", "Sam", "Noah", "Leo", "Adam", "Oscar", "Felix", "Hugo", "Jonas"],
    realZh: ["建国", "志强", "海涛", "子涵", "浩然", "明轩"],
  },
  drink: {
    shape: "thing",
    en: { state: ["I always drink {v} in the morning."], update: "I switched from {old} to {v} in the mornings.", friend: "My friend {f} drinks {v} every morning.", question: "What does the user drink in the morning?" },
    zh: { state: ["我每天早上都喝{v}。"], update: "我早上不再喝{old}，改喝{v}了。", friend: "我的朋友{f}每天早上喝{v}。", question: "用户早上喝什么？" },
    realEn: ["coffee", "green tea", "orange juice", "cocoa", "espresso", "chai", "kefir", "lemonade"],
    realZh: ["豆浆", "咖啡", "绿茶", "牛奶", "红茶", "米汤"],
  },
  university: {
    shape: "org",
    en: { state: ["I studied at {v}.", "I went to university at {v}."], friend: "My friend {f} studied at {v}.", question: "Where did the user study?" },
    zh: { state: ["我在{v}读的大学。"], friend: "我的朋友{f}在{v}上的大学。", question: "用户在哪里读的大学？" },
    realEn: ["Oxford", "Yale", "Uppsala", "Leiden", "Bologna", "Heidelberg", "McGill", "Utrecht"],
    realZh: ["清华大学", "北京大学", "复旦大学", "浙江大学", "南开大学", "同济大学"],
  },
  language: {
    shape: "thing",
    en: { state: ["I am learning {v}.", "I have started learning {v}."], update: "I stopped learning {old} and started learning {v}.", friend: "My friend {f} is learning {v}.", question: "Which language is the user learning?" },
    zh: { state: ["我在学{v}。"], update: "我不学{old}了，开始学{v}。", friend: "我的朋友{f}在学{v}。", question: "用户在学什么语言？" },
    realEn: ["Spanish", "Japanese", "German", "Swahili", "Finnish", "Korean", "Polish", "Greek", "Turkish", "Dutch"],
    realZh: ["日语", "法语", "德语", "韩语", "西班牙语", "俄语"],
  },
  phone: {
    shape: "org",
    en: { state: ["My phone is a {v}.", "I use a {v} phone."], update: "I replaced my {old} with a {v}.", friend: "My friend {f} has a {v} phone.", question: "What phone does the user have?" },
    zh: { state: ["我的手机是{v}。"], update: "我把{old}换成了{v}。", friend: "我的朋友{f}用{v}手机。", question: "用户用什么手机？" },
    realEn: ["Pixel", "iPhone", "Fairphone", "Motorola", "Nokia", "Sony Xperia", "OnePlus", "Galaxy"],
    realZh: ["华为", "小米", "荣耀", "魅族", "锤子", "一加"],
  },
};

export const ATTRIBUTE_NAMES: readonly string[] = Object.keys(ATTRIBUTES);

const SPEAKERS: Record<SynthLanguage, { user: string; assistant: string }> = {
  en: { user: "User", assistant: "Assistant" },
  zh: { user: "用户", assistant: "助手" },
};

const FRIENDS: Record<SynthLanguage, readonly string[]> = {
  en: ["Tom", "Anna", "Raj", "Greta", "Paolo", "Yuki", "Omar", "Ines", "Kofi", "Marta", "Sven", "Lena"],
  zh: ["小王", "老李", "阿强", "小张", "老陈", "小刘", "阿芳", "小赵"],
};

const SMALL_TALK: Record<SynthLanguage, readonly string[]> = {
  en: [
    "The weather was lovely today.", "I had a long day at work.", "I watched a funny film last night.", "Traffic was terrible this morning.",
    "I am thinking about going to bed early.", "Do you have any tips for sleeping better?", "I cleaned the whole flat this weekend.",
    "I tried a new recipe yesterday.", "It has been raining all week.", "I might go for a walk later.", "My back hurts a little today.",
    "I finally finished that puzzle.", "What a busy week it has been.", "I forgot my umbrella again.", "I read an interesting article today.",
  ],
  zh: [
    "今天天气真好。", "今天上班好累。", "昨晚看了一部很搞笑的电影。", "早上堵车很严重。", "我想早点睡觉。", "你有什么助眠的建议吗？",
    "这个周末我把家里打扫了一遍。", "昨天我试了一个新菜谱。", "这周一直在下雨。", "我待会儿可能去散步。", "今天有点腰疼。", "这周真忙。",
  ],
};

const ACKS: Record<SynthLanguage, readonly string[]> = {
  en: ["Good to know!", "Thanks for telling me.", "That sounds nice.", "I will remember that.", "Interesting!", "Noted.", "Oh, really?", "How lovely."],
  zh: ["好的，知道了！", "谢谢你告诉我。", "听起来不错。", "我记住了。", "真有意思！", "原来如此。"],
};

const SMALL_TALK_REPLIES: Record<SynthLanguage, readonly string[]> = {
  en: ["I hope tomorrow is better.", "That happens to everyone.", "Try to get some rest.", "Sounds like a good plan.", "Tell me more if you like."],
  zh: ["希望明天会更好。", "大家都会这样。", "好好休息一下。", "听起来是个好主意。", "愿意的话可以多说说。"],
};

// Made-up words: syllables that spell no common word, so a model cannot know the value beforehand.
const SYLLABLES_EN = ["ka", "lo", "mi", "zu", "ber", "tan", "vel", "qui", "dro", "nex", "sa", "rim", "fo", "gal", "tre", "pu", "xen", "dal", "mor", "wi", "jas", "cor", "ul", "bri"];
// Firms, cars and schools take other syllables, so that no made-up name or place is a firm's first word.
const SYLLABLES_ORG = ["zor", "vex", "quan", "trel", "bax", "nor", "kest", "ryn", "lum", "gor", "fen", "dax", "pim", "sol", "var", "hek"];
const ORG_SUFFIX = ["Labs", "Systems", "Works", "Group", "Studio", "Motors", "Foods", "Tech"];
const HANZI = "岚峤璟翎珂琰芮蔚黛筠瑶霁澜沐昀晗湘蓁菁苒泠棠槿枫柯桐楠榆".split("");
// Names take other characters, so that no name is inside a made-up place, firm or thing.
const HANZI_NAME = "嘉怡欣雨思涵梓萱轩浩宇俊杰婉婷琪雅诗睿瑾彤妍昊翔博文瀚宸泽铭悦彦钰骏皓晟朗熙逸".split("");
const HANZI_THING = "酥糕饼羹卷丸粿酪茗饮露霜晶纹锦绫绮".split("");

function madeUpWord(r: Rand, syllables: readonly string[]): string {
  const n = r() < 0.3 ? 2 : 3;
  let w = "";
  for (let i = 0; i < n; i++) w += pick(r, syllables);
  return w;
}
const capital = (w: string) => w[0]!.toUpperCase() + w.slice(1);

function madeUp(r: Rand, shape: Shape, lang: SynthLanguage): string {
  if (lang === "zh") {
    // Three characters (two before a thing's last one), so no value is inside another's.
    const chars = shape === "name" ? HANZI_NAME : HANZI;
    const w = pick(r, chars) + pick(r, chars) + (shape === "thing" ? "" : pick(r, chars));
    if (shape === "place") return `${w}${pick(r, ["市", "镇", "城"])}`;
    if (shape === "org") return `${w}${pick(r, ["科技", "集团", "公司", "工坊"])}`;
    if (shape === "thing") return `${w}${pick(r, HANZI_THING)}`;
    return w;
  }
  if (shape === "org") return `${capital(madeUpWord(r, SYLLABLES_ORG))} ${pick(r, ORG_SUFFIX)}`;
  const w = madeUpWord(r, SYLLABLES_EN);
  if (shape === "thing") return w;
  return capital(w);
}

const MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];

function dates(lang: SynthLanguage): string[] {
  const out: string[] = [];
  for (let m = 1; m <= 12; m++) for (let d = 1; d <= 28; d++) out.push(lang === "en" ? `${MONTHS[m - 1]} ${d}` : `${m}月${d}日`);
  return out;
}

// Thousands of made-up values an attribute: too many to learn by heart, so a model trained on the
// train half learns to copy a value from its memory (and a tokenizer trained on it learns pieces of
// words, not whole values, so held-out values split into pieces the same way).
const MADE_UP_PER_ATTRIBUTE = 3000;
const VOCABULARY_SEED = 0x5eed;

type Vocabulary = Record<SynthLanguage, Record<string, Record<SynthSplit, string[]>>>;
let builtIn: Vocabulary | null = null;

/**
 * The built-in vocabularies, fixed whatever the set's seed: per language and attribute, the real
 * values and made-up ones, deduplicated across all attributes, then split alternately into train
 * and held-out halves.
 */
export function vocabulary(): Vocabulary {
  if (builtIn) return builtIn;
  const r = prng(VOCABULARY_SEED);
  const v = { en: {}, zh: {} } as Vocabulary;
  for (const lang of ["en", "zh"] as const) {
    // A value belongs to one attribute only ("Nokia" an employer, not also a phone): a word then
    // means one thing, and a value is in one half whatever the attribute.
    const used = new Set<string>();
    for (const name of ATTRIBUTE_NAMES) {
      const a = ATTRIBUTES[name]!;
      const all = a.shape === "date" ? dates(lang) : [...(lang === "en" ? a.realEn : a.realZh)];
      if (a.shape !== "date") for (let i = 0; i < MADE_UP_PER_ATTRIBUTE; i++) all.push(madeUp(r, a.shape, lang));
      const unique = [...new Set(all)].filter((x) => !used.has(x));
      for (const x of unique) used.add(x);
      v[lang][name] = { train: unique.filter((_, i) => i % 2 === 0), heldout: unique.filter((_, i) => i % 2 === 1) };
    }
  }
  builtIn = v;
  return v;
}

/** Checks a `--values` object: known attributes, each a list of at least two distinct non-empty one-line strings. */
export function checkValues(values: unknown, source = "values"): Record<string, string[]> {
  if (values === null || typeof values !== "object" || Array.isArray(values)) throw new DkiArgumentError(`${source}: expected a JSON object of attribute → list of values`);
  const out: Record<string, string[]> = {};
  for (const [k, list] of Object.entries(values)) {
    if (!(k in ATTRIBUTES)) throw new DkiArgumentError(`${source}: unknown attribute ${JSON.stringify(k)} (known: ${ATTRIBUTE_NAMES.join(", ")})`);
    if (!Array.isArray(list) || list.some((s) => typeof s !== "string" || s.trim() === "" || /[\r\n]/.test(s))) {
      throw new DkiArgumentError(`${source}: ${k} must be a list of non-empty one-line strings`);
    }
    const unique = [...new Set(list as string[])];
    if (unique.length < 2) throw new DkiArgumentError(`${source}: ${k} needs at least two distinct values (an update changes one value into another)`);
    out[k] = unique;
  }
  return out;
}

const fill = (template: string, v: Record<string, string>): string => template.replace(/\{(\w+)\}/g, (_, k: string) => v[k]!);

/** What happens in one exchange (a user turn and the assistant's reply). */
type Event =
  | { kind: "state"; attr: string; value: string }
  | { kind: "update"; attr: string; old: string; value: string }
  | { kind: "friend"; attr: string; friend: string; value: string }
  | { kind: "smalltalk" };

function conversation(r: Rand, id: string, lang: SynthLanguage, pools: Record<string, string[]>, o: Pick<SynthOptions, "smallTalk" | "friendFacts">): SynthSample {
  const phr = (a: string) => ATTRIBUTES[a]![lang];
  const attrs = shuffle(r, [...ATTRIBUTE_NAMES]);
  const nStated = int(r, 7, 10);
  const stated = attrs.slice(0, nStated);
  const unstated = attrs.slice(nStated, nStated + int(r, 2, 3));
  const value = (a: string, not: readonly string[] = []) => {
    const pool = pools[a]!;
    for (;;) {
      const v = pick(r, pool);
      if (!not.includes(v)) return v;
    }
  };

  // The facts in the order told; an update comes after its attribute's first statement.
  const own = new Map<string, string>();
  const events: Event[] = [];
  for (const a of stated) {
    const v = value(a);
    own.set(a, v);
    events.push({ kind: "state", attr: a, value: v });
  }
  const updatable = stated.filter((a) => phr(a).update !== undefined);
  for (const a of shuffle(r, updatable).slice(0, int(r, 1, 3))) {
    const old = own.get(a)!;
    const v = value(a, [old]);
    own.set(a, v);
    events.push({ kind: "update", attr: a, old, value: v });
  }
  // Friends' facts: for some unstated attributes (the adversarial questions' bait) and some stated ones.
  const friendAttrs = [...unstated.filter(() => r() < 0.6), ...stated.filter(() => r() < 0.25)];
  const friendValues = new Map<string, string>();
  for (const a of friendAttrs) {
    const v = value(a, own.has(a) ? [own.get(a)!] : []);
    friendValues.set(a, v);
    events.push({ kind: "friend", attr: a, friend: pick(r, FRIENDS[lang]), value: v });
  }
  for (let i = o.friendFacts ?? 0; i > 0; i--) {
    const a = pick(r, ATTRIBUTE_NAMES);
    events.push({ kind: "friend", attr: a, friend: pick(r, FRIENDS[lang]), value: value(a, own.has(a) ? [own.get(a)!] : []) });
  }
  for (let i = o.smallTalk ?? int(r, 4, 7); i > 0; i--) events.push({ kind: "smalltalk" });
  shuffle(r, events);
  // Put each update after its statement (swap the two when the shuffle reversed them).
  for (let i = 0; i < events.length; i++) {
    const e = events[i]!;
    if (e.kind !== "update") continue;
    const j = events.findIndex((x) => x.kind === "state" && x.attr === e.attr);
    if (j > i) [events[i], events[j]] = [events[j]!, events[i]!];
  }

  const sp = SPEAKERS[lang];
  const nSessions = int(r, 3, 5);
  // Session boundaries: nSessions − 1 distinct cut points among the events.
  const cuts = new Set<number>();
  while (cuts.size < nSessions - 1) cuts.add(int(r, 1, events.length - 1));
  const conv: Record<string, string | SynthTurn[]> = { speaker_a: sp.user, speaker_b: sp.assistant };
  const evidence = new Map<string, string>();
  let session = 1;
  let turns: SynthTurn[] = [];
  const day = new Date(Date.UTC(2023, int(r, 0, 11), int(r, 1, 28), int(r, 8, 20), 0));
  const close = () => {
    conv[`session_${session}`] = turns;
    conv[`session_${session}_date_time`] = day.toISOString().slice(0, 16).replace("T", " ");
    day.setUTCDate(day.getUTCDate() + int(r, 1, 20));
    session++;
    turns = [];
  };
  events.forEach((e, i) => {
    if (cuts.has(i)) close();
    let text: string;
    let reply = pick(r, ACKS[lang]);
    if (e.kind === "state") text = fill(pick(r, phr(e.attr).state), { v: e.value });
    else if (e.kind === "update") text = fill(phr(e.attr).update!, { old: e.old, v: e.value });
    else if (e.kind === "friend") text = fill(phr(e.attr).friend, { f: e.friend, v: e.value });
    else {
      text = pick(r, SMALL_TALK[lang]);
      reply = pick(r, SMALL_TALK_REPLIES[lang]);
    }
    const diaId = `D${session}:${turns.length + 1}`;
    turns.push({ speaker: sp.user, dia_id: diaId, text });
    turns.push({ speaker: sp.assistant, dia_id: `D${session}:${turns.length + 1}`, text: reply });
    // The latest statement of the user's own value is the evidence (an update overrides the first).
    if (e.kind === "state" || e.kind === "update") evidence.set(e.attr, diaId);
  });
  close();

  const qa: SynthQuestion[] = [
    ...stated.map((a) => ({ question: phr(a).question, answer: own.get(a)!, evidence: [evidence.get(a)!], category: 4 as const, attribute: a })),
    ...unstated.map((a) => ({
      question: phr(a).question,
      answer: NOT_MENTIONED,
      evidence: [],
      category: 5 as const,
      adversarial_answer: friendValues.get(a) ?? value(a),
      attribute: a,
    })),
  ];
  return { sample_id: id, conversation: conv, qa: shuffle(r, qa) };
}

/** Generates the set; the same options give the same samples (and the same bytes once written). */
export function generateSynthetic(o: SynthOptions): SynthSample[] {
  if (!Number.isSafeInteger(o.seed)) throw new DkiArgumentError(`seed must be an integer, got ${o.seed}`);
  if (o.split !== "train" && o.split !== "heldout") throw new DkiArgumentError(`split must be "train" or "heldout", got ${JSON.stringify(o.split)}`);
  if (!Number.isSafeInteger(o.conversations) || o.conversations < 1) throw new DkiArgumentError(`conversations must be a positive integer, got ${o.conversations}`);
  if (o.languages.length === 0 || o.languages.some((l) => l !== "en" && l !== "zh")) throw new DkiArgumentError(`languages must be en and/or zh, got ${JSON.stringify(o.languages)}`);
  if (o.smallTalk !== undefined && !(Number.isSafeInteger(o.smallTalk) && o.smallTalk >= 0 && o.smallTalk <= 10_000)) throw new DkiArgumentError(`smallTalk must be an integer in [0, 10000], got ${o.smallTalk}`);
  if (o.friendFacts !== undefined && !(Number.isSafeInteger(o.friendFacts) && o.friendFacts >= 0 && o.friendFacts <= 10_000)) throw new DkiArgumentError(`friendFacts must be an integer in [0, 10000], got ${o.friendFacts}`);
  const custom = o.values === undefined ? {} : checkValues(o.values);
  const vocab = vocabulary();
  const r = prng(o.seed);
  const samples: SynthSample[] = [];
  for (let i = 0; i < o.conversations; i++) {
    const lang = o.languages[i % o.languages.length]!;
    const pools: Record<string, string[]> = {};
    for (const a of ATTRIBUTE_NAMES) pools[a] = custom[a] ?? vocab[lang][a]![o.split];
    samples.push(conversation(r, `synth-${o.split}-${o.seed}-${i}`, lang, pools, o));
  }
  return samples;
}

/** The set as the file `dki eval synth` writes. */
export function serializeSynthetic(samples: readonly SynthSample[]): string {
  return JSON.stringify(samples, null, 1) + "\n";
}
