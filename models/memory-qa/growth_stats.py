"""How far training moved the weights that growth added, against the ones the small model gave.

    /tmp/hfenv/bin/python models/memory-qa/growth_stats.py SMALL_DIR GROWN_AND_TRAINED_DIR

Rebuilds the grown model's starting point (train.py's `grow`, same seed) and splits every weight
into the part copied from the small model ("inherited") and the part growth added ("new"; of it,
the writers that started at zero): RMS at the start, after training, and of the change.
A weight's part is found by growing a copy of the small model whose weights are all NaN.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train as T  # noqa: E402

small = T.load_model(Path(sys.argv[1]))
trained = T.load_model(Path(sys.argv[2]))
start = T.grow(small, trained.s, 36)
nan = T.load_model(Path(sys.argv[1]))
with torch.no_grad():
    for p in nan.parameters():
        p.fill_(float("nan"))
marks = T.grow(nan, trained.s, 36)

sums = {k: [0, 0.0, 0.0, 0.0] for k in ("inherited", "new", "new, started at zero")}  # n, Σw0², Σwt², Σ(wt−w0)²
with torch.no_grad():
    for m, w0, wt in zip(marks.parameters(), start.parameters(), trained.parameters()):
        inherited = torch.isnan(m)
        for key, sel in (("inherited", inherited), ("new", ~inherited), ("new, started at zero", ~inherited & (w0 == 0))):
            a, b = w0[sel].double(), wt[sel].double()
            s = sums[key]
            s[0] += sel.sum().item(); s[1] += (a * a).sum().item(); s[2] += (b * b).sum().item(); s[3] += ((b - a) ** 2).sum().item()
for key, (n, a, b, d) in sums.items():
    print(f"{key}: {n} parameters, RMS at the start {(a / n) ** .5:.4f}, after training {(b / n) ** .5:.4f}, of the change {(d / n) ** .5:.4f}")
