"""Text -> bilm-tf windows: streams, targets, resumable position, host shards."""
import collections
import os

import numpy as np
import pytest

from elmo_jax import batch_to_char_ids
from elmo_jax.data import (Batcher, DataError, IndexedSource, OnceSource, TextSource,
                           read_sentences)
from elmo_jax.vocab import build_vocab


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
    from elmo_jax.data import pad_tables

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


def test_position_restore_continues_exactly(tmp_path):
    sents = [[f"t{i}", f"u{i % 3}", "x"][: 1 + i % 3] for i in range(30)]
    path = _corpus(tmp_path, sents)
    vocab = _vocab(sents)
    a = Batcher(TextSource(path, seed=3), vocab, 3, 4)
    for _ in range(7):
        next(a)
    pos = a.position()
    want = [next(a) for _ in range(25)]  # runs past an epoch boundary
    b = Batcher(TextSource(path, seed=3), vocab, 3, 4)
    b.restore(pos)
    for w in want:
        got = next(b)
        for k in w:
            np.testing.assert_array_equal(got[k], w[k])


def test_epochs_reshuffle_with_the_seed(tmp_path):
    paths = [_corpus(tmp_path, [[f"s{j}_{i}"] for i in range(20)], f"s{j}.txt") for j in range(3)]
    del paths
    src = TextSource(str(tmp_path / "*.txt"), seed=1)
    epoch0 = [src.next_sentence()[0] for _ in range(60)]
    epoch1 = [src.next_sentence()[0] for _ in range(60)]
    assert sorted(epoch0) == sorted(epoch1) and epoch0 != epoch1
    again = TextSource(str(tmp_path / "*.txt"), seed=1)
    assert [again.next_sentence()[0] for _ in range(60)] == epoch0


def test_hosts_read_disjoint_shards(tmp_path):
    for j in range(4):
        _corpus(tmp_path, [[f"s{j}"]], f"s{j}.txt")
    shards = [set(TextSource(str(tmp_path / "*.txt"), process_index=i, process_count=2).shards)
              for i in range(2)]
    assert not shards[0] & shards[1] and len(shards[0] | shards[1]) == 4
    with pytest.raises(DataError, match="cannot feed 5 processes"):
        TextSource(str(tmp_path / "*.txt"), process_index=4, process_count=5)


def test_bad_text(tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"fine line\nbad \xff byte\n")
    with pytest.raises(DataError, match=r"bad.txt, line 2: not valid UTF-8"):
        read_sentences(str(tmp_path / "bad.txt"))
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(DataError, match="the corpus is empty"):
        TextSource(str(tmp_path / "empty.txt")).next_sentence()
    with pytest.raises(DataError, match="no files match"):
        OnceSource(str(tmp_path / "nothing*.txt"))


def test_lm1b_source_through_tfds_mock_data():
    import tensorflow_datasets as tfds

    from elmo_jax.data import lm1b_source

    with tfds.testing.mock_data(num_examples=50):
        src = lm1b_source("train", seed=2)
        sents = [src.next_sentence() for _ in range(50)]
        assert all(isinstance(w, str) for s in sents for w in s)
        vocab = _vocab(sents)
        a = Batcher(lm1b_source("train", seed=2), vocab, 2, 5)
        next(a)
        pos = a.position()
        want = [next(a) for _ in range(30)]  # crosses an epoch
        b = Batcher(lm1b_source("train", seed=2), vocab, 2, 5)
        b.restore(pos)
        for w in want:
            np.testing.assert_array_equal(window_char_ids(next(b)), window_char_ids(w))
        halves = [set(lm1b_source("train", process_index=i, process_count=2).mine) for i in (0, 1)]
        assert not halves[0] & halves[1] and len(halves[0] | halves[1]) == 50


def _shards(tmp_path, n=4, per=30):
    import random

    rnd = random.Random(0)
    words = [f"w{i}" for i in range(40)]
    sentences = []
    for k in range(n):
        lines = [[rnd.choice(words) for _ in range(rnd.randint(1, 9))] for _ in range(per)]
        sentences += lines
        (tmp_path / f"s{k}.txt").write_text("\n".join(" ".join(s) for s in lines) + "\n")
    return str(tmp_path / "s*.txt"), _vocab(sentences)


def test_parallel_batcher_is_its_workers_batchers_side_by_side(tmp_path):
    from elmo_jax.data import ParallelBatcher

    pattern, vocab = _shards(tmp_path)
    par = ParallelBatcher(pattern, vocab, batch_size=6, unroll_steps=4, n_groups=2, workers=2,
                          seed=3)
    direct = [Batcher(TextSource(pattern, seed=3, process_index=w, process_count=2), vocab,
                      3, 4, n_groups=1) for w in range(2)]
    try:
        for _ in range(5):
            got = next(par)
            parts = [next(b) for b in direct]
            np.testing.assert_array_equal(got["targets"],
                                          np.concatenate([p["targets"] for p in parts], 1))
            np.testing.assert_array_equal(got["mask"], np.concatenate([p["mask"] for p in parts]))
            np.testing.assert_array_equal(
                window_char_ids(got),
                np.concatenate([window_char_ids(p) for p in parts], axis=1))
        saved = par.position()
        after = [next(par) for _ in range(3)]
    finally:
        par.close()
    again = ParallelBatcher(pattern, vocab, batch_size=6, unroll_steps=4, n_groups=2, workers=2,
                            seed=3)
    again.restore(saved)
    try:
        for want in after:
            got = next(again)
            for k in want:
                np.testing.assert_array_equal(got[k], want[k])
    finally:
        again.close()
    three = ParallelBatcher(pattern, vocab, batch_size=6, unroll_steps=4, n_groups=3, workers=3)
    with pytest.raises(DataError, match="of 2 input workers; this run has 3"):
        three.restore(saved)


def test_a_dead_input_worker_is_an_error_naming_it(tmp_path):
    """A worker killed outright (as the kernel kills for memory) leaves nothing on
    its queue: the batcher says which worker died, not wait forever."""
    import signal

    from elmo_jax.data import ParallelBatcher

    pattern, vocab = _shards(tmp_path)
    par = ParallelBatcher(pattern, vocab, batch_size=6, unroll_steps=4, n_groups=2, workers=2,
                          ahead=2)
    try:
        next(par)
        victim = par._procs[1]
        os.kill(victim.pid, signal.SIGKILL)
        with pytest.raises(DataError, match=rf"input worker 1 \(pid {victim.pid}\) died: "
                                            r"killed by signal 9 \(out of memory\?\)"):
            for _ in range(10):  # the batches it made before are still read first
                next(par)
    finally:
        par.close()


def test_each_process_shuffles_its_share_with_its_own_seed(tmp_path):
    """Two processes, one run seed: their shares are disjoint and cover the
    corpus, and they are not shuffled alike (with one shuffle seed, process 1
    would read the neighbour of each record process 0 reads)."""
    records = [f"sentence {i}" for i in range(100)]
    first = [IndexedSource(records, seed=3, process_index=i, process_count=2) for i in (0, 1)]
    reads = [[int(s.next_sentence()[1]) for _ in range(50)] for s in first]
    assert sorted(reads[0] + reads[1]) == list(range(100))
    assert sum(b - a == 1 for a, b in zip(*reads)) < 10
    for k in range(4):  # text shards: two per process, each 30 sentences
        (tmp_path / f"shard{k}.txt").write_text("".join(f"s{k} {i}\n" for i in range(30)))
    text = [TextSource(str(tmp_path / "shard*.txt"), seed=3, process_index=i, process_count=2)
            for i in (0, 1)]
    reads = [[int(s.next_sentence()[1]) for _ in range(30)] for s in text]
    assert reads[0] != reads[1]
