"""Text -> bilm-tf windows (`bilm_batcher.Batcher`, the tests' reference): streams, targets,
token tables, bad text. Training's batches: test_streams.py."""
import collections

import numpy as np
import pytest

from elmo_jax import batch_to_char_ids
from bilm_batcher import Batcher, pad_tables
from elmo_jax.data import DataError, list_shards, read_sentences
from elmo_jax.core.vocab import build_vocab


def window_char_ids(batch: dict) -> np.ndarray:
    """[2, B, U, C] char ids of a batch's readings, from its token tables."""
    chars, index = np.asarray(batch["token_chars"]), np.asarray(batch["token_index"])
    S, B = chars.shape[0], index.shape[1]
    group = np.arange(B) // (B // S)
    return chars[group[None, :, None], index]


def _corpus(tmp_path, sentences, name="a.txt"):
    (tmp_path / name).write_text("\n".join(" ".join(s) for s in sentences) + "\n")
    return str(tmp_path / name)


def _vocab(sentences):
    return build_vocab(collections.Counter(w for s in sentences for w in s))


def test_windows_follow_bilm_tf(tmp_path):
    sents = [["a", "b", "c"], ["d", "e"]]
    vocab = _vocab(sents)
    batcher = Batcher(iter(sents), vocab, batch_size=1, unroll_steps=3)
    words = lambda ids: [vocab.words[i] for i in ids]  # noqa: E731
    b1, b2, b3 = next(batcher), next(batcher), next(batcher)
    # forward: <S> a b c </S> <S> d e </S>; inputs drop each sentence's last token
    assert words(b1["targets"][0, 0]) == ["a", "b", "c"]
    assert words(b2["targets"][0, 0]) == ["</S>", "d", "e"]
    assert words(b3["targets"][0, 0][:1]) == ["</S>"] and b3["mask"][0].tolist() == [1, 0, 0]
    chars = window_char_ids(b1)
    np.testing.assert_array_equal(chars[0, 0], batch_to_char_ids([["<S>", "a", "b"]])[0])
    # backward: </S> c b a <S> </S> e d <S>: targets are the previous tokens
    assert words(b1["targets"][1, 0]) == ["c", "b", "a"]
    assert words(b2["targets"][1, 0]) == ["<S>", "e", "d"]
    np.testing.assert_array_equal(chars[1, 0], batch_to_char_ids([["</S>", "c", "b"]])[0])
    # each distinct token is spelled once per group: a b c </S> <S>, plus the padding row
    assert not b1["token_chars"][0, 0].any() and b1["token_chars"].shape[1] == 128
    assert len(np.unique(b1["token_index"])) == 5
    with pytest.raises(StopIteration):
        next(batcher)


def test_every_token_predicted_once_per_direction(tmp_path):
    sents = [[f"w{i}"] * (1 + i % 7) for i in range(40)]
    batcher = Batcher(iter(sents), _vocab(sents), batch_size=4, unroll_steps=5)
    total = sum(int(b["mask"].sum()) for b in batcher)
    assert total == sum(len(s) + 1 for s in sents)


def test_groups_hold_their_own_rows(tmp_path):
    sents = [[f"w{i}", "common"] for i in range(50)]
    one = Batcher(iter(sents), _vocab(sents), 4, 3)
    two = Batcher(iter(sents), _vocab(sents), 4, 3, n_groups=2)
    for a, b in zip(one, two):
        assert b["token_chars"].shape[0] == 2
        np.testing.assert_array_equal(window_char_ids(a), window_char_ids(b))
        assert b["token_index"][:, :2].max() < 128 and b["token_index"].min() >= 0


def test_widest_filter_cuts_each_batch_to_the_spelling_the_cnn_needs():
    """Each batch's token tables end `widest_filter` characters after its longest
    spelling (`chars.trim_padding`); `pad_tables` widens them back exactly."""

    sents = [["a", "bb"], ["ccc", "x" * 30], ["dd"], ["e"] * 5, ["y" * 60, "f"]] * 2
    full = list(Batcher(iter(sents), _vocab(sents), 2, 3))
    cut = list(Batcher(iter(sents), _vocab(sents), 2, 3, widest_filter=7))
    widths = [b["token_chars"].shape[2] for b in cut]
    assert len(cut) == len(full) and 16 in widths and 50 in widths and 40 in widths, widths
    for a, b in zip(full, cut):
        longest = int(np.max(np.sum((a["token_chars"] > 0) & (a["token_chars"] != 261), -1)))
        assert b["token_chars"].shape[2] == min(50, -(-(longest + 7) // 8) * 8)
        for k in a:
            np.testing.assert_array_equal(pad_tables(b, *a["token_chars"].shape[1:])[k], a[k])


def test_bad_text(tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"fine line\nbad \xff byte\n")
    with pytest.raises(DataError, match=r"bad.txt, line 2: not valid UTF-8"):
        read_sentences(str(tmp_path / "bad.txt"))
    with pytest.raises(DataError, match="no files match"):
        list_shards(str(tmp_path / "nothing*.txt"))
