"""Cost model by document length (issue 27 item 4): packed sequences with a document mask.

Packer (as assumed here): documents are concatenated into one stream and the stream is cut into windows of N
tokens; a document that crosses a window end is split into two pieces, both kept (no padding, nothing dropped).
Doc-masked exact attention then costs about ``c2 * sum_d l_d**2`` per sequence (causal: half), linear attention
``c_lin * N``. Functions here: sampling document lengths, packing, the expected sum of squared lengths, the tile
pairs a doc-masked tiled kernel visits, and the n* analogue (mean document length where the two costs are equal).
"""
from __future__ import annotations

import re
from typing import Callable, List, Sequence

import numpy as np

FAMILIES = ("fixed", "geometric", "lognormal", "pareto")


def sample_lengths(family: str, mean: float, n: int, rng: np.random.Generator, *, sigma: float = 1.0,
                   alpha: float = 1.5, cap: int = 1 << 20) -> np.ndarray:
    """``n`` document lengths (int64, >= 1) of ``family`` with (approximately) the given ``mean``.

    fixed: all ``round(mean)``; geometric: support 1,2,...; lognormal: ``sigma`` of log-length;
    pareto: tail index ``alpha`` (> 1), capped at ``cap`` tokens. Errors: ValueError for an unknown family or mean < 1.
    """
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    if not mean >= 1:
        raise ValueError(f"mean must be >= 1, got {mean}")
    if family == "fixed":
        return np.full(n, max(1, int(round(mean))), dtype=np.int64)
    if family == "geometric":
        return rng.geometric(1.0 / mean, size=n).astype(np.int64)
    if family == "lognormal":
        mu = np.log(mean) - sigma ** 2 / 2
        return np.clip(np.rint(rng.lognormal(mu, sigma, size=n)), 1, cap).astype(np.int64)
    if not alpha > 1:
        raise ValueError(f"alpha must be > 1 for pareto, got {alpha}")
    xm = mean * (alpha - 1) / alpha
    x = xm * (1 + rng.pareto(alpha, size=n))
    return np.clip(np.rint(x), 1, cap).astype(np.int64)


def pack(lengths: Sequence[int], N: int) -> List[List[int]]:
    """Cut the concatenated documents into full windows of ``N`` tokens; returns the piece lengths of each window
    (a trailing partial window is dropped)."""
    out, cur, room = [], [], N
    for l in lengths:
        l = int(l)
        while l > 0:
            take = min(l, room)
            cur.append(take)
            l -= take
            room -= take
            if room == 0:
                out.append(cur)
                cur, room = [], N
    return out


def expected_sum_sq(sampler: Callable[[int, np.random.Generator], np.ndarray], N: int, *, n_seqs: int = 64,
                    seed: int = 0) -> float:
    """Monte-Carlo E[sum of squared piece lengths] per packed sequence of length N (deterministic given seed)."""
    rng = np.random.default_rng(seed)
    lengths = []
    total = 0
    while total < N * (n_seqs + 1):
        x = sampler(4096, rng)
        lengths.append(x)
        total += int(x.sum())
    seqs = pack(np.concatenate(lengths), N)[:n_seqs]
    return float(np.mean([sum(p * p for p in s) for s in seqs]))


def visited_tiles(pieces: Sequence[int], block_m: int, block_n: int, causal: bool = True) -> int:
    """Number of (query tile, key tile) pairs holding at least one allowed (i, j) of the document mask
    (and j <= i if causal) for one sequence made of ``pieces`` (Nq = Nk = sum(pieces))."""
    pairs = set()
    s = 0
    for l in pieces:
        e = s + int(l)
        if e > s:
            for qt in range(s // block_m, (e - 1) // block_m + 1):
                qhi = min((qt + 1) * block_m, e) - 1  # last query of this doc in the tile
                for kt in range(s // block_n, (e - 1) // block_n + 1):
                    klo = max(kt * block_n, s)
                    if not causal or klo <= qhi:
                        pairs.add((qt, kt))
        s = e
    return len(pairs)


def exact_cost(sum_sq: float, c2: float, causal: bool = True) -> float:
    """Doc-masked exact attention cost per sequence: c2 * sum l^2 (causal: half)."""
    return c2 * sum_sq * (0.5 if causal else 1.0)


def n_star_mean(family: str, N: int, c2: float, c_lin: float, *, causal: bool = True, lo: float = 1.0,
                hi: float | None = None, iters: int = 40, seed: int = 0, **kw) -> float:
    """Mean document length where doc-masked exact cost equals linear cost ``c_lin * N`` at sequence length N
    (bisection; exact is cheaper below it). Returns inf if exact stays cheaper up to mean = N."""
    hi = float(N) if hi is None else hi

    def gap(m):
        ss = expected_sum_sq(lambda n, r: sample_lengths(family, m, n, r, **kw), N, seed=seed)
        return exact_cost(ss, c2, causal) - c_lin * N

    if gap(hi) < 0:
        return float("inf")
    if gap(lo) > 0:
        return lo
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if gap(mid) > 0:
            hi = mid
        else:
            lo = mid
        if family == "fixed" and hi - lo < 0.5:
            break
    return 0.5 * (lo + hi)


_ARTICLE = re.compile(r"^ = [^=].* = $")


def wikitext_article_lengths(path: str) -> List[int]:
    """Article lengths in UTF-8 bytes (harness/data.py tokenises to UTF-8 bytes)
    of a WikiText file: an article starts at a line `` = Title = `` (single ``=``); ``= = X = =`` are sections."""
    lengths: List[int] = []
    with open(path, "rb") as f:
        for raw in f:
            line = raw.decode("utf-8").rstrip("\n")
            if _ARTICLE.match(line):
                lengths.append(0)
            if lengths:
                lengths[-1] += len(raw)
    return lengths
