// Synthetic long conversations for the Recall v4 tests: a few hundred messages of everyday
// chatter (English or Chinese), with one old message holding the answer to the final question
// and many distractors that share the question's subject but not its answer. Seeded, so a
// failing case replays. Long messages (several sentences) are common, as in real chats.
import { prng } from "./prng.js";

export interface Needle {
  /** The question asked at the end. */
  question: string;
  /** The sentence of the evidence message that answers it. */
  evidence: string;
  answer: string;
  /** Sentences about the same subject that do not answer it. */
  distractors: string[];
}

export interface SyntheticConversation {
  language: "en" | "cn";
  /** Messages in time order, user first, alternating. */
  messages: { role: "user" | "assistant"; content: string }[];
  /** Index of the evidence message. */
  evidenceAt: number;
  needle: Needle;
}

const EN_FILLER = [
  "The weather has been grey all week and I keep forgetting my umbrella.",
  "I tried a new pasta recipe with lemon and garlic last night.",
  "Work was busy, we had three meetings about the quarterly report.",
  "We watched an old science fiction movie and it held up well.",
  "My neighbour started learning the violin, so evenings are lively.",
  "I finished the mystery novel, the ending surprised me.",
  "The tomatoes in the garden are finally turning red.",
  "Traffic on the bridge was terrible this morning.",
  "I signed up for a beginner pottery class on weekends.",
  "The cat knocked a glass off the table again.",
  "I am thinking about repainting the living room a lighter colour.",
  "Our team won the pub quiz by a single point.",
  "The bakery on the corner has a new sourdough loaf.",
  "I went for a long run along the canal at sunrise.",
  "My laptop battery is dying faster than it used to.",
  "We are planning a picnic if the sun comes out.",
  "I reorganised the bookshelf by colour, which looks nice but is impractical.",
  "The podcast about ancient Rome was fascinating.",
];
const EN_ASSISTANT = [
  "That sounds like a lot to juggle; take it one step at a time.",
  "Nice! Let me know how it turns out.",
  "Good to hear. Anything I can help you plan?",
  "That is interesting. Tell me more if you like.",
  "Sounds relaxing. Enjoy it.",
  "I understand. It happens to everyone now and then.",
];
export const EN_NEEDLES: Needle[] = [
  { question: "What time is my dentist appointment with Dr. Okafor?", evidence: "My dentist appointment with Dr. Okafor is on Thursday at 4:30 pm.", answer: "4:30 pm", distractors: ["Dr. Okafor's office is next to the pharmacy.", "I really do not like going to the dentist.", "The dentist said I should floss more often."] },
  { question: "What is the wifi password at the lake cabin?", evidence: "The wifi password at the lake cabin is maple-42-river.", answer: "maple-42-river", distractors: ["The lake cabin has a slow internet connection.", "We might rent the cabin again next summer.", "The wifi at work keeps dropping out."] },
  { question: "Which gate does my sister's flight to Lisbon leave from?", evidence: "My sister's flight to Lisbon leaves from gate B17.", answer: "B17", distractors: ["My sister loves Lisbon and its trams.", "Flights are so expensive this year.", "She is packing light for the trip."] },
  { question: "What is the combination of my gym locker?", evidence: "The combination of my gym locker is 31-07-19.", answer: "31-07-19", distractors: ["The gym was crowded today.", "I forgot my towel at the gym again.", "The locker room needs new benches."] },
  { question: "What oven temperature does grandma's lasagna need?", evidence: "Grandma's lasagna needs the oven at 190 degrees for forty minutes.", answer: "190 degrees", distractors: ["Grandma always made lasagna on Sundays.", "The oven light stopped working.", "Lasagna is better the next day."] },
  { question: "What is the name of the vet clinic Biscuit goes to?", evidence: "Biscuit goes to the Harbourview vet clinic on Mill Street.", answer: "Harbourview", distractors: ["Biscuit hates the car ride to the vet.", "Biscuit chewed another shoe today.", "The vet bill was higher than expected."] },
  { question: "How much did the plumber charge for the kitchen sink?", evidence: "The plumber charged 285 dollars to fix the kitchen sink.", answer: "285", distractors: ["The kitchen sink was leaking for days.", "I could not find a plumber on the weekend.", "The plumber was very friendly."] },
  { question: "What is the license plate of my new car?", evidence: "The license plate of my new car is KX-5521.", answer: "KX-5521", distractors: ["My new car is dark blue.", "I still need to register the new car.", "Parking the car downtown is a nightmare."] },
];

const CN_FILLER = [
  "这周天气一直阴沉沉的，我老是忘记带伞。",
  "昨晚我试着做了一道柠檬大蒜意面。",
  "工作很忙，开了三个关于季度报告的会。",
  "我们看了一部老科幻电影，还挺好看的。",
  "邻居开始学小提琴了，晚上很热闹。",
  "我看完了那本推理小说，结局出乎意料。",
  "花园里的西红柿终于开始变红了。",
  "今天早上桥上堵车堵得厉害。",
  "我报名了周末的陶艺入门课。",
  "猫又把桌上的杯子打翻了。",
  "我在考虑把客厅刷成浅一点的颜色。",
  "我们队在酒吧问答比赛中以一分险胜。",
  "街角的面包店出了新的酸面包。",
  "我日出时沿着运河跑了很久。",
  "我的笔记本电脑电池掉电越来越快。",
  "如果出太阳我们打算去野餐。",
];
const CN_ASSISTANT = ["听起来事情不少，慢慢来。", "不错！告诉我结果如何。", "很好。需要我帮你计划什么吗？", "挺有意思的，愿意的话多说说。", "听起来很放松，好好享受。"];
export const CN_NEEDLES: Needle[] = [
  { question: "我和欧医生的牙科预约是几点？", evidence: "我和欧医生的牙科预约在周四下午四点半。", answer: "四点半", distractors: ["欧医生的诊所在药店旁边。", "我真的不喜欢去看牙医。", "牙医说我应该多用牙线。"] },
  { question: "湖边小屋的无线网密码是什么？", evidence: "湖边小屋的无线网密码是枫叶四十二河。", answer: "枫叶四十二河", distractors: ["湖边小屋的网速很慢。", "明年夏天我们可能还会租那个小屋。", "公司的无线网总是断线。"] },
  { question: "我姐姐去里斯本的航班从哪个登机口出发？", evidence: "我姐姐去里斯本的航班从B17登机口出发。", answer: "B17", distractors: ["我姐姐很喜欢里斯本的有轨电车。", "今年机票太贵了。", "她这次旅行只带了很少的行李。"] },
  { question: "我健身房储物柜的密码是多少？", evidence: "我健身房储物柜的密码是三一零七一九。", answer: "三一零七一九", distractors: ["今天健身房人很多。", "我又把毛巾忘在健身房了。", "更衣室需要换新长椅了。"] },
  { question: "奶奶的千层面需要烤箱多少度？", evidence: "奶奶的千层面需要烤箱一百九十度烤四十分钟。", answer: "一百九十度", distractors: ["奶奶总是在周日做千层面。", "烤箱的灯坏了。", "千层面第二天吃更好吃。"] },
  { question: "饼干去的宠物医院叫什么名字？", evidence: "饼干去的宠物医院叫海景动物医院，在磨坊街。", answer: "海景动物医院", distractors: ["饼干很讨厌坐车去看兽医。", "饼干今天又咬坏了一只鞋。", "兽医的账单比预想的高。"] },
];

function pick<T>(r: () => number, xs: readonly T[]): T {
  return xs[Math.floor(r() * xs.length)]!;
}

/** A user message: one to five filler sentences (a third of them long). */
function chatter(r: () => number, filler: readonly string[], joiner: string): string {
  const n = r() < 0.35 ? 6 + Math.floor(r() * 6) : 1 + Math.floor(r() * 2);
  return Array.from({ length: n }, () => pick(r, filler)).join(joiner);
}

/**
 * `turns` user/assistant pairs; the evidence sits in a long user message in the first 40%, the
 * distractors scattered after it, some of them in the newest turns.
 */
export function syntheticConversation(seed: number, language: "en" | "cn", turns = 120, shortDistractors = 14): SyntheticConversation {
  const r = prng(seed);
  const [filler, assistant, needles, joiner] = language === "en" ? [EN_FILLER, EN_ASSISTANT, EN_NEEDLES, " "] : [CN_FILLER, CN_ASSISTANT, CN_NEEDLES, ""];
  const needle = needles[seed % needles.length]!;
  const evidenceTurn = 3 + Math.floor(r() * Math.floor(turns * 0.4));
  const distractorTurns = new Map<number, string>();
  const later = () => evidenceTurn + 1 + Math.floor(r() * (turns - evidenceTurn - 1));
  for (const d of needle.distractors) for (let k = 0; k < 2; k++) distractorTurns.set(later(), `${chatter(r, filler, joiner)}${joiner}${d}`);
  // The subject comes up again and again in short messages (two distractors each): they share
  // more of the question's words per term than the long evidence message does, which is what
  // BM25's length normalisation rewards.
  const ds = needle.distractors;
  for (let k = 0; k < shortDistractors; k++) distractorTurns.set(later(), `${ds[k % ds.length]}${joiner}${ds[(k + 1) % ds.length]}`);
  const messages: SyntheticConversation["messages"] = [];
  let evidenceAt = -1;
  for (let t = 0; t < turns; t++) {
    let user = chatter(r, filler, joiner);
    if (t === evidenceTurn) {
      // A long message, the evidence in its middle.
      const before = Array.from({ length: 4 }, () => pick(r, filler));
      const after = Array.from({ length: 4 }, () => pick(r, filler));
      user = [...before, needle.evidence, ...after].join(joiner);
      evidenceAt = messages.length;
    } else if (distractorTurns.has(t)) {
      user = distractorTurns.get(t)!;
    }
    messages.push({ role: "user", content: user });
    messages.push({ role: "assistant", content: pick(r, assistant) });
  }
  return { language, messages, evidenceAt, needle };
}
