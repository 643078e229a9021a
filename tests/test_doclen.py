import numpy as np
import pytest

from attn_zoo import doclen as dl


def _brute_tiles(pieces, bm, bn, causal):
    ids = np.repeat(np.arange(len(pieces)), pieces)
    n = len(ids)
    m = ids[:, None] == ids[None, :]
    if causal:
        m &= np.tril(np.ones((n, n), bool))
    return sum(m[i:i + bm, j:j + bn].any() for i in range(0, n, bm) for j in range(0, n, bn))


@pytest.mark.parametrize("pieces", [[5, 1, 9, 3, 14], [32], [1] * 8 + [24], [7, 0, 13, 12]])
@pytest.mark.parametrize("causal", [True, False])
def test_visited_tiles_brute_force(pieces, causal):
    for bm, bn in [(4, 4), (8, 4), (4, 8)]:
        assert dl.visited_tiles(pieces, bm, bn, causal) == _brute_tiles(pieces, bm, bn, causal)


def test_pack_cuts_at_window_end():
    assert dl.pack([3, 6, 2, 5], 4) == [[3, 1], [4], [1, 2, 1], [4]]


def test_expected_sum_sq_fixed_and_mc():
    # fixed 16 divides N=64: every sequence has 4 pieces of 16
    f = lambda n, r: dl.sample_lengths("fixed", 16, n, r)
    assert dl.expected_sum_sq(f, 64) == 4 * 16 ** 2
    # fixed 48, N=64: stream period lcm=192 -> windows [48,16],[32,32],[16,48]: mean sum sq = (2560+2048+2560)/3
    g = lambda n, r: dl.sample_lengths("fixed", 48, n, r)
    assert dl.expected_sum_sq(g, 64, n_seqs=3) == pytest.approx((2560 + 2048 + 2560) / 3)


def test_n_star_fixed_by_hand():
    # fixed L dividing N: c0 + c2 * L = c_lin -> L = (c_lin - c0) / c2 (the dense n*_fit)
    assert abs(dl.n_star_mean("fixed", 4096, c2=1.0, c_lin=32.0) - 32) <= 1
    assert abs(dl.n_star_mean("fixed", 4096, c2=1.0, c_lin=32.0, c0=8.0) - 24) <= 1


def test_wikitext_reader(tmp_path):
    p = tmp_path / "w.txt"
    p.write_text(" \n = A = \n x\n = = S = = \n yy\n = B = \n é\n", encoding="utf-8")
    assert dl.wikitext_article_lengths(str(p)) == [len(" = A = \n x\n = = S = = \n yy\n"),
                                                   len(" = B = \n é\n".encode())]


@pytest.mark.parametrize("N", [4, 7, 16])
def test_piece_sum_sq_matches_pack(N):
    rng = np.random.default_rng(N)
    L = rng.integers(1, 3 * N, size=40)
    assert list(dl.piece_sum_sq(L, N)) == [sum(p * p for p in s) for s in dl.pack(L, N)]


def test_packed_doc_ids_rows_are_the_packer_windows():
    s = dl.sampler("geometric", 5)
    ids = dl.packed_doc_ids(s, 32, 3, seed=1)
    assert ids.shape == (3, 32) and (np.diff(ids, axis=1) >= 0).all() and (ids[:, 0] == 0).all()
    lens = dl._draw(s, 32 * 3, np.random.default_rng(1))
    assert [list(np.bincount(r)) for r in ids] == [list(map(int, w)) for w in dl.pack(lens, 32)[:3]]


@pytest.mark.parametrize("family", ["geometric", "lognormal", "pareto"])
def test_stratified_draws_keep_the_distribution(family):
    r = np.random.default_rng(0)
    a = dl.sample_lengths(family, 200, 100_000, r, cap=1 << 30)
    b = dl.sample_lengths(family, 200, 100_000, r, stratified=True, cap=1 << 30)
    assert abs(np.median(a) / np.median(b) - 1) < 0.05
    st = dl.distribution_stats(family, 200, cap=1 << 30)
    assert abs(st["p90"] / np.percentile(b, 90) - 1) < 0.05


@pytest.mark.parametrize("family,mean,N", [("geometric", 300, 1024), ("lognormal", 100, 4096),
                                           ("geometric", 3000, 2048)])
def test_exact_expectation_matches_the_packer(family, mean, N):
    """piece_size_biased (distribution x uniform offset) against Monte-Carlo packing of sampled documents."""
    mc = dl.expected_sum_sq(dl.sampler(family, mean), N, tokens=1 << 22) / N
    assert dl.piece_size_biased(family, mean, N) == pytest.approx(mc, rel=0.03)


def test_piece_size_biased_limits():
    # documents much shorter than N: E[l^2]/E[l]; much longer: every window is one piece (N)
    st = dl.distribution_stats("geometric", 20)
    assert dl.piece_size_biased("geometric", 20, 1 << 16) == pytest.approx(st["size_biased"], rel=0.01)
    assert dl.piece_size_biased("empirical", 1e6, 512, pool=[3, 5, 8]) == pytest.approx(512, rel=0.01)


@pytest.mark.parametrize("family", ["geometric", "lognormal", "pareto"])
def test_families_collapse_on_the_piece_size_biased_mean(family):
    """At n*_doc every family has the same E[sum l^2]/N = (c_lin - c0)/c2, whatever its mean."""
    c0, c2, cl, N = 0.02, 3e-5, 0.07, 16384
    m = dl.n_star_mean(family, N, c2, cl, c0=c0, rel_tol=1e-3)
    assert dl.piece_size_biased(family, m, N) == pytest.approx((cl - c0) / c2, rel=0.01)
    assert m < (cl - c0) / c2  # a spread of lengths crosses at a smaller mean than fixed lengths


def test_unknown_family_names_allowed():
    with pytest.raises(ValueError, match="family must be one of"):
        dl.sampler("zipf", 10)
    with pytest.raises(ValueError, match="pool"):
        dl.length_distribution("empirical", 10)


@pytest.mark.parametrize("N,block", [(32, 4), (64, 8), (64, 16)])
def test_tiles_per_window_matches_visited_tiles(N, block):
    rng = np.random.default_rng(N + block)
    L = rng.integers(1, 40, size=30)
    assert list(dl.tiles_per_window(L, N, block)) == [dl.visited_tiles(s, block, block) for s in dl.pack(L, N)]
    with pytest.raises(ValueError, match="block"):
        dl.tiles_per_window(L, N, 3 * block)


def test_tile_model_limits_and_expectation():
    # one document per window: the dense fit; tiny documents: about two tiles per query tile
    N, b = 1024, 64
    T = N // b
    assert dl.exact_time_per_token_tiles(T * (T + 1) / 2, N, b, c2=1e-3, c0=0.5) == pytest.approx(0.5 + 1e-3 * N)
    assert dl.tiles_expected("empirical", 100 * N, N, b, pool=[7, 9]) == pytest.approx(T * (T + 1) / 2, rel=0.01)
    x = dl._draw(dl.sampler("geometric", 300), N * 2048, np.random.default_rng(0))
    mc = dl.tiles_per_window(x, N, b)[:2048].mean()
    assert dl.tiles_expected("geometric", 300, N, b) == pytest.approx(mc, rel=0.02)
    # the tile model never charges less than the pair model's tiles, so its n* is smaller
    c0, c2, cl = 0.02, 3e-5, 0.07
    tiles = dl.n_star_mean_tiles("geometric", 4096, c2, cl, 128, c0=c0)
    assert tiles < dl.n_star_mean("geometric", 4096, c2, cl, c0=c0)
