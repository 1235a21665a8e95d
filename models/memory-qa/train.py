"""Trains the memory-QA models models/memory-qa-plain and models/memory-qa-block-aware.

A small Llama (hidden 256, 6 layers, GQA, tied embeddings: 5.8M parameters) with its own byte-level BPE of 4096 tokens
(English and Chinese) learns to answer questions about a user from memories it is given: the
synthetic set of src/eval/synthetic.ts, every prompt rendered by the project's own TypeScript
(export.mjs), so the models see exactly what `dki eval memory` gives them.

  plain        memories as prompt text: `full` (the whole conversation), `rag` (top-k memories in
               the system message), `none` (the question alone: "not mentioned")
  block-aware  the plain model fine-tuned (as KVLink does) on the same mix plus `dki` examples:
               each memory its own block behind the encoding prefix [BOS], attended at negative
               positions exactly as DKISystem injects it (see `layout` and `attention_mask`)

Run from the repository root after `npx tsc -p tsconfig.json`:

    /tmp/hfenv/bin/python models/memory-qa/train.py [--minutes-plain 28] [--minutes-block 15] [--device cpu|cuda] [--shape tiny|small|small6] [--out models]

The committed models were made in two runs, because the 5.8M shape learns to copy too slowly from
scratch on 2 CPU cores: the tiny shape (1.3M) from scratch, `--only plain`, then `--shape small6
--grow-from <that plain model>`, which starts plain from its function-preserving grown copy (`grow`).

Fixed seed; the loss is on the answer tokens only. The plain model first learns to copy (the copy
drill alone, `drill_first`), then the task with the drill mixed in; a conversation's `full`
questions share one row (`tree`). Every --eval-every steps it logs the losses and the held-out
exact match (greedy, in PyTorch) per mode to models/memory-qa/logs/<variant>.jsonl.
"""

import argparse
import json
import math
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
VOCAB = 4096
SPECIAL = ["<|bos|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
BOS, EOT, PAD = 0, 2, 3
# ChatML with a BOS first: the prompt has its own first token at position 0 whether or not memories
# sit before it. add_generation_prompt opens the assistant turn; <|im_end|> (EOS) closes the answer.
CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# "tiny" (1.3M parameters) trains from scratch in ~30 minutes on 2 cores; "small6" (5.8M, the committed
# models) is grown from a trained tiny model (--grow-from); "small" (7.3M) from scratch did not learn
# to copy within an hour here (models/memory-qa/README.md): for a GPU (--device cuda).
SHAPES = {
    "tiny": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32),
    "small": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, head_dim=32),
    "small6": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4, head_dim=32),
}
SHAPE = dict(vocab_size=VOCAB, **SHAPES["tiny"], max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=10000.0)  # --shape replaces it
MODELS = ROOT / "models"  # --out replaces it
MAX_TOKENS = 1400  # the longest row kept (a conversation's `full` questions packed together: up to ~1,000 tokens)


# ----- tokenizer ---------------------------------------------------------------------------------

def train_tokenizer(corpus: Path) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    # SmolLM2's pre-tokenizer (digits one by one, then GPT-2's split), as the project's other trained models.
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([str(corpus)], trainer)
    return tok


def write_tokenizer(tok: Tokenizer, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": SPECIAL[BOS], "eos_token": SPECIAL[EOT], "pad_token": SPECIAL[PAD], "model_max_length": SHAPE["max_position_embeddings"],
        "tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE,
    }, indent=2, ensure_ascii=False) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": BOS, "eos_token_id": EOT, "pad_token_id": PAD, "do_sample": False}, indent=2) + "\n")


# ----- the model: Llama, written out so masks and positions are ours; saved under HF's names -----

class Llama(torch.nn.Module):
    def __init__(self, s: dict):
        super().__init__()
        self.s = s
        h, hd = s["hidden_size"], s["head_dim"]
        nq, nkv = s["num_attention_heads"], s["num_key_value_heads"]
        self.embed = torch.nn.Embedding(s["vocab_size"], h)
        self.layers = torch.nn.ModuleList()
        for _ in range(s["num_hidden_layers"]):
            L = torch.nn.Module()
            L.ln1 = torch.nn.Parameter(torch.ones(h))
            L.ln2 = torch.nn.Parameter(torch.ones(h))
            L.q = torch.nn.Linear(h, nq * hd, bias=False)
            L.k = torch.nn.Linear(h, nkv * hd, bias=False)
            L.v = torch.nn.Linear(h, nkv * hd, bias=False)
            L.o = torch.nn.Linear(nq * hd, h, bias=False)
            L.gate = torch.nn.Linear(h, s["intermediate_size"], bias=False)
            L.up = torch.nn.Linear(h, s["intermediate_size"], bias=False)
            L.down = torch.nn.Linear(s["intermediate_size"], h, bias=False)
            self.layers.append(L)
        self.norm = torch.nn.Parameter(torch.ones(h))
        inv = 1.0 / (s["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        self.register_buffer("inv_freq", inv.float(), persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)

    def rms(self, x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.s["rms_norm_eps"]))

    def forward(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, at: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, T, V], or [N, V] at the positions `at` ([B, T] bool) only (the head costs as much as
        the layers at this size). ids, pos: [B, T] (positions may be negative: RoPE is computed from
        them directly); mask: [B, T, T] bool, True = may attend."""
        s = self.s
        B, T = ids.shape
        hd, nq, nkv = s["head_dim"], s["num_attention_heads"], s["num_key_value_heads"]
        ang = pos.float()[..., None] * self.inv_freq  # [B, T, hd/2]
        cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None]
        sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None]

        def rope(x):  # HF Llama's rotate_half convention
            x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
            return x * cos + torch.cat([-x2, x1], -1) * sin

        x = self.embed(ids)
        m = mask[:, None]
        for L in self.layers:
            a = self.rms(x, L.ln1)
            q = rope(L.q(a).view(B, T, nq, hd).transpose(1, 2))
            k = rope(L.k(a).view(B, T, nkv, hd).transpose(1, 2))
            v = L.v(a).view(B, T, nkv, hd).transpose(1, 2)
            k = k.repeat_interleave(nq // nkv, 1)
            v = v.repeat_interleave(nq // nkv, 1)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
            x = x + L.o(o.transpose(1, 2).reshape(B, T, nq * hd))
            a = self.rms(x, L.ln2)
            x = x + L.down(F.silu(L.gate(a)) * L.up(a))
        x = self.rms(x, self.norm)
        return (x if at is None else x[at]) @ self.embed.weight.T

    # HF LlamaForCausalLM names (lm_head tied to the embeddings, so not stored).
    def hf_state(self) -> dict:
        out = {"model.embed_tokens.weight": self.embed.weight, "model.norm.weight": self.norm}
        for i, L in enumerate(self.layers):
            p = f"model.layers.{i}."
            out.update({p + "input_layernorm.weight": L.ln1, p + "post_attention_layernorm.weight": L.ln2,
                        p + "self_attn.q_proj.weight": L.q.weight, p + "self_attn.k_proj.weight": L.k.weight,
                        p + "self_attn.v_proj.weight": L.v.weight, p + "self_attn.o_proj.weight": L.o.weight,
                        p + "mlp.gate_proj.weight": L.gate.weight, p + "mlp.up_proj.weight": L.up.weight, p + "mlp.down_proj.weight": L.down.weight})
        return out

    def load_hf(self, state: dict) -> None:
        with torch.no_grad():
            for k, p in self.hf_state().items():
                p.copy_(state[k].float())


def hf_config() -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **SHAPE, "hidden_act": "silu", "tie_word_embeddings": True,
            "bos_token_id": BOS, "eos_token_id": EOT, "pad_token_id": PAD, "attention_bias": False, "mlp_bias": False, "torch_dtype": "float16"}


def save_model(model: Llama, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().to(torch.float16).contiguous() for k, v in model.hf_state().items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config(), indent=2) + "\n")


def load_model(folder: Path) -> Llama:
    """A saved model at its own shape (its config.json), whatever --shape this run has."""
    config = json.loads((folder / "config.json").read_text())
    m = Llama({**SHAPE, **{k: config[k] for k in SHAPE if k in config}})
    m.load_hf(load_file(str(folder / "model.safetensors")))
    return m


def grow(small: Llama, s: dict, seed: int) -> Llama:
    """A model of shape `s` that computes what `small` computes (Net2Net-style function-preserving
    growth, Chen et al. 2016): more heads, a wider MLP, a wider residual stream and identity layers.

    What makes it exact: every weight that *writes* into something new (the new residual dimensions,
    the new heads' and MLP units' outputs, the new layers' o/down projections, the embeddings' new
    columns) starts at zero, so the new parts add nothing until training moves them; the weights that
    *read* them start random (std 0.02), so the gradient reaches the zero writers from step one.
    RMSNorm averages over the wider stream, whose new dimensions are zero, so its mean square is
    r = h_small / h times the small model's: the norm weights are scaled by sqrt(r) and rms_norm_eps
    by r (`grown_eps`), which makes it exact. Head h of the small model
    stays head h, and its KV group stays its group, so head_dim, RoPE and GQA grouping must match.
    The new layers are spread evenly between the old ones."""
    a = small.s
    assert s["rms_norm_eps"] == grown_eps(a, s), "the grown shape needs rms_norm_eps = grown_eps(small, shape)"
    assert s["head_dim"] == a["head_dim"] and s["rope_theta"] == a["rope_theta"] and s["vocab_size"] == a["vocab_size"]
    assert s["num_attention_heads"] // s["num_key_value_heads"] == a["num_attention_heads"] // a["num_key_value_heads"]
    h0, i0, hd = a["hidden_size"], a["intermediate_size"], a["head_dim"]
    q0, kv0 = a["num_attention_heads"] * hd, a["num_key_value_heads"] * hd
    L0, L = a["num_hidden_layers"], s["num_hidden_layers"]
    assert s["hidden_size"] >= h0 and s["intermediate_size"] >= i0 and L >= L0 and s["num_attention_heads"] >= a["num_attention_heads"]
    torch.manual_seed(seed)
    big = Llama(s)  # random readers everywhere; the writers are zeroed below
    norm_scale = math.sqrt(h0 / s["hidden_size"])
    # old layer j goes to slot where[j]; the other slots are identity layers
    where = [j * L // L0 for j in range(L0)]
    with torch.no_grad():
        big.embed.weight.zero_()
        big.embed.weight[:, :h0] = small.embed.weight
        big.norm.fill_(norm_scale)
        big.norm[:h0] = small.norm * norm_scale
        for i, B in enumerate(big.layers):
            B.o.weight.zero_()
            B.down.weight.zero_()
            B.ln1.fill_(norm_scale)
            B.ln2.fill_(norm_scale)
            if i not in where:
                continue
            S = small.layers[where.index(i)]
            B.ln1[:h0] = S.ln1 * norm_scale
            B.ln2[:h0] = S.ln2 * norm_scale
            B.q.weight[:q0, :h0] = S.q.weight
            B.k.weight[:kv0, :h0] = S.k.weight
            B.v.weight[:kv0, :h0] = S.v.weight
            B.o.weight[:h0, :q0] = S.o.weight
            B.gate.weight[:i0, :h0] = S.gate.weight
            B.up.weight[:i0, :h0] = S.up.weight
            B.down.weight[:h0, :i0] = S.down.weight
    return big


def grown_eps(small: dict, s: dict) -> float:
    return small["rms_norm_eps"] * small["hidden_size"] / s["hidden_size"]


def growth_error(small: Llama, big: Llama, rows: list) -> float:
    """The largest |logit difference| between `small` and its grown copy over some rows (each mode)."""
    worst = 0.0
    picked = {}
    for r in rows:
        picked.setdefault(r["mode"], []).append(r)
    with torch.no_grad():
        for r in [r for group in picked.values() for r in group[:3]]:
            ids, pos, blk, pre = example(r)[:4]
            mask = attention_mask(torch.zeros(len(ids), dtype=torch.long), torch.tensor(blk), torch.tensor(pre))[None]
            args = (torch.tensor([ids]), torch.tensor([pos]), mask)
            worst = max(worst, (small(*args) - big(*args)).abs().max().item())
    return worst


# ----- layout, mask and positions: the one definition of what the model sees ---------------------

def layout(prompt: list, answer: list, blocks: list | None = None, prefix: list | None = None):
    """Token ids, position ids, block index (−1: prompt/answer) and prefix flag of one example.

    dki: [prefix][mem_1][prefix][mem_2]…[prompt][answer]. Memory blocks lie at negative positions
    [−M, −1] in the order given (M: all memory tokens); each prefix copy sits right before its
    block, so positions inside a block relative to its prefix are those of its canonical encoding.
    The prompt starts at 0, as in the engine with positions "negative".
    """
    ids, pos, blk, pre = [], [], [], []
    if blocks:
        P = len(prefix)
        s = -sum(len(b) for b in blocks)
        for i, b in enumerate(blocks):
            ids += prefix + b
            pos += list(range(s - P, s + len(b)))
            blk += [i] * (P + len(b))
            pre += [True] * P + [False] * len(b)
            s += len(b)
    n = len(prompt) + len(answer)
    ids += prompt + answer
    pos += list(range(n))
    blk += [-1] * n
    pre += [False] * n
    return ids, pos, blk, pre


def attention_mask(ex: torch.Tensor, blk: torch.Tensor, pre: torch.Tensor, br: torch.Tensor | None = None) -> torch.Tensor:
    """[T, T] bool for one row (ex: example index per token, −1 padding; a row may hold several). A block token sees
    its own prefix copy and its block, causally; a prompt or answer token sees every memory token and
    the prompt causally, never a prefix copy (the engine keeps no prefix K/V). A branch token (br ≥ 0,
    see `tree`) sees the shared part and its own branch only. Padding sees itself."""
    T = ex.shape[0]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    same = (ex[:, None] == ex[None, :]) & (ex[:, None] >= 0)
    in_block = (blk[:, None] >= 0) & (blk[:, None] == blk[None, :])
    in_prompt = (blk[:, None] < 0) & ~pre[None, :]
    visible = same & causal & (in_block | in_prompt)
    if br is not None:
        visible &= (br[None, :] < 0) | (br[None, :] == br[:, None])
    return visible | torch.eye(T, dtype=torch.bool)


# ----- data --------------------------------------------------------------------------------------

def read_rows(path: Path) -> list:
    with open(path, encoding="utf8") as f:
        return [json.loads(line) for line in f if line.strip()]


def answer_labels(ids: list, n_answer: int) -> list:
    """The next token wherever it is an answer token (the answer is the tail of `ids`), else −100."""
    labels = [-100] * len(ids)
    for t in range(len(ids) - n_answer - 1, len(ids) - 1):
        labels[t] = ids[t + 1]
    return labels


def example(row: dict):
    ids, pos, blk, pre = layout(row["prompt"], row["answer"], row.get("blocks"), row.get("prefix"))
    return ids, pos, blk, pre, answer_labels(ids, len(row["answer"])), [-1] * len(ids)


def tree(rows: list):
    """Several questions on one conversation as one row: the prompt they share (the conversation)
    once, then each question and answer as its own branch, which sees the shared part and itself at
    the positions it has alone (`attention_mask`). The same loss as one example a question, for a
    twelfth of the compute: a `full` example is ~500 tokens of conversation and ~4 answer tokens."""
    prompts = [r["prompt"] for r in rows]
    n = 0  # shared length; each branch keeps at least its prompt's last token (the first answer label sits there)
    while all(len(p) > n + 1 and p[n] == prompts[0][n] for p in prompts):
        n += 1
    ids, pos, br, labels = prompts[0][:n], list(range(n)), [-1] * n, [-100] * n
    for i, r in enumerate(rows):
        tail = r["prompt"][n:] + r["answer"]
        ids += tail
        pos += range(n, n + len(tail))
        br += [i] * len(tail)
        labels += answer_labels(tail, len(r["answer"]))
    return ids, pos, [-1] * len(ids), [False] * len(ids), labels, br


def examples_of(rows: list) -> list:
    """Training rows: one a `full` conversation (its questions as branches), one each other example."""
    convs = {}
    for r in rows:
        if r["mode"] == "full":
            convs.setdefault(r["conv"], []).append(r)
    return [tree(g) for g in convs.values()] + [example(r) for r in rows if r["mode"] != "full"]


def batches(rows: list, tokens: int, rng: random.Random):
    """Endless batches of about `tokens` tokens (padding included), one example a row: examples of
    like length batched together (a full-context example is 5x a top-3 one, and attention costs
    the square of the row), in a fresh order each epoch."""
    while True:
        order = rows[:]
        rng.shuffle(order)
        out = []
        for c in range(0, len(order), 2048):
            group = []
            for e in sorted(order[c:c + 2048], key=lambda e: len(e[0])):
                if group and (len(group) + 1) * len(e[0]) > tokens:
                    out.append(group)
                    group = []
                group.append(e)
            if group:
                out.append(group)
        rng.shuffle(out)
        for group in out:
            yield collate([[e] for e in group], max(len(e[0]) for e in group))


def collate(packs: list, width: int):
    B = len(packs)
    ids = torch.full((B, width), PAD, dtype=torch.long)
    pos = torch.zeros((B, width), dtype=torch.long)
    labels = torch.full((B, width), -100, dtype=torch.long)
    masks = torch.zeros((B, width, width), dtype=torch.bool)
    for b, pack in enumerate(packs):
        ex = torch.full((width,), -1, dtype=torch.long)
        blk = torch.full((width,), -1, dtype=torch.long)
        pre = torch.zeros(width, dtype=torch.bool)
        br = torch.full((width,), -1, dtype=torch.long)
        at = 0
        for j, (i_, p_, k_, r_, l_, b_) in enumerate(pack):
            n = len(i_)
            ids[b, at:at + n] = torch.tensor(i_)
            pos[b, at:at + n] = torch.tensor(p_)
            blk[at:at + n] = torch.tensor(k_)
            pre[at:at + n] = torch.tensor(r_)
            labels[b, at:at + n] = torch.tensor(l_)
            br[at:at + n] = torch.tensor(b_)
            ex[at:at + n] = j
            at += n
        masks[b] = attention_mask(ex, blk, pre, br)
    return ids, pos, masks, labels


# ----- evaluation: greedy answers in PyTorch ----------------------------------------------------

@torch.no_grad()
def greedy(model: Llama, row: dict, device: str, max_new: int = 16) -> list:
    """The greedy answer (for checks outside training; exact_match gets the same verdict in one forward)."""
    out = []
    for _ in range(max_new):
        ids, pos, blk, pre = layout(row["prompt"], out, row.get("blocks"), row.get("prefix"))
        t = lambda x: torch.tensor([x], dtype=torch.long, device=device)
        mask = attention_mask(torch.zeros(len(ids), dtype=torch.long), torch.tensor(blk), torch.tensor(pre))[None].to(device)
        nxt = int(model(t(ids), t(pos), mask)[0, -1].argmax())
        if nxt == EOT:
            break
        out.append(nxt)
    return out


@torch.no_grad()
def exact_match(model: Llama, rows: list, device: str, batch: int = 8) -> dict:
    """Held-out exact match per mode. Greedy decoding gives the reference answer (EOS included) exactly
    when the argmax after each of its prefixes is its next token, so one teacher-forced forward decides."""
    model.eval()
    examples = [example(r) for r in rows]
    res = {}
    for i in range(0, len(examples), batch):
        chunk = examples[i:i + batch]
        ids, pos, mask, labels = collate([[e] for e in chunk], max(len(e[0]) for e in chunk))
        ids, pos, mask, labels = ids.to(device), pos.to(device), mask.to(device), labels.to(device)
        at = labels >= 0
        right = (model(ids, pos, mask, at).argmax(-1) == labels[at]).float()
        # Per row: all of its answer positions right.
        row_of = torch.arange(len(chunk), device=device)[:, None].expand_as(labels)[at]
        wrong = torch.zeros(len(chunk), device=device).index_add_(0, row_of, 1 - right)
        for r, w in zip(rows[i:i + batch], wrong.tolist()):
            c = res.setdefault(r["mode"], [0, 0])
            c[0] += w == 0
            c[1] += 1
    model.train()
    return {k: round(h / n, 4) for k, (h, n) in res.items()}


def eval_subset(rows: list, per_mode: int, seed: int) -> list:
    rng = random.Random(seed)
    out = []
    for mode in ["none", "full", "rag", "dki"]:
        ms = [r for r in rows if r["mode"] == mode]
        rng.shuffle(ms)
        out += ms[:per_mode]
    return out


def copy_drill(rows: int, gen: torch.Generator):
    """A batch of the copying drill: [BOS] w w, w a random run of 8–32 tokens, the loss on the second
    w. Answering from memory is copying a value out of it, and a model that sees only the answers'
    few tokens is slow to find out how (its loss sat at ~3 for thousands of steps); this drill
    grows the induction heads that copy, as repeated text does in pretraining. Mixed into the task
    from the start with 16 rows a step it never took (its loss stayed at chance, ln 4092, for 1,000
    steps); alone, 64 rows a step, it finds the heads after ~1,000 steps (the loss falls from 7 to
    below 1 within 150), so `drill_first` runs it alone before the task."""
    n = int(torch.randint(8, 33, (1,), generator=gen))
    w = torch.randint(len(SPECIAL), VOCAB, (rows, n), generator=gen)
    ids = torch.cat([torch.full((rows, 1), BOS), w, w], 1)
    T_ = ids.shape[1]
    labels = torch.full_like(ids, -100)
    labels[:, n + 1:T_ - 1] = ids[:, n + 2:]
    pos = torch.arange(T_).expand(rows, T_)
    mask = torch.ones(T_, T_, dtype=torch.bool).tril().expand(rows, T_, T_)
    return ids, pos, mask, labels


# ----- training ---------------------------------------------------------------------------------

def autocast(a):
    """bfloat16 matmuls where --bf16 asks for them (1.5x a step for the small shape on a Zen 4's
    AVX-512 BF16); the loss is taken in float32 either way."""
    return torch.autocast(device_type=a.device.split(":")[0], dtype=torch.bfloat16, enabled=a.bf16)


def drill_first(model: Llama, a, gen: torch.Generator, log) -> dict:
    """The copying drill alone until its loss (mean of 50 steps) is below a.drill_until or
    a.drill_max_steps have run: a model that can copy before it sees the task."""
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01, betas=(0.9, 0.95))
    t0, recent = time.time(), []
    for step in range(1, a.drill_max_steps + 1):
        for g in opt.param_groups:
            g["lr"] = a.lr * min(1.0, step / 50)
        ids, pos, mask, labels = (x.to(a.device) for x in copy_drill(a.drill_first_rows, gen))
        at = labels >= 0
        with autocast(a):
            logits = model(ids, pos, mask, at)
        loss = F.cross_entropy(logits.float(), labels[at])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        recent = (recent + [loss.item()])[-50:]
        if step % 50 == 0:
            log({"drill_step": step, "seconds": round(time.time() - t0, 1), "drill_loss": round(sum(recent) / 50, 4)})
            if sum(recent) / 50 < a.drill_until:
                break
    return {"drill_first_steps": step, "drill_first_seconds": round(time.time() - t0, 1), "drill_first_final_loss": round(sum(recent) / len(recent), 4)}


def train(variant: str, rows: list, held: list, init: Path | None, minutes: float, steps: int, a, log_path: Path) -> dict:
    """Trains for `steps` steps when given (> 0), else for `minutes` of wall clock; the learning rate's
    cosine runs over whichever it is. `init`: a model of this shape to start from; with --grow-from
    (plain only), the plain model starts as the grown copy of that smaller trained model."""
    torch.manual_seed(a.seed)
    model = Llama(SHAPE)
    grown = {}
    if init is not None:
        model.load_hf(load_file(str(init / "model.safetensors")))
    elif a.grow_from:
        small = load_model(Path(a.grow_from))
        model = grow(small, SHAPE, a.seed)
        grown = {"grown_from": {"model": Path(a.grow_from).name, "parameters": sum(p.numel() for p in small.parameters()),
                                "max_logit_difference": growth_error(small, model, held)}}
        print(variant, "grown", json.dumps(grown), flush=True)
        if grown["grown_from"]["max_logit_difference"] > 1e-3:
            raise SystemExit(f"the grown model does not compute what {a.grow_from} computes (logits differ by up to "
                             f"{grown['grown_from']['max_logit_difference']:.3g}): growth is broken, nothing was trained")
    model.to(a.device).train()
    examples = [e for e in examples_of(rows) if len(e[0]) <= MAX_TOKENS]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    logf = open(log_path, "w")

    def log(entry: dict) -> None:
        logf.write(json.dumps(entry) + "\n")
        logf.flush()
        print(variant, json.dumps(entry), flush=True)

    drill_gen = torch.Generator().manual_seed(a.seed)
    drilled = drill_first(model, a, drill_gen, log) if init is None and not grown and a.drill_max_steps > 0 else {}
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01, betas=(0.9, 0.95))
    rng = random.Random(a.seed)
    t0, step, losses, drill_losses = time.time(), 0, [], []
    budget = minutes * 60
    eval_rows = eval_subset(held, a.eval_per_mode, a.seed)
    for ids, pos, mask, labels in batches(examples, a.batch_tokens, rng):
        elapsed = time.time() - t0
        if (steps > 0 and step >= steps) or (steps <= 0 and elapsed > budget):
            break
        frac = step / steps if steps > 0 else elapsed / budget
        lr = a.lr * min(1.0, (step + 1) / 20) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        ids, pos, mask, labels = ids.to(a.device), pos.to(a.device), mask.to(a.device), labels.to(a.device)
        at = labels >= 0
        with autocast(a):
            logits = model(ids, pos, mask, at)
        answer_loss = F.cross_entropy(logits.float(), labels[at])
        loss = answer_loss
        if a.drill_rows > 0:
            d_ids, d_pos, d_mask, d_labels = (x.to(a.device) for x in copy_drill(a.drill_rows, drill_gen))
            d_at = d_labels >= 0
            with autocast(a):
                d_logits = model(d_ids, d_pos, d_mask, d_at)
            drill_loss = F.cross_entropy(d_logits.float(), d_labels[d_at])
            drill_losses.append(drill_loss.item())
            loss = loss + a.drill_weight * drill_loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(answer_loss.item())  # the answer tokens' loss (the drill's is not logged)
        step += 1
        if step % 10 == 0:
            entry = {"step": step, "seconds": round(time.time() - t0, 1), "loss": round(sum(losses[-10:]) / 10, 4), "lr": lr}
            if drill_losses:
                entry["drill_loss"] = round(sum(drill_losses[-10:]) / 10, 4)
            if step % a.eval_every == 0:
                entry["heldout_em"] = exact_match(model, eval_rows, a.device)
            log(entry)
    final_em = exact_match(model, eval_rows, a.device)
    entry = {"step": step, "seconds": round(time.time() - t0, 1), "loss": round(sum(losses[-25:]) / max(1, min(25, len(losses))), 4), "heldout_em": final_em, "final": True}
    log(entry)
    logf.close()
    model.to("cpu")
    out = MODELS / f"memory-qa-{variant}"
    save_model(model, out)
    return {**grown, **drilled, "steps": step, "seconds": entry["seconds"], "final_loss": entry["loss"], "heldout_em_final": final_em,
            "eval_questions_per_mode": a.eval_per_mode, "examples": len(rows), "batch_tokens": a.batch_tokens, "drill_rows": a.drill_rows, "drill_weight": a.drill_weight, "minutes": None if steps > 0 else minutes, "step_budget": steps if steps > 0 else None, "lr": a.lr, "bf16": a.bf16}


def count_modes(rows: list) -> dict:
    out = {}
    for r in rows:
        out[r["mode"]] = out.get(r["mode"], 0) + 1
    return out


def main() -> None:
    global MODELS
    p = argparse.ArgumentParser()
    p.add_argument("--work", default=str(ROOT / "tmp" / "memory-qa"), help="where the data sets and encoded examples go")
    p.add_argument("--train-conversations", type=int, default=2000)
    p.add_argument("--heldout-conversations", type=int, default=100)
    p.add_argument("--minutes-plain", type=float, default=28)
    p.add_argument("--minutes-block", type=float, default=15)
    p.add_argument("--steps-plain", type=int, default=0, help="train plain for this many steps instead of --minutes-plain")
    p.add_argument("--steps-block", type=int, default=0, help="train block-aware for this many steps instead of --minutes-block")
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast for the matmuls (CPUs with AVX-512 BF16 or AMX, GPUs)")
    p.add_argument("--batch-tokens", type=int, default=2048, help="tokens per batch, padding included")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-per-mode", type=int, default=40)
    p.add_argument("--drill-rows", type=int, default=16, help="rows of the copying drill a step (0: none)")
    p.add_argument("--drill-weight", type=float, default=1.0)
    p.add_argument("--drill-first-rows", type=int, default=64, help="rows a step of the drill run alone before the task (plain only)")
    p.add_argument("--drill-max-steps", type=int, default=3000, help="at most this many drill-alone steps (0: none)")
    p.add_argument("--drill-until", type=float, default=0.5, help="the drill-alone phase ends when its loss is below this")
    p.add_argument("--seed", type=int, default=36)
    p.add_argument("--device", default="cpu")
    p.add_argument("--only", choices=["plain", "block-aware"])
    p.add_argument("--shape", choices=list(SHAPES), default="tiny", help="tiny: 1.3M parameters; small6: 5.8M (the committed models, grown from tiny); small: 7.3M")
    p.add_argument("--out", default=str(MODELS), help="the folder the memory-qa-<variant> models go to (logs: <out>/memory-qa-logs unless it is models/)")
    p.add_argument("--skip-data", action="store_true", help="reuse the encoded examples in --work")
    p.add_argument("--grow-from", help="a smaller trained model folder (e.g. models/memory-qa-plain of --shape tiny): plain starts as its "
                   "function-preserving grown copy at --shape (see `grow`) instead of from scratch")
    a = p.parse_args()
    SHAPE.update(SHAPES[a.shape])
    if a.grow_from:
        config = Path(a.grow_from) / "config.json"
        if a.only == "block-aware":
            p.error("--grow-from grows the plain model: it does nothing with --only block-aware")
        if not config.is_file():
            p.error(f"--grow-from {a.grow_from}: no config.json there (a model folder train.py saved)")
        small = json.loads(config.read_text())
        grows = [k for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads") if SHAPE[k] < small[k]]
        if grows or small["head_dim"] != SHAPE["head_dim"] or small["num_attention_heads"] // small["num_key_value_heads"] != SHAPE["num_attention_heads"] // SHAPE["num_key_value_heads"]:
            p.error(f"--grow-from {a.grow_from}: --shape {a.shape} must be at least as large in every dimension"
                    f"{' (smaller: ' + ', '.join(grows) + ')' if grows else ''}, with the same head_dim and query heads per K/V head")
        SHAPE["rms_norm_eps"] = grown_eps(small, SHAPE)
    MODELS = Path(a.out).resolve()
    logs = HERE / "logs" if MODELS == (ROOT / "models").resolve() else MODELS / "memory-qa-logs"
    logs.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)
    random.seed(a.seed)
    work = Path(a.work)
    tokdir = work / "tokenizer"
    if not a.skip_data:
        node = lambda *args: subprocess.run(["node", str(HERE / "export.mjs"), *args], check=True, cwd=ROOT)
        node("sets", "--dir", str(work), "--train", str(a.train_conversations), "--heldout", str(a.heldout_conversations), "--seed", str(a.seed))
        write_tokenizer(train_tokenizer(work / "corpus.txt"), tokdir)
        node("encode", "--dir", str(work), "--tokenizer", str(tokdir), "--seed", str(a.seed))
    rows = read_rows(work / "train.jsonl")
    held = read_rows(work / "heldout.jsonl")
    lengths = sorted(len(example(r)[0]) for r in rows)
    print(f"examples {len(rows)} {count_modes(rows)}; tokens median {lengths[len(lengths) // 2]}, max {lengths[-1]}", flush=True)
    info = {"seed": a.seed, "shape": SHAPE, "parameters": sum(p.numel() for p in Llama(SHAPE).parameters()),
            "train_conversations": a.train_conversations, "heldout_conversations": a.heldout_conversations,
            "train_examples": count_modes(rows), "heldout_examples": count_modes(held), "train_tokens": sum(lengths),
            "machine": f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores (2 threads), {a.device}",
            "torch": torch.__version__, "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    variants = [a.only] if a.only else ["plain", "block-aware"]
    for v in variants:
        out = MODELS / f"memory-qa-{v}"
        write_tokenizer(Tokenizer.from_file(str(tokdir / "tokenizer.json")), out)
        if v == "plain":
            data, init, minutes, steps = [r for r in rows if r["mode"] != "dki"], None, a.minutes_plain, a.steps_plain
        else:
            data, init, minutes, steps = rows, MODELS / "memory-qa-plain", a.minutes_block, a.steps_block
        res = train(v, data, held, init, minutes, steps, a, logs / f"{v}.jsonl")
        (out / "training.json").write_text(json.dumps({**info, "variant": v, "initialised_from": "memory-qa-plain" if init else None, **res}, indent=2) + "\n")


if __name__ == "__main__":
    main()
