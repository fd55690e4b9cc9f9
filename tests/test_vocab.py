"""bilm-tf vocabularies: build, load, and refuse broken files."""
import collections

import numpy as np
import pytest

from elmo_jax.core.vocab import Vocabulary, VocabError, build_vocab


def test_fixture_vocab(fixture_dir):
    v = Vocabulary.from_file(f"{fixture_dir}/train/vocab.txt")
    assert (v.bos, v.eos, v.unk) == (0, 1, 2) and len(v) == 32
    np.testing.assert_array_equal(v.encode(["of", "the", "zzz"]), [3, 4, 2])


def test_build_sorts_by_count_and_caps(tmp_path):
    counts = collections.Counter("a a a b b c d d d d".split())
    v = build_vocab(counts, max_vocab=5)
    assert v.words == ["<S>", "</S>", "<UNK>", "d", "a"]
    assert build_vocab(counts, min_count=2).words[3:] == ["d", "a", "b"]
    v.to_file(tmp_path / "v.txt")
    assert Vocabulary.from_file(tmp_path / "v.txt").words == v.words


@pytest.mark.parametrize("text,needle", [
    ("", "is empty"),
    ("the\nof\n", r"lacks the special token\(s\) <S>, </S>, <UNK>"),
    ("<S>\n</S>\n<UNK>\nthe\nthe\n", "'the' appears twice"),
])
def test_bad_files(tmp_path, text, needle):
    (tmp_path / "v.txt").write_text(text)
    with pytest.raises(VocabError, match=needle):
        Vocabulary.from_file(tmp_path / "v.txt")


def test_missing_file_and_empty_corpus(tmp_path):
    with pytest.raises(FileNotFoundError, match="vocabulary file not found"):
        Vocabulary.from_file(tmp_path / "none.txt")
    with pytest.raises(VocabError, match="corpus empty"):
        build_vocab(collections.Counter())
