"""Writes models/memory-qa/golden-block-aware.json: what PyTorch computes for the committed models,
for test/memory-qa-model.test.ts to hold the engine to.

  exactness  the block-aware model's logits for injected turns (memories as separate blocks behind
             the encoding prefix, at negative positions) computed with train.py's own `layout` and
             `attention_mask`, from the committed F16 weights: the engine must give the same.
  answers    a few held-out questions, greedy in PyTorch, per model and mode: the engine must
             give the same answers.

    /tmp/hfenv/bin/python models/memory-qa/golden.py [--work tmp/memory-qa] [--models DIR --out FILE]

--models/--out check a retrained pair before it replaces the committed one: the engine test reads
them from DKI_MEMORY_QA_MODELS and DKI_MEMORY_QA_GOLDEN (see test/memory-qa-model.test.ts).

The examples come from export.mjs's held-out rows (prompt ids rendered by the project's code, with
the texts they were rendered from), so the test can also check that the code still renders them so.
"""

import argparse
import json
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train as T  # noqa: E402

# Vocabulary ids whose logits are kept for every position (the full rows only for the last ones).
PROBE_IDS = list(range(0, 4096, 97)) + [T.EOT]


def logits_of(model: T.Llama, row: dict, tokens: list) -> torch.Tensor:
    """Logits at every prompt/answer position of `tokens` (the row's prompt and answer ids), its memories injected."""
    ids, pos, blk, pre = T.layout(tokens, [], row.get("blocks"), row.get("prefix"))
    mask = T.attention_mask(torch.zeros(len(ids), dtype=torch.long), torch.tensor(blk), torch.tensor(pre))[None]
    with torch.no_grad():
        out = model(torch.tensor([ids]), torch.tensor([pos]), mask)[0]
    return out[len(ids) - len(tokens):]


def r6(xs) -> list:
    return [float(f"{x:.6g}") for x in xs]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--work", default=str(T.ROOT / "tmp" / "memory-qa"))
    p.add_argument("--models", default=str(T.ROOT / "models"), help="the folder holding memory-qa-plain and memory-qa-block-aware")
    p.add_argument("--out", default=str(T.HERE / "golden-block-aware.json"))
    a = p.parse_args()
    torch.set_num_threads(2)
    held = T.read_rows(Path(a.work) / "heldout.jsonl")
    rng = random.Random(36)
    block = T.load_model(Path(a.models) / "memory-qa-block-aware").eval()
    plain = T.load_model(Path(a.models) / "memory-qa-plain").eval()

    dki = [r for r in held if r["mode"] == "dki" and r["category"] == 4 and len(r["blocks"]) == 3]
    rng.shuffle(dki)
    exactness = []
    for row in dki[:2] + [r for r in held if r["mode"] == "none"][:1]:
        tokens = row["prompt"] + row["answer"][:-1]
        lg = logits_of(block, row, tokens)
        exactness.append({
            "mode": row["mode"], "prefix": row.get("prefix", []), "blocks": row.get("blocks", []), "tokens": tokens,
            "probe_ids": PROBE_IDS, "probe_logits": [r6(lg[i, PROBE_IDS].tolist()) for i in range(len(tokens))],
            "last_logits": [r6(lg[i].tolist()) for i in range(len(tokens) - 3, len(tokens))],
        })

    answers = []
    for name, model, modes in [("memory-qa-block-aware", block, ["dki", "rag"]), ("memory-qa-plain", plain, ["rag", "full"])]:
        for mode in modes:
            rows = [r for r in held if r["mode"] == mode]
            rng.shuffle(rows)
            for row in rows[:4]:
                got = T.greedy(model, row, "cpu")
                answers.append({"model": name, "mode": mode, "lang": row["lang"], "question": row["question"], "memories": row.get("memories"),
                                "conversation": row.get("conversation"), "expected": row["answerText"], "prompt": row["prompt"],
                                "blocks": row.get("blocks"), "prefix": row.get("prefix"), "pytorch_answer": got, "pytorch_correct": got == row["answer"][:-1]})
    out = Path(a.out)
    out.write_text(json.dumps({"about": "PyTorch (train.py's layout and attention_mask, committed F16 weights) for test/memory-qa-model.test.ts",
                               "exactness": exactness, "answers": answers}, ensure_ascii=False) + "\n")
    right = sum(x["pytorch_correct"] for x in answers)
    print(f"wrote {out}: {len(exactness)} exactness cases, {len(answers)} answers ({right} correct in PyTorch)")


if __name__ == "__main__":
    main()
