import numpy as np
import pytest

from harness.data import pack_documents, split_documents


def test_wikitext_split_on_articles_not_sections():
    text = " = A = \n\n x\n = = S = = \n y\n = B = \n z\n"
    docs = split_documents(text, "wikitext")
    assert len(docs) == 2
    assert " = = S = = " in docs[0] and docs[1].startswith(" = B = ")


def test_blank_line_split_and_bad_rule():
    assert split_documents("a\nb\n\nc\n\n\nd", "blank_line") == ["a\nb", "c", "d"]
    with pytest.raises(ValueError, match="rule"):
        split_documents("x", "nope")


def test_pack_counts_ids_positions():
    docs = [np.arange(3), np.arange(0), np.arange(4), np.arange(5)]
    out = pack_documents(docs, seq_len=4)  # stream 3+0+4+5 = 12 tokens, rows of 5
    assert out["tokens"].shape == (2, 5)
    assert out["tokens_kept"] == 10 and out["tokens_dropped"] == 2
    assert out["docs_kept"] == 3 and out["docs_dropped"] == 1  # the empty document is counted as dropped
    assert out["doc_ids"].flatten().tolist() == [0, 0, 0, 2, 2, 2, 2, 3, 3, 3]
    assert out["positions"].flatten().tolist() == [0, 1, 2, 0, 1, 2, 3, 0, 1, 2]


def test_pack_eos_appended():
    out = pack_documents([np.array([5, 6]), np.array([7])], seq_len=4, eos=0)
    assert out["tokens"].flatten().tolist() == [5, 6, 0, 7, 0]
    assert out["tokens_dropped"] == 0 and out["docs_dropped"] == 0
