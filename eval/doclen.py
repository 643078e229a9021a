"""n* by document length (issue 27 item 4), cost-model prediction.

    python -m eval.doclen --c2 C2 --c-lin CLIN --out results/doclen [--N 4096 16384 65536] [--wikitext DIR]

c2 / c_lin are per-element constants of the exact (per score element) and linear (per token) kernels; pass the
values fitted from a committed H200 run (nothing is hard-coded). Writes doclen.csv and doclen.md under --out.
"""
from __future__ import annotations

import argparse
import csv
import os

import numpy as np

from attn_zoo import doclen as dl


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--c2", type=float, required=True)
    ap.add_argument("--c-lin", type=float, required=True)
    ap.add_argument("--N", type=int, nargs="+", default=[4096, 16384, 65536])
    ap.add_argument("--families", nargs="+", default=list(dl.FAMILIES))
    ap.add_argument("--wikitext", default=None, help="folder with WikiText-2 valid.txt/test.txt")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    rows = []
    for N in a.N:
        for fam in a.families:
            rows.append(dict(N=N, family=fam, n_star_mean=dl.n_star_mean(fam, N, a.c2, a.c_lin, iters=20)))
    if a.wikitext:
        L = sum((dl.wikitext_article_lengths(os.path.join(a.wikitext, s + ".txt")) for s in ("valid", "test")), [])
        rng_pool = np.array(L)
        for N in a.N:
            ss = dl.expected_sum_sq(lambda n, r: r.choice(rng_pool, size=n), N)
            rows.append(dict(N=N, family="wikitext-2", mean_len=float(rng_pool.mean()),
                             p90_len=float(np.percentile(rng_pool, 90)),
                             exact_over_linear=dl.exact_cost(ss, a.c2) / (a.c_lin * N)))
    keys = sorted({k for r in rows for k in r}, key=["N", "family", "n_star_mean", "mean_len", "p90_len",
                                                      "exact_over_linear"].index)
    with open(os.path.join(a.out, "doclen.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, keys)
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(a.out, "doclen.md"), "w") as f:
        f.write("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys) + "\n")
        for r in rows:
            f.write("| " + " | ".join(f"{r[k]:.4g}" if isinstance(r.get(k), float) else str(r.get(k, ""))
                                      for k in keys) + " |\n")
    print(open(os.path.join(a.out, "doclen.md")).read())


if __name__ == "__main__":
    main()
