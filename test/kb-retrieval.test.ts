// Retrieval quality on a labelled corpus built here (English and Chinese): every question has one
// document that answers it, among documents that share its vocabulary. Hybrid (dense + BM25 fused
// by RRF) must recall at least as many answers in its top 5 as either arm alone; the figures are
// printed. Also: filters restrict results structurally, the threshold cuts, and expansion works.
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { KnowledgeBase } from "../src/rag/kb/knowledge-base.js";
import { parseRewrites } from "../src/rag/kb/search.js";
import { HashingEmbedder } from "../src/memory/embedders/hashing.js";
import { Tokenizer } from "../src/tokenizer/tokenizer.js";
import { smollm2Tokenizer, tempDir } from "./support/paths.js";

/** [docId, category, text]: each document answers the questions labelled with its id. */
const DOCS: [string, string, string][] = [
  ["leave", "hr", "Annual leave: every employee gets 25 days of paid vacation a year. Unused vacation days carry over until the end of March. Requests go to your manager two weeks ahead."],
  ["sick", "hr", "Sick leave: tell your manager before 10 am on the first day of illness. From the fourth consecutive sick day a doctor's certificate is required. Sick days do not reduce vacation."],
  ["parental", "hr", "Parental leave lasts 16 weeks at full pay for every new parent, to be taken within the child's first year. It can be split into at most three blocks."],
  ["remote", "hr", "Remote work: staff may work from home up to three days a week. Core hours are 10:00 to 15:00 in the office time zone. Laptops must use the company VPN."],
  ["expenses", "finance", "Expense claims are filed in the finance portal within 30 days with a scan of each receipt. Claims above 500 euros need a director's approval. Refunds arrive with the next salary."],
  ["travel", "finance", "Business travel: book trains for trips under four hours and economy flights otherwise. Hotels are capped at 150 euros a night, 220 in London, Paris and Tokyo."],
  ["meals", "finance", "Meal allowance on business trips is 45 euros a day; breakfast included in a hotel rate lowers it by 10 euros. Alcohol is never reimbursed."],
  ["laptop", "it", "Every new hire receives a 14-inch laptop with 32 GB of memory. A broken laptop is replaced within two working days by the IT helpdesk on the second floor."],
  ["password", "it", "Passwords must be at least 14 characters and are rotated only after a suspected leak. Two-factor authentication with a hardware key is mandatory for email and the VPN."],
  ["printer", "it", "The printers on each floor print double-sided by default. Colour printing needs a personal badge tap. Paper jams are reported to facilities, not to IT."],
  ["parking", "facilities", "The garage under building B has 120 parking spaces, assigned by lottery every January. Bicycles park free in the courtyard racks; electric cars charge on level -2."],
  ["canteen", "facilities", "The canteen serves lunch from 11:30 to 14:00; a vegetarian dish and a vegan dish are offered every day. Lunch costs 6 euros for staff, paid by badge."],
  ["gym", "facilities", "The company gym on the roof is open from 6 am to 10 pm. Yoga classes run Tuesday and Thursday evenings; towels are provided at the front desk."],
  ["onboarding", "hr", "Onboarding takes two weeks: the first week covers tools and security training, the second shadowing a buddy from your team. Your buddy is assigned by your manager."],
  ["security", "it", "Report phishing emails with the report button in the mail client. Lost badges must be reported to security within one hour so they can be blocked."],
  ["volcano", "science", "Mount Erebus in Antarctica is the southernmost active volcano on Earth and holds a persistent lava lake in its summit crater."],
  ["bees", "science", "Honey bees communicate the direction and distance of flowers with the waggle dance; the angle of the run against gravity encodes the direction relative to the sun."],
  ["octopus", "science", "An octopus has three hearts and blue blood: copper-based hemocyanin carries its oxygen. Two hearts pump blood through the gills and one through the body."],
  ["餐厅", "food", "公司附近的素食餐厅绿碗位于朝阳区三里屯，人均消费八十元，周一休息，午餐时间需要提前预订。"],
  ["年假", "hr", "员工每年享有十五天带薪年假，未休完的年假可以顺延到次年三月底，请假需提前两周向直属经理申请。"],
  ["报销", "finance", "差旅费用需要在三十天内通过财务系统提交报销，并附上发票扫描件，超过五千元的报销需要总监审批。"],
  ["班车", "facilities", "公司班车每天早上七点半从望京地铁站出发，晚上六点从公司返回，节假日停运。"],
  ["食堂", "facilities", "员工食堂午餐时间是十一点半到一点半，每天提供一道素菜和一道清真菜，刷工卡付款，每餐十五元。"],
  ["健身房", "facilities", "健身房位于五楼，早上六点到晚上十点开放，每周二和周四晚上有瑜伽课，需要提前在小程序上报名。"],
  ["密码", "it", "系统密码至少十四位，只在怀疑泄露时才需要更换，登录邮箱和内网必须使用硬件密钥进行双重认证。"],
  ["长城", "travel", "慕田峪长城距离北京市区约七十公里，植被覆盖率高，有缆车和滑道，春秋两季游客最多。"],
  ["故宫", "travel", "故宫博物院每周一闭馆，门票需要提前七天在官网实名预约，旺季每天限流三万人。"],
  ["熊猫", "science", "大熊猫每天要花十多个小时进食，主要吃竹子，成年大熊猫一天能吃十二到三十八公斤竹子。"],
  ["停车", "facilities", "B座地下车库共有一百二十个车位，每年一月摇号分配，电动车充电桩在负二层。"],
  ["入职", "hr", "新员工入职培训为期两周，第一周学习工具和信息安全，第二周跟随导师熟悉团队工作。"],
];

/** [question, docId]. Paraphrased: few questions repeat their document's wording. */
const QUESTIONS: [string, string][] = [
  ["How many vacation days do I get per year?", "leave"],
  ["Until when can I use leftover holiday days?", "leave"],
  ["When do I need a doctor's note for being ill?", "sick"],
  ["How long is paid leave for a new mother or father?", "parental"],
  ["How many days per week can I work from home?", "remote"],
  ["What are the core hours when working remotely?", "remote"],
  ["Who must approve an expense claim over 500 euros?", "expenses"],
  ["What is the hotel price limit in Paris?", "travel"],
  ["Should I take the train or fly for a three hour trip?", "travel"],
  ["What is the daily food allowance when travelling?", "meals"],
  ["Is wine reimbursed on business trips?", "meals"],
  ["How much RAM does the laptop for new employees have?", "laptop"],
  ["How long must my password be?", "password"],
  ["Do I need a badge to print in colour?", "printer"],
  ["How are garage parking spots allocated?", "parking"],
  ["Where can I charge my electric car?", "parking"],
  ["Is there a vegan option for lunch?", "canteen"],
  ["When is the rooftop gym open?", "gym"],
  ["What happens in the second week of onboarding?", "onboarding"],
  ["What should I do if I lose my access badge?", "security"],
  ["Which is the most southern active volcano?", "volcano"],
  ["How do bees tell each other where flowers are?", "bees"],
  ["How many hearts does an octopus have?", "octopus"],
  ["朝阳区的素食餐厅人均多少钱？", "餐厅"],
  ["每年有几天带薪假期？", "年假"],
  ["超过五千元的费用报销谁来审批？", "报销"],
  ["班车早上几点从地铁站发车？", "班车"],
  ["食堂有清真菜吗？", "食堂"],
  ["瑜伽课是星期几？", "健身房"],
  ["密码需要多长？", "密码"],
  ["慕田峪长城离市区多远？", "长城"],
  ["故宫门票要提前几天预约？", "故宫"],
  ["大熊猫一天吃多少竹子？", "熊猫"],
  ["地下车库的车位怎么分配？", "停车"],
  ["新员工培训第一周学什么？", "入职"],
  ["新人入职要多久？", "入职"],
];

let tok: Tokenizer;
let kb: KnowledgeBase;

beforeAll(async () => {
  tok = await Tokenizer.fromFolder(smollm2Tokenizer);
  kb = await KnowledgeBase.open({ dir: tempDir(), embedder: new HashingEmbedder(), tokenizer: tok });
  for (const [docId, category, text] of DOCS) await kb.ingestText(text, { collection: "corpus", docId, metadata: { category, source: /[\u4e00-\u9fff]/.test(text) ? "zh" : "en" } });
});
afterAll(async () => {
  await kb.close();
});

async function recallAt5(mode: "hybrid" | "dense" | "bm25", lang?: "en" | "zh"): Promise<{ hits: number; total: number; misses: string[] }> {
  let hits = 0;
  let total = 0;
  const misses: string[] = [];
  for (const [q, doc] of QUESTIONS) {
    const zh = /[\u4e00-\u9fff]/.test(q);
    if (lang !== undefined && (lang === "zh") !== zh) continue;
    total++;
    const r = await kb.search(q, { collection: "corpus", limit: 5, mode });
    if (r.some((x) => x.chunk.docId === doc)) hits++;
    else misses.push(q);
  }
  return { hits, total, misses };
}

describe("retrieval quality (labelled corpus, English and Chinese)", () => {
  test("hybrid recall@5 ≥ dense-only and ≥ BM25-only, overall and per language", async () => {
    expect(QUESTIONS.length).toBeGreaterThanOrEqual(30);
    const rows: string[] = [];
    const all: Record<string, number> = {};
    for (const lang of [undefined, "en", "zh"] as const) {
      const r = { hybrid: await recallAt5("hybrid", lang), dense: await recallAt5("dense", lang), bm25: await recallAt5("bm25", lang) };
      rows.push(`${lang ?? "all"}: hybrid ${r.hybrid.hits}/${r.hybrid.total}, dense ${r.dense.hits}/${r.dense.total}, bm25 ${r.bm25.hits}/${r.bm25.total}` + (r.hybrid.misses.length ? `; hybrid misses: ${r.hybrid.misses.join(" | ")}` : ""));
      expect(r.hybrid.hits).toBeGreaterThanOrEqual(r.dense.hits);
      expect(r.hybrid.hits).toBeGreaterThanOrEqual(r.bm25.hits);
      if (lang === undefined) Object.assign(all, { hybrid: r.hybrid.hits / r.hybrid.total, dense: r.dense.hits / r.dense.total, bm25: r.bm25.hits / r.bm25.total });
    }
    console.log(`recall@5 on ${QUESTIONS.length} questions over ${DOCS.length} documents:\n  ${rows.join("\n  ")}`);
    // A floor that a broken arm or fusion would fall through (random top-5 of 30 documents: ~17%).
    expect(all.hybrid).toBeGreaterThanOrEqual(0.8);
  });

  test("a filter restricts results to the documents it selects; the threshold cuts weak matches", async () => {
    const r = await kb.search("How many days?", { collection: "corpus", limit: 10, filter: { eq: { category: "hr" } } });
    expect(r.length).toBeGreaterThan(0);
    for (const x of r) expect(kb.getDocument("corpus", x.chunk.docId)!.fields.category).toBe("hr");
    const zh = await kb.search("地下车库的车位", { collection: "corpus", limit: 10, filter: { and: [{ eq: { source: "zh" } }, { in: { category: ["facilities", "it"] } }] } });
    expect(zh[0].chunk.docId).toBe("停车");
    for (const x of zh) expect(["facilities", "it"]).toContain(kb.getDocument("corpus", x.chunk.docId)!.fields.category);
    const loose = await kb.search("octopus hearts", { collection: "corpus", limit: 10 });
    const strict = await kb.search("octopus hearts", { collection: "corpus", limit: 10, minScore: 0.2 });
    expect(strict.length).toBeLessThan(loose.length);
    expect(strict[0].chunk.docId).toBe("octopus");
    for (const x of strict) expect(x.signals.dense).toBeGreaterThanOrEqual(0.2);
    // Results carry their source and scores in [0, 1].
    expect(strict[0].source).toMatchObject({ collection: "corpus", docId: "octopus", start: 0 });
    for (const x of loose) expect(x.score).toBeGreaterThan(0), expect(x.score).toBeLessThanOrEqual(1);
    await expect(kb.search("x", { collection: "corpus", filter: { eq: { colour: "red" } } })).rejects.toThrow(/unknown field "colour"/);
    await expect(kb.search("x", { collection: "corpus", minScore: 2 })).rejects.toThrow(/minScore must be in \[0, 1\]/);
    await expect(kb.search("  ", { collection: "corpus" })).rejects.toThrow(/query must be a non-empty string/);
  });

  test("multi-query and HyDE search with what the model wrote (here a fixed writer standing for it)", async () => {
    const prompts: string[] = [];
    // The generator is the caller's model; a deterministic one shows what each query contributes.
    const generate = async (prompt: string) => {
      prompts.push(prompt);
      return prompt.startsWith("Write 2") ? "1. cephalopod circulatory system\n2. \"how many hearts does an octopus have\"\n- blue blood copper" : "The octopus pumps hemocyanin blood with three hearts.";
    };
    const d = await kb.searchDetailed("sea animal with several hearts", { collection: "corpus", limit: 3, expand: { multiQuery: 2, hyde: true, generate } });
    expect(d.queries).toEqual(["sea animal with several hearts", "cephalopod circulatory system", "how many hearts does an octopus have"]);
    expect(d.hydeText).toBe("The octopus pumps hemocyanin blood with three hearts.");
    expect(d.results[0].chunk.docId).toBe("octopus");
    expect(prompts).toHaveLength(2);
    expect(parseRewrites("1) a b c\n2) a b c\n\n3、另一个问题", "x", 5)).toEqual(["a b c", "另一个问题"]);
  });
});
