"""Training batches (`data.streams`, `data.workers`) against a plain Python
reference of the same streams: row r reads items r, r + B, r + 2B, ... of the
epochs' seeded orders one after another, bilm-tf's windows over them; resumed
from any split of the rows; the table shapes; a prepared folder."""
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import REPO
from elmo_jax.core.chars import token_to_char_ids
from elmo_jax.data import (DataError, ParallelStreamBatcher, StreamBatcher, TokenCorpus,
                           largest_table)
from elmo_jax.core.vocab import build_vocab, count_tokens


def reference_streams(sentences, batch_size, seed, positions):
    """Row r's first `positions` (forward input, forward target, backward
    input, backward target) tokens, written out the slow way."""
    N = len(sentences)
    out = []
    for r in range(batch_size):
        row, k = [], 0
        while len(row) < positions:
            epoch, i = divmod(r + k * batch_size, N)
            words = sentences[np.random.default_rng([seed, epoch]).permutation(N)[i]]
            ext, n = ["<S>", *words, "</S>"], len(words)
            row += [(ext[j], ext[j + 1], ext[n + 1 - j], ext[n - j]) for j in range(n + 1)]
            k += 1
        out.append(row[:positions])
    return out


def decode(batch, vocab):
    """A batch's [2, B, U] input spellings (from its tables) and target words."""
    chars, index = batch["token_chars"], batch["token_index"]
    S, B = chars.shape[0], index.shape[1]
    group = np.arange(B) // (B // S)
    spelled = chars[group[None, :, None], index]                  # [2, B, U, W]
    return spelled, np.array(vocab.words)[batch["targets"]]


def check_against_reference(batches, sentences, vocab, batch_size, seed, unroll, first_row=0):
    ref = reference_streams(sentences, first_row + batch_size, seed, len(batches) * unroll)
    for n, batch in enumerate(batches):
        spelled, targets = decode(batch, vocab)
        width = spelled.shape[-1]
        for b in range(spelled.shape[1]):
            for t in range(unroll):
                fi, fo, bi, bo = ref[first_row + b][n * unroll + t]
                for d, (word, target) in enumerate(((fi, fo), (bi, bo))):
                    np.testing.assert_array_equal(spelled[d, b, t], token_to_char_ids(word)[:width])
                    want = target if target in vocab.words else "<UNK>"
                    assert targets[d, b, t] == want, (n, b, t, d)
        assert batch["mask"].all()


words = st.text("abcdefghij", min_size=1, max_size=12)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(words, min_size=1, max_size=9), min_size=1, max_size=12),
       st.sampled_from([(2, 1), (4, 2), (6, 3)]), st.integers(1, 6), st.integers(0, 3))
def test_batches_are_the_reference_streams(sentences, batch_groups, unroll, seed):
    """Any corpus (fewer sentences than rows too, epochs crossed), any rows,
    groups and window: each position's spelling (through its group's table,
    cut to the batch's width) and target are the reference's; OOV words are
    spelled as written and predicted as <UNK>."""
    batch_size, groups = batch_groups
    vocab = build_vocab(count_tokens(sentences), max_vocab=6)
    batcher = StreamBatcher(TokenCorpus.from_sentences(sentences), vocab, batch_size, unroll, 50,
                            groups, seed=seed, widest_filter=3)
    batches = [next(batcher) for _ in range(6)]
    check_against_reference(batches, sentences, vocab, batch_size, seed, unroll)
    rows, widths = batcher.shapes.rows, batcher.shapes.widths
    assert len(rows) <= 2 and len(widths) <= 2
    assert {b["token_chars"].shape[1:] for b in batches} <= set(batcher.shapes.all())


def _corpus(n=300, seed=0):
    rng = np.random.default_rng(seed)
    vocab_words = [f"w{i}" for i in range(200)] + ["a-long-token-of-thirty-letters"]
    sentences = [[vocab_words[k] for k in np.minimum(rng.zipf(1.3, rng.integers(1, 30)), 200)]
                 for _ in range(n)]
    return sentences, build_vocab(count_tokens(sentences), max_vocab=100)


def test_a_position_resumes_on_any_split_of_the_rows():
    """8 rows in 4 groups, 5 batches made: the position (per-row cursors)
    continues as one batcher, as two of 4 rows (two processes), as four
    of 2 rows, and, without cursors, found again from the batch count."""
    sentences, vocab = _corpus()
    corpus = TokenCorpus.from_sentences(sentences)
    whole = StreamBatcher(corpus, vocab, 8, 7, 50, 4, seed=1, widest_filter=7)
    for _ in range(5):
        next(whole)
    saved = whole.position()
    want = [decode(next(whole), vocab) for _ in range(12)]  # past an epoch of 300 sentences
    for parts in (1, 2, 4):
        rows = 8 // parts
        for p in range(parts):
            part = StreamBatcher(corpus, vocab, 8, 7, 50, 4, rows=(p * rows, (p + 1) * rows),
                                 seed=1, widest_filter=7)
            part.restore({"batches": 5, "cursors": saved["cursors"][p * rows:(p + 1) * rows]})
            for spelled, targets in want:
                got_spelled, got_targets = decode(next(part), vocab)
                w = got_spelled.shape[-1]
                np.testing.assert_array_equal(got_targets, targets[:, p * rows:(p + 1) * rows])
                wider = ((0, 0),) * 3 + ((0, max(0, w - spelled.shape[-1])),)
                np.testing.assert_array_equal(
                    got_spelled,
                    np.pad(spelled, wider, constant_values=261)[:, p * rows:(p + 1) * rows, :, :w])
    found = StreamBatcher(corpus, vocab, 8, 7, 50, 4, seed=1, widest_filter=7)
    found.restore({"batches": 5, "cursors": None})
    np.testing.assert_array_equal(found.position()["cursors"], saved["cursors"])


def test_table_shapes_are_few_fixed_and_fit_every_batch():
    sentences, vocab = _corpus(2000)
    batcher = StreamBatcher(TokenCorpus.from_sentences(sentences), vocab, 64, 20, 50, 2,
                            seed=0, widest_filter=7)
    shapes = batcher.shapes
    n_spellings = len(batcher.tables.width)  # at most 204 (3 + 201): fewer than a window's
    assert shapes.rows[-1] == -(-(n_spellings + 1) // 8) * 8 < largest_table(32, 20)
    assert shapes.widths[-1] == 40 and len(shapes.all()) <= 4  # the 30-byte token: 32 + 7
    needs = set()
    for _ in range(200):
        parts = batcher.next_parts()
        assert parts["counts"].max() + 1 <= shapes.at(parts["need"])[0]
        needs.add(parts["need"])
    assert (0, 0) in needs  # the small shape is the usual one


def test_a_prepared_folder_reads_as_the_text(tmp_path):
    sentences, vocab = _corpus()
    (tmp_path / "a.txt").write_text("\n".join(" ".join(s) for s in sentences[:150]) + "\n")
    (tmp_path / "b.txt").write_text("\n\n".join(" ".join(s) for s in sentences[150:]) + "\n")
    r = subprocess.run([sys.executable, os.path.join(REPO, "train.py"), "prepare",
                        "--train_files", str(tmp_path / "*.txt"), "--out",
                        str(tmp_path / "prepared")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    record = json.loads(r.stdout.splitlines()[-1])
    assert record["sentences"] == 300 and record["tokens"] == sum(map(len, sentences))
    loaded = TokenCorpus.load(str(tmp_path / "prepared"))
    assert isinstance(loaded.tokens, np.memmap)
    a = StreamBatcher(loaded, vocab, 4, 5, 50, 2, seed=3)
    b = StreamBatcher(TokenCorpus.from_sentences(sentences), vocab, 4, 5, 50, 2, seed=3)
    for _ in range(20):
        x, y = next(a), next(b)
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])
    with pytest.raises(DataError, match="not a prepared corpus"):
        TokenCorpus.load(str(tmp_path))


def test_input_workers_make_the_same_batches_and_say_when_one_dies(tmp_path):
    sentences, vocab = _corpus()
    corpus = TokenCorpus.from_sentences(sentences)
    single = StreamBatcher(corpus, vocab, 8, 5, 50, 4, seed=2, widest_filter=7)
    par = ParallelStreamBatcher(StreamBatcher(corpus, vocab, 8, 5, 50, 4, seed=2,
                                              widest_filter=7), workers=2, ahead=2)
    try:
        for _ in range(6):
            want, got = next(single), next(par)
            for k in want:
                np.testing.assert_array_equal(got[k], want[k])
        np.testing.assert_array_equal(par.position()["cursors"], single.position()["cursors"])
        par.restore(single.position())  # workers restart from a position
        want, got = next(single), next(par)
        np.testing.assert_array_equal(got["targets"], want["targets"])
        victim = par._procs[1]
        os.kill(victim.pid, signal.SIGKILL)
        with pytest.raises(DataError, match=rf"input worker 1 \(pid {victim.pid}\) died: "
                                            r"killed by signal 9 \(out of memory\?\)"):
            for _ in range(10):  # the parts it made before are still read first
                next(par)
    finally:
        par.close()
    with pytest.raises(DataError, match="4 row groups .* do not split over 3 input workers"):
        ParallelStreamBatcher(single, workers=3)


def test_once_reads_every_sentence_in_order_then_padding():
    """Evaluation's streams: row r reads sentences r, r + B, ... of the corpus
    in order, each word predicted once per direction, then padding (mask
    False) for the `batches_once` windows the longest row needs."""
    from elmo_jax.data import batches_once

    sentences, vocab = _corpus(23)
    corpus = TokenCorpus.from_sentences(sentences)
    B, U = 4, 6
    batcher = StreamBatcher(corpus, vocab, B, U, 50, 2, once=True)
    n = batches_once(corpus, B, U)
    batches = [next(batcher) for _ in range(n + 1)]
    assert batches[n - 1]["mask"].any() and not batches[n]["mask"].any()
    words = np.array(vocab.words)
    for r in range(B):
        want_forward, want_backward = [], []
        for s in sentences[r::B]:
            known = [w if w in vocab.words else "<UNK>" for w in s]
            want_forward += known + ["</S>"]
            want_backward += known[::-1] + ["<S>"]
        got = [[words[b["targets"][d, r]][b["mask"][r]] for b in batches] for d in (0, 1)]
        assert list(np.concatenate(got[0])) == want_forward
        assert list(np.concatenate(got[1])) == want_backward


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(st.characters(codec="utf-8"), min_size=1, max_size=60), max_size=20))
def test_all_spellings_at_once_are_each_token_s_char_ids(tokens):
    """`spell_all` (numpy over every spelling of a corpus) against
    `chars.token_to_char_ids` one token at a time; `<S>` and `</S>` included."""
    from elmo_jax.data.streams import spell_all

    spellings = ["", "<S>", "</S>", *tokens]
    got = spell_all(spellings, 50)
    assert not got[0].any()
    for i, w in enumerate(spellings[1:], 1):
        np.testing.assert_array_equal(got[i], token_to_char_ids(w, 50))
    with pytest.raises(DataError, match="not valid Unicode text"):
        spell_all(["", "ok", "bad\udcff"], 50)
