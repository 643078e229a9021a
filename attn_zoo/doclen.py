"""Cost model by document length (issue 27 item 4): packed sequences with a document mask.

Packer (as assumed here): documents are concatenated into one stream and the stream is cut into windows of N
tokens; a document that crosses a window end is split into two pieces, both kept (no padding, nothing dropped).
Doc-masked exact attention then costs ``c0 N + c2 sum_d l_d**2`` per sequence (``c0``, ``c2``: the dense fit
``t/token = c0 + c2 n`` of the exact kernel, causal included), linear attention ``c_lin N``. Per token:
``c0 + c2 E[sum l^2] / N`` against ``c_lin``, and ``sum l^2 / N`` is the size-biased mean piece length
``E[l^2] / E[l]`` (the length of the piece an average token lies in), whatever the distribution. Functions here:
sampling document lengths, packing, the expected sum of squared lengths, the tile pairs a doc-masked tiled kernel
visits, and the n* analogue (mean document length where the two costs are equal). The CLI and the measured mode:
:mod:`eval.doclen`; the results: docs/crossover.md, "Crossovers by document length".
"""
from __future__ import annotations

import re
from typing import Callable, List, Sequence

import numpy as np

FAMILIES = ("fixed", "geometric", "lognormal", "pareto")


def stratified_uniforms(n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` uniforms on (0, 1), one in each stratum ``[i/n, (i+1)/n)``, in random order (Latin hypercube in 1-D):
    the tail of a distribution drawn by its inverse CDF is then represented in proportion, not by chance."""
    return np.clip((rng.permutation(n) + rng.random(n)) / n, 1e-12, 1 - 1e-12)


def sample_lengths(family: str, mean: float, n: int, rng: np.random.Generator, *, sigma: float = 1.0,
                   alpha: float = 1.5, cap: int = 1 << 20, stratified: bool = False) -> np.ndarray:
    """``n`` document lengths (int64, >= 1) of ``family`` with (approximately) the given ``mean``.

    fixed: all ``round(mean)``; geometric: support 1,2,...; lognormal: ``sigma`` of log-length;
    pareto: tail index ``alpha`` (> 1), capped at ``cap`` tokens. ``stratified``: drawn by the inverse CDF at
    :func:`stratified_uniforms` (same distribution, far less Monte-Carlo noise in tail-dominated sums such as
    ``sum l^2``). Errors: ValueError for an unknown family, mean < 1 or alpha <= 1.
    """
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    if not mean >= 1:
        raise ValueError(f"mean must be >= 1, got {mean}")
    if family == "fixed":
        return np.full(n, max(1, int(round(mean))), dtype=np.int64)
    u = stratified_uniforms(n, rng) if stratified else None
    if family == "geometric":
        if u is None:
            return rng.geometric(1.0 / mean, size=n).astype(np.int64)
        if mean == 1:
            return np.ones(n, dtype=np.int64)
        return (1 + np.floor(np.log1p(-u) / np.log1p(-1.0 / mean))).astype(np.int64)
    if family == "lognormal":
        mu = np.log(mean) - sigma ** 2 / 2
        if u is None:
            x = rng.lognormal(mu, sigma, size=n)
        else:
            import torch

            x = np.exp(mu + sigma * torch.special.ndtri(torch.from_numpy(u)).numpy())
        return np.clip(np.rint(x), 1, cap).astype(np.int64)
    if not alpha > 1:
        raise ValueError(f"alpha must be > 1 for pareto, got {alpha}")
    xm = mean * (alpha - 1) / alpha
    x = xm * (1 + rng.pareto(alpha, size=n)) if u is None else xm * (1 - u) ** (-1.0 / alpha)
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


def pieces(lengths: Sequence[int], N: int):
    """Pieces of the documents ``lengths`` packed as in :func:`pack` (vectorised): ``(piece_lengths, window,
    W)``, int64 arrays of the pieces of the ``W = sum(lengths) // N`` full windows and the window of each."""
    l = np.asarray(lengths, dtype=np.int64)
    l = l[l > 0]
    ends = np.cumsum(l)
    W = int(ends[-1] // N) if ends.size else 0
    if W == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), 0
    bounds = np.arange(1, W + 1, dtype=np.int64) * N
    cuts = np.union1d(ends[ends < W * N], bounds)  # every piece ends at a document end or a window end
    starts = np.concatenate([[0], cuts[:-1]])
    return cuts - starts, starts // N, W


def piece_sum_sq(lengths: Sequence[int], N: int) -> np.ndarray:
    """Sum of squared piece lengths of each full window of ``N`` tokens when ``lengths`` are packed as in
    :func:`pack` (float64 ``(W,)``; the same pieces as :func:`pack`)."""
    p, w, W = pieces(lengths, N)
    pf = p.astype(np.float64)
    return np.bincount(w, weights=pf * pf, minlength=W)[:W]


def packed_doc_ids(sample: Callable[[int, np.random.Generator], np.ndarray], N: int, B: int,
                   seed: int = 0) -> np.ndarray:
    """int64 ``(B, N)`` document ids (0, 1, ... along each row) of ``B`` consecutive windows of one packed stream of
    documents drawn by ``sample(n, rng)`` (seeded): the batch the measured mode of :mod:`eval.doclen` times."""
    p, w, _ = pieces(_draw(sample, N * B, np.random.default_rng(seed)), N)
    out = np.empty((B, N), dtype=np.int64)
    for b in range(B):
        pb = p[w == b]
        out[b] = np.repeat(np.arange(pb.size), pb)
    return out


def expected_sum_sq(sampler: Callable[[int, np.random.Generator], np.ndarray], N: int, *, n_seqs: int | None = None,
                    tokens: int = 1 << 21, seed: int = 0) -> float:
    """Monte-Carlo E[sum of squared piece lengths] per packed sequence of length N (deterministic given seed).

    ``sampler(n, rng)`` draws ``n`` document lengths; ``n_seqs`` windows are averaged (default
    ``max(16, tokens // N)``)."""
    n_seqs = max(16, tokens // N) if n_seqs is None else n_seqs
    rng = np.random.default_rng(seed)
    return float(piece_sum_sq(_draw(sampler, N * n_seqs, rng), N)[:n_seqs].mean())


def _draw(sample: Callable[[int, np.random.Generator], np.ndarray], tokens: int, rng: np.random.Generator):
    """Document lengths summing to at least ``tokens``: after a first 4096, one draw sized from their mean (a
    stratified sampler then covers its tail in one piece), then more if still short."""
    x = sample(4096, rng)
    out, total = [x], int(x.sum())
    if total < tokens:
        x = sample(int(1.1 * (tokens - total) / max(x.mean(), 1.0)) + 1, rng)
        out.append(x)
        total += int(x.sum())
    while total < tokens:
        x = sample(4096, rng)
        out.append(x)
        total += int(x.sum())
    return np.concatenate(out)


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


def tiles_per_window(lengths: Sequence[int], N: int, block: int) -> np.ndarray:
    """Visited (query tile, key tile) pairs of a causal document-masked tiled kernel with square ``block`` x
    ``block`` tiles, per full window of ``N`` tokens of the packed ``lengths`` (float64 ``(W,)``; the same count
    as :func:`visited_tiles` per window, vectorised). Query tile t visits key tiles from the tile where the document
    of its first token starts up to t. Errors: ValueError unless ``block`` divides ``N``."""
    if block < 1 or N % block:
        raise ValueError(f"block must divide N, got block={block}, N={N}")
    p, w, W = pieces(lengths, N)
    if W == 0:
        return np.zeros(0)
    starts = np.cumsum(p) - p  # global start of each piece (pieces never cross a window end)
    T = N // block
    g = (np.arange(W)[:, None] * N + np.arange(T)[None, :] * block).ravel()  # first token of every query tile
    ds = starts[np.searchsorted(starts, g, side="right") - 1] - (g // N) * N  # its piece's start in the window
    t = np.tile(np.arange(T), W)
    return (t - ds // block + 1).reshape(W, T).sum(1).astype(np.float64)


def expected_tiles(l, N: int, block: int, n_u: int = 1024) -> np.ndarray:
    """E over the start offset u (``n_u`` integer offsets spread over [0, N)) of the visited causal tile pairs
    charged to a document of length ``l`` (:func:`tiles_per_window`: each query tile is charged to the document
    of its first token, for the key tiles from that document's first tile up to itself), cut at window ends."""
    l = np.asarray(l, dtype=np.float64)[..., None]
    n_u = min(N, n_u)
    u = np.floor((np.arange(n_u) + 0.5) * N / n_u)
    T = N // block

    def piece(s, ln):
        a, t0 = np.floor(s / block), np.ceil(s / block)
        n = np.maximum(np.floor((s + ln - 1) / block) - t0 + 1, 0)
        return np.where(ln > 0, n * (t0 - a + 1) + n * (n - 1) / 2, 0.0)

    first = np.minimum(l, N - u)
    r = l - first
    k = np.floor(r / N)
    return (piece(u, first) + k * T * (T + 1) / 2 + piece(0.0, r - k * N)).mean(-1)


def tiles_expected(family: str, mean: float, N: int, block: int, *, pool: Sequence[int] | None = None,
                   tokens: int = 1 << 21, seed: int = 0, **kw) -> float:
    """E[visited causal tile pairs] per window of N tokens packed with ``family`` at ``mean``, square tiles of
    ``block``: fixed lengths through the packer (:func:`tiles_per_window`), the others exactly over the length
    distribution with a uniform start offset (:func:`expected_tiles`), as :func:`piece_size_biased`."""
    if block < 1 or N % block:
        raise ValueError(f"block must divide N, got block={block}, N={N}")
    if family == "fixed":
        n_seqs = max(16, tokens // N)
        x = _draw(sampler("fixed", mean), N * n_seqs, np.random.default_rng(seed))
        return float(tiles_per_window(x, N, block)[:n_seqs].mean())
    v, pr = length_distribution(family, mean, pool=pool, **kw)
    return float(N * (pr * expected_tiles(v, N, block)).sum() / (pr * v).sum())


def exact_time_per_token_tiles(tiles: float, N: int, block: int, c2: float, c0: float = 0.0) -> float:
    """Doc-masked exact time per token when the kernel pays whole tiles: ``c0 + c2 N tiles / T_dense`` with
    ``T_dense = T (T + 1) / 2``, ``T = N / block`` (a dense causal sequence is the dense fit ``c0 + c2 N``)."""
    T = N // block
    return c0 + c2 * N * tiles / (T * (T + 1) / 2)


def _bisect_mean(gap: Callable[[float], float], lo: float, hi: float, rel_tol: float, family: str) -> float:
    """The mean document length where ``gap(mean)`` (exact minus linear cost per token, increasing in the mean)
    changes sign: bisection in log(mean) to ``rel_tol`` (``fixed`` lengths: to half a token). Returns inf if
    ``gap(hi) < 0`` (exact stays cheaper), ``lo`` if ``gap(lo) > 0`` (linear already cheaper)."""
    if gap(hi) < 0:
        return float("inf")
    if gap(lo) > 0:
        return lo
    while hi / lo > 1 + rel_tol and not (family == "fixed" and hi - lo < 0.5):
        mid = float(np.sqrt(lo * hi))
        if gap(mid) > 0:
            hi = mid
        else:
            lo = mid
    return float(np.sqrt(lo * hi))


def n_star_mean_tiles(family: str, N: int, c2: float, c_lin: float, block: int, *, c0: float = 0.0,
                      lo: float = 1.0, hi: float | None = None, rel_tol: float = 0.005, seed: int = 0,
                      tokens: int = 1 << 21, pool: Sequence[int] | None = None, **kw) -> float:
    """:func:`n_star_mean` with the tile model (:func:`exact_time_per_token_tiles` of :func:`tiles_expected`): a
    document shorter than a tile, and every tile a boundary crosses, costs a whole tile."""
    hi = float(N) if hi is None else float(hi)

    def gap(m):
        t = tiles_expected(family, m, N, block, pool=pool, tokens=tokens, seed=seed, **kw)
        return exact_time_per_token_tiles(t, N, block, c2, c0) - c_lin

    return _bisect_mean(gap, lo, hi, rel_tol, family)


def length_stats(lengths: Sequence[int]) -> dict:
    """Mean, p50, p90 and the size-biased mean ``E[l^2] / E[l]`` (the length of the document an average token
    lies in) of document lengths."""
    l = np.asarray(lengths, dtype=np.float64)
    return dict(mean=float(l.mean()), p50=float(np.percentile(l, 50)), p90=float(np.percentile(l, 90)),
                size_biased=float((l * l).sum() / l.sum()))


def sampler(family: str, mean: float, *, pool: Sequence[int] | None = None, stratified: bool = True,
            **kw) -> Callable[[int, np.random.Generator], np.ndarray]:
    """A ``sampler(n, rng)`` of document lengths with the given ``mean``: one of :data:`FAMILIES`
    (:func:`sample_lengths`, ``kw`` = sigma / alpha / cap), or ``"empirical"``: draws from ``pool`` (e.g. real
    article lengths) scaled by ``mean / mean(pool)`` (the shape of the real distribution at another mean).
    ``stratified`` (default): inverse-CDF draws at :func:`stratified_uniforms` (every pool entry equally often).
    Errors: ValueError for an unknown family, or ``"empirical"`` without a non-empty ``pool``."""
    if family == "empirical":
        if pool is None or len(pool) == 0:
            raise ValueError("family='empirical' needs a non-empty pool of lengths")
        arr = np.asarray(pool, dtype=np.float64)
        scale = mean / arr.mean()
        if stratified:
            arr = np.sort(arr)
            return lambda n, r: np.maximum(np.rint(arr[(stratified_uniforms(n, r) * arr.size).astype(np.int64)]
                                                   * scale), 1).astype(np.int64)
        return lambda n, r: np.maximum(np.rint(r.choice(arr, size=n) * scale), 1).astype(np.int64)
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES + ('empirical',)}, got {family!r}")
    return lambda n, r: sample_lengths(family, mean, n, r, stratified=stratified, **kw)


def length_distribution(family: str, mean: float, *, pool: Sequence[int] | None = None, sigma: float = 1.0,
                        alpha: float = 1.5, cap: int = 1 << 20, bins: int = 4000):
    """The distribution :func:`sampler` draws from, as ``(values, probs)`` (float64; probs sum to 1): exact for
    fixed / geometric (pmf up to where the tail is < 1e-12) / empirical (the scaled pool), log-spaced bins of the
    CDF for lognormal and pareto (the mass above ``cap`` at ``cap``, as :func:`sample_lengths` clips)."""
    if family == "empirical":
        if pool is None or len(pool) == 0:
            raise ValueError("family='empirical' needs a non-empty pool of lengths")
        arr = np.asarray(pool, dtype=np.float64)
        v = np.maximum(np.rint(arr * mean / arr.mean()), 1)
        return v, np.full(v.size, 1.0 / v.size)
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES + ('empirical',)}, got {family!r}")
    if not mean >= 1:
        raise ValueError(f"mean must be >= 1, got {mean}")
    if family == "fixed":
        return np.array([max(1.0, float(round(mean)))]), np.array([1.0])
    if family == "geometric":
        if mean == 1:
            return np.array([1.0]), np.array([1.0])
        q = 1 - 1.0 / mean
        lmax = int(np.ceil(np.log(1e-12) / np.log(q))) + 1
        if lmax <= bins:
            v = np.arange(1, lmax + 1, dtype=np.float64)
            pr = (1 - q) * q ** (v - 1)
            return v, pr / pr.sum()
        e = np.unique(np.floor(np.geomspace(1, lmax, bins + 1)))  # integer edges: P(e_i < l <= e_i+1)
        e = np.concatenate([[0.0], e])
        F = -np.expm1(e * np.log(q))
        v, pr = np.sqrt(np.maximum(e[:-1], 1) * e[1:]), np.diff(F)
        return v, pr / pr.sum()
    if family == "lognormal":
        import torch

        mu = np.log(mean) - sigma ** 2 / 2
        lo, hi = max(0.5, np.exp(mu - 9 * sigma)), min(float(cap), np.exp(mu + 9 * sigma))
        e = np.geomspace(lo, hi, bins + 1)
        F = torch.special.ndtr(torch.from_numpy((np.log(e) - mu) / sigma)).numpy()
        F[0], tail = 0.0, 1.0 - F[-1]
    else:
        if not alpha > 1:
            raise ValueError(f"alpha must be > 1 for pareto, got {alpha}")
        xm = mean * (alpha - 1) / alpha
        e = np.geomspace(xm, max(float(cap), xm * 1.0001), bins + 1)
        F = 1 - (xm / e) ** alpha
        tail = 1.0 - F[-1]
    v = np.append(np.clip(np.sqrt(e[:-1] * e[1:]), 1, cap), float(cap))
    pr = np.append(np.diff(F), tail)
    return v, pr / pr.sum()


def expected_piece_sq(l, N: int, n_u: int = 256) -> np.ndarray:
    """E over a uniform start offset u in [0, N) of the sum of squared pieces of a document of length ``l`` cut
    at the window ends (first piece ``min(l, N - u)``, then whole windows, then the rest): the packer of
    :func:`pack` in stationarity (non-fixed lengths). Midpoint rule over ``n_u`` offsets."""
    l = np.asarray(l, dtype=np.float64)[..., None]
    u = (np.arange(n_u) + 0.5) / n_u * N
    a = np.minimum(l, N - u)
    r = l - a
    k = np.floor(r / N)
    last = r - k * N
    return (a * a + k * float(N) ** 2 + last * last).mean(-1)


def piece_size_biased(family: str, mean: float, N: int, *, pool: Sequence[int] | None = None, tokens: int = 1 << 21,
                      seed: int = 0, **kw) -> float:
    """``E[sum of squared pieces] / N`` of sequences of length N packed with documents of ``family`` at ``mean``
    (the size-biased mean piece length, what doc-masked exact attention pays per token / c2). Fixed lengths: the
    packer itself (:func:`expected_sum_sq`, deterministic); the others: exact expectation over the length
    distribution (:func:`length_distribution`) with a uniform start offset (:func:`expected_piece_sq`), no
    Monte-Carlo noise (a heavy tail's sum of squares is dominated by rare long documents)."""
    if family == "fixed":
        return expected_sum_sq(sampler("fixed", mean), N, tokens=tokens, seed=seed) / N
    v, pr = length_distribution(family, mean, pool=pool, **kw)
    return float((pr * expected_piece_sq(v, N)).sum() / (pr * v).sum())


def distribution_stats(family: str, mean: float, *, pool: Sequence[int] | None = None, **kw) -> dict:
    """Mean, p50, p90 and size-biased mean ``E[l^2]/E[l]`` of the document lengths of :func:`length_distribution`."""
    v, pr = length_distribution(family, mean, pool=pool, **kw)
    o = np.argsort(v)
    v, c = v[o], np.cumsum(pr[o])
    q = lambda x: float(v[min(np.searchsorted(c, x), v.size - 1)])  # noqa: E731
    m = float((pr * v).sum())
    return dict(mean=m, p50=q(0.5), p90=q(0.9), size_biased=float((pr * v * v).sum()) / m)


def exact_time_per_token(sum_sq: float, N: int, c2: float, c0: float = 0.0) -> float:
    """Doc-masked exact attention time per token of a packed sequence of length ``N`` whose pieces have
    ``sum_sq = sum l^2``: ``c0 + c2 * sum_sq / N``.

    ``c0`` / ``c2`` are the fit ``t/token = c0 + c2 n`` of the (causal) exact kernel on dense sequences of
    length n (:func:`eval.crossover.fit_quadratic_per_token`): a document of length l costs what a sequence of
    length l costs, so a packed sequence costs ``c0 N + c2 sum l^2`` (the causal half is inside ``c2``). With one
    document (``sum_sq = N^2``) this is the dense fit itself."""
    return c0 + c2 * sum_sq / N


def n_star_mean(family: str, N: int, c2: float, c_lin: float, *, c0: float = 0.0, lo: float = 1.0,
                hi: float | None = None, rel_tol: float = 0.005, seed: int = 0, tokens: int = 1 << 21,
                pool: Sequence[int] | None = None, mc: bool = False, **kw) -> float:
    """Mean document length where doc-masked exact attention (:func:`exact_time_per_token`) costs what linear
    attention costs (``c_lin`` per token) at sequence length ``N``; exact is cheaper below it. Bisection in
    log(mean) to ``rel_tol`` (common random numbers: one seed for every mean). Returns inf if exact stays cheaper
    up to mean = ``hi`` (default N), ``lo`` if linear is already cheaper there. The cost per token is
    :func:`piece_size_biased` (``mc``: the Monte-Carlo packer :func:`expected_sum_sq` instead, a check).

    For ``fixed`` lengths dividing N it is ``(c_lin - c0) / c2``: the crossover sequence length n* of the dense
    sweep (``n*_fit`` of :func:`eval.crossover.constants_crossover`)."""
    hi = float(N) if hi is None else float(hi)

    def gap(m):
        if mc:
            ss = expected_sum_sq(sampler(family, m, pool=pool, **kw), N, seed=seed, tokens=tokens)
        else:
            ss = N * piece_size_biased(family, m, N, pool=pool, tokens=tokens, seed=seed, **kw)
        return exact_time_per_token(ss, N, c2, c0) - c_lin

    return _bisect_mean(gap, lo, hi, rel_tol, family)


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
