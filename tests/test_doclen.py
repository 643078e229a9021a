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
    # fixed L dividing N: c2 * N * L / 2 = c_lin * N -> L = 2 c_lin / c2 = 64
    L = dl.n_star_mean("fixed", 4096, c2=1.0, c_lin=32.0)
    assert abs(L - 64) <= 1


def test_wikitext_reader(tmp_path):
    p = tmp_path / "w.txt"
    p.write_text(" \n = A = \n x\n = = S = = \n yy\n = B = \n é\n", encoding="utf-8")
    assert dl.wikitext_article_lengths(str(p)) == [len(" = A = \n x\n = = S = = \n yy\n"), len(" = B = \n é\n".encode())]


def test_cli_writes_table(tmp_path):
    from eval import doclen as cli
    cli.main(["--c2", "1", "--c-lin", "32", "--N", "1024", "--families", "fixed", "--out", str(tmp_path)])
    rows = (tmp_path / "doclen.csv").read_text().splitlines()
    assert rows[0].startswith("N,family,n_star_mean") and abs(float(rows[1].split(",")[2]) - 64) <= 2
