// Ranking quality against labelled relevance, shared by the rerank tests and bench/rag-pipeline.js.

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
