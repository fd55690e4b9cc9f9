"""Text in, nothing lost: line i of a file is entry i of what is made from it,
whatever characters the lines hold; every token reaches the model once and in
order; any str token spells as its UTF-8 bytes. Property-based (hypothesis)."""
import collections
import importlib.util
import os
import stat
import tempfile

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bilm_batcher import Batcher
from conftest import FIXTURES, REPO
from elmo_jax import batch_to_char_ids
from elmo_jax.core.chars import BOW_CHAR, EOW_CHAR, PAD_CHAR
from elmo_jax.data import DataError, TokenCorpus, read_sentences
from elmo_jax.storage.files import split_lines
from elmo_jax.core.vocab import EOS, BOS, build_vocab

# every character Python's str.splitlines breaks on, "\n" aside
LINE_BOUNDARIES = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
OPTIONS = os.path.join(FIXTURES, "options.json")
WEIGHTS = os.path.join(FIXTURES, "lm_weights.hdf5")

words = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_characters="\n"), min_size=1, max_size=12),
    st.sampled_from(["日本語", "naïve", "🙂👍🏽", "ﷺ", "x" * 1000, "ǅ", "\u200b", "מילה"]),
    st.sampled_from(list(LINE_BOUNDARIES)))
lines = st.lists(words, max_size=6).map(" ".join)


def _embed_cli():
    spec = importlib.util.spec_from_file_location("embed_cli", os.path.join(REPO, "embed.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(lines, max_size=8), st.sampled_from(["\n", "\r\n"]), st.booleans())
def test_embed_writes_one_entry_per_line(text_lines, newline, final_newline):
    text = newline.join(text_lines) + (newline if final_newline and text_lines else "")
    expected = [len(line.split()) for line in text_lines]
    if text_lines and not final_newline and text_lines[-1] == "":
        expected.pop()  # "a\n" + "" is one line, as in any text file
    with tempfile.TemporaryDirectory() as d:
        src, out = os.path.join(d, "in.txt"), os.path.join(d, "out.hdf5")
        with open(src, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        _embed_cli().main(["--input", src, "--output", out, "--options", OPTIONS,
                           "--weights", WEIGHTS, "--no_progress", "--layer", "2"])
        with h5py.File(out) as fh:
            assert sorted(fh.keys(), key=int) == [str(i) for i in range(len(expected))]
            assert [fh[str(i)].shape[0] for i in range(len(expected))] == expected


@given(st.text(st.characters(codec="utf-8"), max_size=40))
def test_split_lines_breaks_on_newline_only(text):
    got = split_lines(text)
    assert len(got) == text.count("\n") + (0 if text == "" or text.endswith("\n") else 1)
    assert all("\n" not in line for line in got)
    for ch in LINE_BOUNDARIES[1:]:  # kept inside their lines
        assert sum(line.count(ch) for line in got) == text.count(ch)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.text("abcde", min_size=1, max_size=3), min_size=1, max_size=7),
                min_size=1, max_size=12),
       st.integers(1, 4), st.integers(1, 5))
def test_batcher_emits_every_token_once_in_order(sentences, batch_size, unroll):
    sentences = [s + [f"#{k}"] for k, s in enumerate(sentences)]  # each one recognisable
    vocab = build_vocab(collections.Counter(w for s in sentences for w in s))
    rows = {d: [[] for _ in range(batch_size)] for d in range(2)}
    for batch in Batcher(iter(sentences), vocab, batch_size, unroll):
        for d in range(2):
            for b in range(batch_size):
                rows[d][b] += [vocab.words[i] for i in batch["targets"][d, b][batch["mask"][b]]]

    def cut(stream, end):
        out, cur = [], []
        for w in stream:
            if w == end:
                out.append(cur)
                cur = []
            else:
                cur.append(w)
        assert cur == [], "every sentence ends"
        return out

    seen = []
    for b in range(batch_size):
        fwd = cut(rows[0][b], EOS)                            # targets: w1 .. wn </S>
        bwd = [s[::-1] for s in cut(rows[1][b], BOS)]         # targets: wn .. w1 <S>
        assert fwd == bwd, "both directions read the same sentences"
        indices = [sentences.index(s) for s in fwd]
        assert indices == sorted(indices), "a row takes sentences in corpus order"
        seen += indices
    assert sorted(seen) == list(range(len(sentences))), "each sentence exactly once"


@given(st.lists(st.lists(st.text(st.characters(codec="utf-8"), min_size=1, max_size=70)
                         .filter(lambda t: t not in ("<S>", "</S>")), max_size=5),
                min_size=1, max_size=4))
def test_char_ids_spell_the_first_48_utf8_bytes(sentences):
    ids = batch_to_char_ids(sentences)
    for i, s in enumerate(sentences):
        for j, token in enumerate(s):
            data = token.encode("utf-8")[:48]
            row = ids[i, j]
            assert row[0] == BOW_CHAR + 1
            np.testing.assert_array_equal(row[1:1 + len(data)] - 1, np.frombuffer(data, np.uint8))
            assert row[1 + len(data)] == EOW_CHAR + 1
            assert (row[2 + len(data):] == PAD_CHAR + 1).all()
        assert not ids[i, len(s):].any()


def test_read_sentences_keeps_line_numbers(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes("a b\u2028c\r\n\nd\x85e\x0cf\n g \n".encode("utf-8"))
    assert read_sentences(str(path), keep_empty=True) == [["a", "b", "c"], [], ["d", "e", "f"],
                                                          ["g"]]


def test_empty_lines_and_shards_are_skipped_and_an_empty_corpus_names_its_files(tmp_path):
    (tmp_path / "0.txt").write_text("")
    (tmp_path / "1.txt").write_text("a b c\nd e\n")
    (tmp_path / "2.txt").write_text("\n  \n")
    corpus = TokenCorpus.from_files(str(tmp_path / "*.txt"))
    assert [[corpus.spellings[t] for t in corpus.tokens[a + 1:a + 1 + n]]
            for a, n in zip(corpus.starts, corpus.lengths)] == [["a", "b", "c"], ["d", "e"]]
    (tmp_path / "1.txt").write_text("\n\n")
    with pytest.raises(DataError, match="0.txt, .*1.txt, .*2.txt: the corpus is empty"):
        TokenCorpus.from_files(str(tmp_path / "*.txt"))


def test_written_files_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        (tmp_path / "in.txt").write_text("a b\n")
        _embed_cli().main(["--input", str(tmp_path / "in.txt"), "--output",
                           str(tmp_path / "out.hdf5"), "--options", OPTIONS, "--weights", WEIGHTS,
                           "--no_progress"])
        import elmo_jax

        options = elmo_jax.ElmoOptions.from_json(OPTIONS)
        elmo_jax.save_export(tmp_path / "export", elmo_jax.load_weights(WEIGHTS, options),
                             options)
    finally:
        os.umask(old)
    for path in (tmp_path / "out.hdf5", tmp_path / "export" / "weights.hdf5",
                 tmp_path / "export" / "options.json"):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o644, path
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_reading_the_umask_never_changes_it_for_other_threads(tmp_path):
    """Files created by other threads while elmo-jax reads the umask (on each
    whole-file write) get the umask's mode: reading it used to set it to 0
    for a moment, and a file created then was world-writable (0666: two
    threads creating files for 2 s met it every time here)."""
    import threading
    import time

    from elmo_jax.storage import paths

    old = os.umask(0o022)
    stop, modes = threading.Event(), set()

    def create(name):
        path = str(tmp_path / name)
        while not stop.is_set():
            fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o666)
            modes.add(stat.S_IMODE(os.fstat(fd).st_mode))
            os.close(fd)
            os.unlink(path)
    threads = [threading.Thread(target=create, args=(f"f{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2:
            for _ in range(1000):
                assert paths.umask() == 0o022
    finally:
        stop.set()
        for t in threads:
            t.join()
        os.umask(old)
    assert modes == {0o644}, sorted(map(oct, modes))
