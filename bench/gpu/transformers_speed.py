"""The comparison side of bench/gpu.js: the same random-weight folder through PyTorch transformers
on the same GPU, and the device's copy bandwidth (the bound batch-1 decode is measured against).

    python3 bench/gpu/transformers_speed.py --model DIR --attn sdpa --prefill 512,4096 --decode 128
    python3 bench/gpu/transformers_speed.py --copy-bandwidth

Prints one JSON object on stdout. `--device cpu` runs the same code on the CPU (a smoke test of
this script where no GPU is).
"""

import argparse
import json
import time

import torch


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, reps: int) -> float:
    """Mean seconds of fn() over reps runs, after one warm-up run."""
    fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t0) / reps


def copy_bandwidth() -> dict:
    """Device-to-device copy of 2 GiB: bytes read + bytes written per second."""
    n = 2 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    s = timed(lambda: b.copy_(a), 10)
    return {"copy_gb_s": 2 * n / s / 1e9, "device": torch.cuda.get_device_name()}


@torch.no_grad()
def model_speed(folder: str, attn: str, prefill: list[int], decode: int, device: str) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, attn_implementation=attn).to(device).eval()
    gen = torch.Generator(device="cpu").manual_seed(0)
    out = {"attn": attn, "transformers": __import__("transformers").__version__, "torch": torch.__version__}
    for n in prefill:
        ids = torch.randint(100, 40000, (1, n), generator=gen).to(device)
        s = timed(lambda: model(ids, use_cache=False, logits_to_keep=1), 3)
        out[f"prefill_{n}_tok_s"] = n / s

    start = torch.randint(100, 40000, (1, 16), generator=gen).to(device)

    def run_decode():
        r = model(start, use_cache=True, logits_to_keep=1)
        past, nxt = r.past_key_values, r.logits[:, -1:].argmax(-1)
        sync()
        t0 = time.perf_counter()
        for _ in range(decode):
            r = model(nxt, past_key_values=past, use_cache=True)
            past, nxt = r.past_key_values, r.logits[:, -1:].argmax(-1)
        sync()
        return time.perf_counter() - t0

    run_decode()  # warm-up
    out["decode_tok_s"] = decode / min(run_decode() for _ in range(3))
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--model")
    p.add_argument("--attn", default="sdpa", choices=["eager", "sdpa"])
    p.add_argument("--prefill", default="512,4096")
    p.add_argument("--decode", type=int, default=128)
    p.add_argument("--copy-bandwidth", action="store_true")
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    if a.copy_bandwidth:
        print(json.dumps(copy_bandwidth()))
    else:
        print(json.dumps(model_speed(a.model, a.attn, [int(x) for x in a.prefill.split(",")], a.decode, a.device)))
