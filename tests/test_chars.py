"""Tokens -> character ids, AllenNLP's convention."""
import numpy as np
import pytest

from elmo_jax import batch_to_char_ids


def test_ascii_token_and_padding():
    ids = batch_to_char_ids([["Hi", "!"], ["a"]])
    assert ids.shape == (2, 2, 50) and ids.dtype == np.int32
    np.testing.assert_array_equal(ids[0, 0, :5], [259, ord("H") + 1, ord("i") + 1, 260, 261])
    assert (ids[0, 0, 4:] == 261).all()
    assert not ids[1, 1].any(), "a padded token is all zeros"


def test_unicode_bytes():
    ids = batch_to_char_ids([["é日"]])[0, 0]
    want = [259] + [b + 1 for b in "é日".encode("utf-8")] + [260]
    np.testing.assert_array_equal(ids[:len(want)], want)


def test_long_token_is_truncated_to_48_bytes():
    ids = batch_to_char_ids([["x" * 60]])[0, 0]
    assert ids[0] == 259 and (ids[1:49] == ord("x") + 1).all() and ids[49] == 260


def test_sentence_markers_spelled_as_boundaries():
    ids = batch_to_char_ids([["<S>", "</S>"]])[0]
    np.testing.assert_array_equal(ids[0, :4], [259, 257, 260, 261])
    np.testing.assert_array_equal(ids[1, :4], [259, 258, 260, 261])


def test_empty_sentence_and_min_length():
    ids = batch_to_char_ids([[], ["a"]], min_length=4)
    assert ids.shape == (2, 4, 50) and not ids[0].any() and ids[1, 0].any()


@pytest.mark.parametrize("bad,err,needle", [
    ([], ValueError, "empty batch"),
    ("a sentence", TypeError, "list of sentences"),
    (["a b c"], TypeError, "sentence 0 is a str"),
    ([["ok", ""]], ValueError, "sentence 0, token 1: empty token"),
    ([["ok"], ["x", 3]], TypeError, "sentence 1, token 1"),
    ([["bad\udcff"]], ValueError, "not valid Unicode"),
])
def test_bad_input(bad, err, needle):
    with pytest.raises(err, match=needle):
        batch_to_char_ids(bad)


def test_trim_padding_keeps_a_padding_window_for_the_widest_filter():
    from elmo_jax.core.chars import PAD_CHAR, trim_padding

    ids = batch_to_char_ids([["ab", "abcdefghij"], ["c"]])        # longest: 10 bytes + 2 marks
    cut = trim_padding(ids, widest_filter=7)
    assert cut.shape == (2, 2, 24)                                  # 12 + 7, up to a multiple of 8
    np.testing.assert_array_equal(cut, ids[..., :24])
    assert (ids[0, 1, 12:] == PAD_CHAR + 1).all() and (cut[0, 1, 12:19] == PAD_CHAR + 1).all()
    assert trim_padding(ids, widest_filter=7, multiple=1).shape[-1] == 19
    # a token too long to leave a window of padding keeps every character
    assert trim_padding(batch_to_char_ids([["x" * 45]]), 7).shape[-1] == 50
    assert trim_padding(batch_to_char_ids([[], []], min_length=2), 3).shape[-1] == 8
