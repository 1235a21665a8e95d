// A labelled corpus for reranking (written by the tests, no download): a company handbook whose
// passages share vocabulary, with queries that each need the passage answering all their parts.
// Distractors match one part of a query strongly (the same word several times, or the topic) and
// miss the rest: the case where fusing ranks alone puts them first.
export const RERANK_DOCS: { id: string; text: string }[] = [
  { id: "vac-part", text: "Part-time staff earn paid leave in proportion to their contracted hours." },
  { id: "vac-full", text: "Vacation, vacation planning and vacation requests: full-time staff plan their vacation with their manager." },
  { id: "vac-carry", text: "Unused vacation days carry over to the next year, up to five days." },
  { id: "days-gym", text: "The gym opens on all days, days of holidays included, except Sunday." },
  { id: "park-ev", text: "Electric cars charge for free at the garage's twelve charging points on level two." },
  { id: "park-lottery", text: "Garage spaces are assigned by lottery; garage access needs a badge, and the garage closes at night." },
  { id: "park-bike", text: "Bicycles park in the locked room next to the garage entrance." },
  { id: "exp-hotel", text: "Hotel costs on business trips are refunded up to 150 euros a night with a receipt." },
  { id: "exp-meal", text: "Meals on business trips: trips, trips abroad and trips at home get a daily meal allowance of 30 euros." },
  { id: "exp-form", text: "Expense reports are filed in the finance portal within 30 days of the trip." },
  { id: "it-laptop", text: "A lost laptop must be reported to the IT help desk within 24 hours so it can be locked remotely." },
  { id: "it-password", text: "Passwords, password rules, password changes: the password expires every 90 days." },
  { id: "it-vpn", text: "Remote access goes through the VPN; install the VPN client from the IT portal." },
  { id: "health-dental", text: "Dental care is covered by the company health insurance after a three-month waiting period." },
  { id: "health-card", text: "Insurance cards, insurance numbers and insurance questions go to the insurance desk on floor one." },
  { id: "train-budget", text: "Every employee has a training budget of 1200 euros a year for courses and conferences." },
  { id: "train-conf", text: "Conferences, conference talks and conference travel need approval by the head of department." },
];

/** Each query and the passages that answer it (relevance 1; all others 0). */
export const RERANK_QUERIES: { query: string; relevant: string[] }[] = [
  { query: "how do part-time staff earn vacation", relevant: ["vac-part"] },
  { query: "where can electric cars charge in the garage", relevant: ["park-ev"] },
  { query: "meal allowance per day on business trips", relevant: ["exp-meal"] },
  { query: "how often does my password expire in days", relevant: ["it-password"] },
  { query: "is dental care covered by the insurance", relevant: ["health-dental"] },
  { query: "training budget for conferences per year", relevant: ["train-budget"] },
  { query: "do unused vacation days carry over", relevant: ["vac-carry"] },
  { query: "report a lost laptop to IT", relevant: ["it-laptop"] },
  { query: "conference travel budget each year", relevant: ["train-budget"] },
  { query: "garage badge for bicycles", relevant: ["park-bike"] },
  { query: "insurance waiting period for dental", relevant: ["health-dental"] },
  { query: "refund for hotel nights with receipt on trips", relevant: ["exp-hotel"] },
  { query: "password for the VPN client", relevant: ["it-vpn"] },
  { query: "vacation requests for part-time hours", relevant: ["vac-part"] },
  { query: "days to file expense reports after trips", relevant: ["exp-form"] },
  { query: "charging points level two", relevant: ["park-ev"] },
];

/** nDCG@k of a ranking against binary labels. */
export function ndcgAt(k: number, ranked: readonly string[], relevant: readonly string[]): number {
  const rel = new Set(relevant);
  let dcg = 0;
  ranked.slice(0, k).forEach((id, i) => {
    if (rel.has(id)) dcg += 1 / Math.log2(i + 2);
  });
  let ideal = 0;
  for (let i = 0; i < Math.min(k, rel.size); i++) ideal += 1 / Math.log2(i + 2);
  return ideal === 0 ? 0 : dcg / ideal;
}
