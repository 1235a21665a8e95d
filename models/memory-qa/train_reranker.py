"""Trains models/memory-qa-reranker: a small BERT cross-encoder that scores how well one memory
answers a question, exported to ONNX for the engine's OnnxCrossEncoder.

Why: the offline hashing embedder routes the evidence of a held-out synthetic question into the
top 3 of a user's ~40 memories only ~70% of the time (it misses paraphrases such as "Where does the
user work?" against "My employer is ..." and ranks an old statement above its update), so `rag` and
`dki` both stop near 70% while `full` reaches ~97%. A cross-encoder reads question and memory
together and learns which sentence forms answer which question; the values themselves (made-up
words, disjoint between the splits) carry no signal, so it has to rank by the sentence's meaning.

Data: the synthetic sets of src/eval/synthetic.ts (export.mjs `sets`): every train question with
evidence gives one group: its evidence turn and GROUP-1 other turns of the same conversation (the
same attribute's other turns, i.e. friends' facts and the statement an update replaced, always
among them), scored with a softmax over the group (listwise). Memory texts are what the importer
stores ("Speaker: text"). Validation: the held-out set's recall@3 and MRR over all of a user's turns.

Run from the repository root:

    node models/memory-qa/export.mjs sets --dir /tmp/xenc --train 2000 --heldout 100 --seed 36
    /tmp/hfenv/bin/python models/memory-qa/train_reranker.py --data /tmp/xenc [--minutes 12]

Fixed seed. Writes models/memory-qa-reranker/{model.onnx, tokenizer.json, config.json, training.json}
and models/memory-qa/logs/reranker.jsonl.
"""

import argparse
import json
import math
import os
import platform
import random
import re
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, processors
from transformers import BertConfig, BertForSequenceClassification

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
OUT = ROOT / "models" / "memory-qa-reranker"
LOGS = HERE / "logs"
SEED = 36
GROUP = 8         # one evidence turn and 7 others, scored together
QUESTIONS = 32    # groups a step
MAX_LEN = 96      # tokens of a pair, special tokens included (the longest synthetic pair is ~60)
# The memory-QA models' BPE (trained on the train split only): held-out made-up values are unseen
# words to it, as they are to the answering models.
BASE_TOKENIZER = ROOT / "models" / "memory-qa-plain" / "tokenizer.json"
SHAPE = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512,
             max_position_embeddings=128, type_vocab_size=2, hidden_dropout_prob=0.0,
             attention_probs_dropout_prob=0.0, num_labels=1)


def make_tokenizer() -> Tokenizer:
    """The BPE with BERT's pair layout: <|bos|> question <|im_end|> memory <|im_end|>, types 0 then 1."""
    tok = Tokenizer.from_file(str(BASE_TOKENIZER))
    bos, sep = tok.token_to_id("<|bos|>"), tok.token_to_id("<|im_end|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A <|im_end|>", pair="<|bos|> $A <|im_end|> $B:1 <|im_end|>:1",
        special_tokens=[("<|bos|>", bos), ("<|im_end|>", sep)])
    tok.enable_truncation(MAX_LEN, strategy="longest_first")
    return tok


def turns_of(sample):
    conv = sample["conversation"]
    keys = sorted((k for k in conv if re.fullmatch(r"session_\d+", k)), key=lambda k: int(k[8:]))
    return [{"id": t["dia_id"], "memory": f"{t['speaker']}: {t['text']}"} for k in keys for t in conv[k]]


def questions_of(samples):
    """(question, evidence memory index, the conversation's memories) for every answerable question."""
    out = []
    for s in samples:
        turns = turns_of(s)
        at = {t["id"]: i for i, t in enumerate(turns)}
        memories = [t["memory"] for t in turns]
        for q in s["qa"]:
            if len(q["evidence"]) == 1 and q["evidence"][0] in at:
                out.append((q["question"], at[q["evidence"][0]], memories))
    return out


# The same attribute's other turns share the sentence form's words with the evidence; these are the
# negatives a retriever confuses, so they are always in the group.
def overlap(a: str, b: str) -> int:
    return len(set(re.findall(r"\w+", a.lower())) & set(re.findall(r"\w+", b.lower())))


def group_of(r: random.Random, question, pos, memories):
    others = [i for i in range(len(memories)) if i != pos]
    hard = sorted(others, key=lambda i: -overlap(memories[i], memories[pos]))[:4]
    rest = [i for i in others if i not in hard]
    r.shuffle(rest)
    picked = [pos] + hard + rest[: GROUP - 1 - len(hard)]
    return [(question, memories[i]) for i in picked]


def encode(tok: Tokenizer, pairs):
    enc = tok.encode_batch(pairs)
    n = max(len(e.ids) for e in enc)
    ids = torch.zeros(len(enc), n, dtype=torch.long)
    types = torch.zeros(len(enc), n, dtype=torch.long)
    mask = torch.zeros(len(enc), n, dtype=torch.long)
    for i, e in enumerate(enc):
        ids[i, : len(e.ids)] = torch.tensor(e.ids)
        types[i, : len(e.ids)] = torch.tensor(e.type_ids)
        mask[i, : len(e.ids)] = 1
    return ids, mask, types


@torch.no_grad()
def validate(model, tok, held):
    """Recall@1/@3 and MRR of the evidence among all of its user's memories."""
    model.eval()
    hits1 = hits3 = rr = 0.0
    for question, pos, memories in held:
        logits = model(*encode(tok, [(question, m) for m in memories])).logits[:, 0]
        rank = int((logits > logits[pos]).sum())
        hits1 += rank < 1
        hits3 += rank < 3
        rr += 1 / (rank + 1)
    model.train()
    n = len(held)
    return {"recall@1": hits1 / n, "recall@3": hits3 / n, "mrr": rr / n}


GOLDEN_PAIRS = [
    ("What is the name of the user's dog?", "User: I have a dog named Corsadro."),
    ("What is the name of the user's dog?", "User: My friend Mia has a dog named Pelvorin."),
    ("What is the user's job?", "User: I switched jobs from velgalmor to tanrimlo."),
    ("Where does the user live?", "Assistant: That sounds lovely. How was the weather on the trip?"),
    ("用户的狗叫什么名字？", "用户: 我的狗叫可萨德罗。"),
]


def export(model, tok):
    OUT.mkdir(parents=True, exist_ok=True)
    model.eval()
    ids, mask, types = encode(tok, [("What is the name of the user's dog?", "User: I have a dog named Corsadro.")])
    torch.onnx.export(model, (ids, mask, types), str(OUT / "model.onnx"), input_names=["input_ids", "attention_mask", "token_type_ids"],
                      output_names=["logits"], dynamic_axes={k: {0: "batch", 1: "sequence"} for k in ["input_ids", "attention_mask", "token_type_ids"]} | {"logits": {0: "batch"}},
                      opset_version=17, dynamo=False)
    # PyTorch's scores of a few pairs, for the test suite to hold the engine's ONNX run against.
    pairs = GOLDEN_PAIRS
    with torch.no_grad():
        logits = [model(*encode(tok, [p])).logits[0, 0].item() for p in pairs]
    (OUT / "golden.json").write_text(json.dumps([{"query": q, "passage": p, "logit": l} for (q, p), l in zip(pairs, logits)], ensure_ascii=False, indent=1) + "\n")
    tok.no_truncation()  # the engine truncates itself (longest first, to config.json's positions)
    tok.save(str(OUT / "tokenizer.json"))
    model.config.to_json_file(str(OUT / "config.json"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="folder with train.json and heldout.json (export.mjs sets)")
    ap.add_argument("--minutes", type=float, default=12)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.manual_seed(SEED)
    torch.set_num_threads(a.threads)
    r = random.Random(SEED)
    tok = make_tokenizer()
    train = questions_of(json.load(open(Path(a.data) / "train.json")))
    held = questions_of(json.load(open(Path(a.data) / "heldout.json")))
    config = BertConfig(vocab_size=tok.get_vocab_size(), pad_token_id=tok.token_to_id("<|pad|>"), **SHAPE)
    config._attn_implementation = "eager"  # exports to plain ONNX ops
    model = BertForSequenceClassification(config)
    params = sum(p.numel() for p in model.parameters())
    print(f"{len(train)} train and {len(held)} held-out questions; {params / 1e6:.2f}M parameters", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.98), weight_decay=0.01)
    budget = a.minutes * 60
    LOGS.mkdir(exist_ok=True)
    log = open(LOGS / "reranker.jsonl", "w")
    start = time.time()
    step, best = 0, None
    order = list(range(len(train)))
    while time.time() - start < budget:
        r.shuffle(order)
        for b in range(0, len(order) - QUESTIONS + 1, QUESTIONS):
            frac = min(1.0, (time.time() - start) / budget)
            lr = a.lr * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
            for g in opt.param_groups:
                g["lr"] = lr
            pairs = [p for i in order[b: b + QUESTIONS] for p in group_of(r, *train[i])]
            logits = model(*encode(tok, pairs)).logits.view(QUESTIONS, GROUP)
            loss = F.cross_entropy(logits, torch.zeros(QUESTIONS, dtype=torch.long))  # the evidence is each group's first
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            row = {"step": step, "s": round(time.time() - start, 1), "loss": round(loss.item(), 4), "lr": lr}
            if step % a.eval_every == 0:
                row |= validate(model, tok, held)
                print(json.dumps(row), flush=True)
            log.write(json.dumps(row) + "\n")
            if time.time() - start >= budget:
                break
    final = validate(model, tok, held)
    print("final", json.dumps(final), flush=True)
    export(model, tok)
    (OUT / "training.json").write_text(json.dumps({
        "seed": SEED, "steps": step, "seconds": round(time.time() - start), "parameters": params, "shape": SHAPE,
        "group": GROUP, "questions_per_step": QUESTIONS, "lr": a.lr, "train_questions": len(train),
        "heldout": final, "heldout_questions": len(held), "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "torch": torch.__version__,
    }, indent=1) + "\n")


if __name__ == "__main__":
    main()
