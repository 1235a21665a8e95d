#!/usr/bin/env bash
# Reruns every memory-QA report in bench/results from the committed models, in the order the
# README's "Findings (answer quality)" cites them: the harness on the held-out synthetic test set
# (seed 7) for both models with both routings, the long set (seed 8) for the block-aware model, the
# part-3 block fixes on the plain model with the cross-encoder's routing (EM printed, not a report),
# the gate on the cross-encoder's score against forced α on the validation set (seed 37; never the
# test set: bench/results/memory-qa-gate-validation.md), the sweeps on the plain model, and DKI against RAG at 256–1,536 memory tokens on the block-aware model.
#
#   bash bench/memory-qa-reports.sh [harness|long|fixes|gate|sweeps|dki-vs-rag]...   (default: all six)
#
# Scores do not depend on the machine; latencies do: run it on a quiet machine (nothing else on the
# cores; the reports note the load average). ~15 minutes on 2 cores. Needs `npm install` first.
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${*:-harness long fixes gate sweeps dki-vs-rag}"
work=tmp/memory-qa-reports # the harness resumes from its JSONL: a fresh folder makes a fresh run
seed7=bench/data/memory-qa-synth-heldout-seed7.json
seed8=bench/data/memory-qa-synth-heldout-long-seed8.json
reranker=(--rerank-model models/memory-qa-reranker --rerank-depth 100)
rerank=("${reranker[@]}" --config bench/data/memory-qa-dki-config.json)
eval_memory() { node bin/dki.js eval memory --alpha 1 --threads 1 "$@" > /dev/null; }
# The dki mode alone, routed by the cross-encoder: prints its EM, EM on the answerable questions and
# abstention (%), and the number of answerable questions.
dki_scores() {
  node bin/dki.js eval memory --threads 1 --modes dki "${reranker[@]}" "$@" 2> /dev/null |
    node -e 'let s = ""; process.stdin.on("data", (d) => (s += d)).on("end", () => { const m = JSON.parse(s).modes[0]; const p = (x) => (100 * x).toFixed(1); console.log(p(m.em), p(m.em_answerable), p(m.abstention), m.n_answerable); })'
}
has() { [[ " $steps " == *" $1 "* ]]; }

if has harness; then
  for m in plain block-aware; do
    rm -rf "$work/$m" "$work/$m-rerank"
    eval_memory --model "models/memory-qa-$m" --data "$seed7" --out "$work/$m" --report "bench/results/memory-qa-$m-synth-heldout"
    eval_memory --model "models/memory-qa-$m" --data "$seed7" --out "$work/$m-rerank" "${rerank[@]}" --report "bench/results/memory-qa-$m-synth-heldout-rerank"
  done
fi
if has long; then
  rm -rf "$work/long" "$work/long-rerank"
  # every memory of a user routed (~118, ~1K tokens): TTFT at >= 1K memory tokens
  eval_memory --model models/memory-qa-block-aware --data "$seed8" --out "$work/long" --modes none,full,rag,dki --top-k 200 --report bench/results/memory-qa-block-aware-synth-heldout-long
  eval_memory --model models/memory-qa-block-aware --data "$seed8" --out "$work/long-rerank" "${rerank[@]}" --report bench/results/memory-qa-block-aware-synth-heldout-long-rerank
fi
if has fixes; then
  # The same routing as the -rerank reports (the evidence always among the 3, best last), dki only.
  for fix in '{"kind":"epic","recomputeTokens":4}' '{"kind":"epic","recomputeTokens":16}' '{"kind":"cacheblend","ratio":0.15}' '{"kind":"ape","temperature":0.8,"scale":1}'; do
    name=$(node -e 'const f = JSON.parse(process.argv[1]); console.log(Object.values(f).join("-"))' "$fix")
    mkdir -p "$work/fix-$name" && echo "{\"memoryOrder\": \"score-last\", \"blockFix\": $fix}" > "$work/fix-$name.json"
    scores=$(dki_scores --alpha 1 --model models/memory-qa-plain --data "$seed7" --out "$work/fix-$name" --config "$work/fix-$name.json" --report "$work/fix-$name/report")
    read -r _ answerable _ n <<< "$scores"
    echo "$fix: dki EM on answerable $answerable% ($n)"
  done
fi
if has gate; then
  # The validation set: the 100 held-out conversations of seed 37 the reranker was validated on.
  val="$work/validation-seed37.json"
  node bin/dki.js eval synth --split heldout --conversations 100 --seed 37 --out "$val" 2> /dev/null
  table=bench/results/memory-qa-gate-validation.md
  {
    echo "# memory-qa-gate-validation"
    echo
    echo "The block-aware model's dki mode with the cross-encoder routing (top 3 of all of a user's memories, best last) on 500"
    echo "questions (seed-1 order) of the validation set (dki eval synth --split heldout --conversations 100 --seed 37), α forced"
    echo "to 1 against the gate reading the reranker's score (relevanceSignal \"rerank\", α clamped to 1) at each τ."
    echo "EM: over all questions (an unanswerable one is right when answered \"not mentioned\"). $(date -u +%FT%TZ), $(nproc) cores."
    echo
    echo "| setting | EM | EM answerable | abstention |"
    echo "| --- | ---: | ---: | ---: |"
  } > "$table"
  for tau in forced 0.05 0.1 0.2 0.3 0.5 0.7; do
    out="$work/gate-$tau"
    rm -rf "$out" && mkdir -p "$out"
    if [ "$tau" = forced ]; then
      echo '{"memoryOrder": "score-last"}' > "$out.json"; alpha=(--alpha 1); setting="α forced to 1"
    else
      echo "{\"memoryOrder\": \"score-last\", \"gating\": {\"relevanceSignal\": \"rerank\", \"relevanceThreshold\": $tau, \"alphaMin\": 1, \"alphaMax\": 1}}" > "$out.json"; alpha=(); setting="gated, τ $tau"
    fi
    scores=$(dki_scores "${alpha[@]}" --model models/memory-qa-block-aware --data "$val" --out "$out" --limit 500 --seed 1 --config "$out.json" --report "$out/report")
    read -r em answerable abstention _ <<< "$scores"
    echo "| $setting | $em | $answerable | $abstention |" >> "$table"
  done
  { echo; echo "The reranker's top score among a user's memories, by question (bench/reranker-scores.mjs on the forced run):"; echo
    node bench/reranker-scores.mjs "$work/gate-forced"; } >> "$table"
  cat "$table"
fi
if has sweeps; then
  node bench/memory-sweeps.js --data "$seed7" --limit 120 --harness \
    --note "models/memory-qa-plain as committed (it answers from memory as text, never trained on blocks); 120 held-out questions of dki eval synth --split heldout --conversations 20 --seed 7, seed-1 order"
fi
if has dki-vs-rag; then
  node bench/dki-vs-rag.js --model models/memory-qa-block-aware --memory-tokens 16 --sizes 0,256,512,1024,1536
fi
