"""A shortened English Wikipedia dump: the test file that ships inside the
`gensim` wheel (gensim/test/test_data/, 106 articles), fetched with
`pip download` (gensim is not installed), markup stripped, split into
sentences and Moses-tokenised. Held out: text of another source than the
training corpora, for perplexity only.

Writes CACHE/wiki-sample/heldout.txt.
"""
from __future__ import annotations

import bz2
import html
import os
import re
import xml.etree.ElementTree as ET

from elmo_jax.data.recipes import common
from elmo_jax.storage.files import split_lines

PIP_SPEC = "gensim==4.4.0"
VERSION = 1
MEMBER = "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"

_SUBS = [
    (re.compile(r"<!--.*?-->", re.S), " "),
    (re.compile(r"<ref[^>]*/>", re.S), " "),
    (re.compile(r"<ref[^>]*>.*?</ref>", re.S), " "),
    (re.compile(r"<(math|gallery|timeline|source|pre|code)[^>]*>.*?</\1>", re.S), " "),
    (re.compile(r"<[^>]+>"), " "),
    (re.compile(r"\[\[(?:File|Image|Category|[a-z\-]{2,12}):[^\[\]]*\]\]", re.I), " "),
    (re.compile(r"\[\[[^\[\]|]*\|([^\[\]]*)\]\]"), r"\1"),
    (re.compile(r"\[\[([^\[\]]*)\]\]"), r"\1"),
    (re.compile(r"\[(?:https?|ftp)://\S+ ([^\]]*)\]"), r"\1"),
    (re.compile(r"\[(?:https?|ftp)://\S+\]"), " "),
    (re.compile(r"'{2,}"), ""),
]
_NESTED = [re.compile(r"\{\{[^{}]*\}\}"), re.compile(r"\{\|[^{}]*?\|\}", re.S)]


def strip_markup(text: str) -> str:
    """Wikitext -> plain prose paragraphs (templates, tables, references,
    files, headings and lists removed; links replaced by their text)."""
    text = html.unescape(html.unescape(text))
    for _ in range(20):  # templates and tables nest
        new = text
        for pattern in _NESTED:
            new = pattern.sub(" ", new)
        if new == text:
            break
        text = new
    for _ in range(3):  # links inside file captions
        for pattern, repl in _SUBS:
            text = pattern.sub(repl, text)
    keep = []
    for line in split_lines(text):
        line = line.strip()
        if not line or line[0] in "=*#:;|!{}" or line.startswith("----"):
            continue
        keep.append(line)
    return "\n".join(keep)


def articles(path: str):
    """(title, wikitext) of every main-namespace article in a bz2 XML dump."""
    with bz2.open(path, "rb") as fh:
        for _, elem in ET.iterparse(fh):
            if elem.tag.endswith("}page"):
                ns = elem.find("{*}ns")
                title = elem.find("{*}title")
                text = elem.find(".//{*}text")
                if ns is not None and ns.text == "0" and text is not None and text.text:
                    if not text.text.lstrip().lower().startswith("#redirect"):
                        yield title.text, text.text
                elem.clear()


def prepare(cache_dir: str | None = None, dump_path: str | None = None) -> dict:
    out, done = common.begin("wiki-sample", cache_dir, VERSION)
    if done:
        return done
    if dump_path is None:
        dump_path = common.pip_fetch_member(PIP_SPEC, MEMBER, out)
    tok = common.Tokenizer()
    sentences, n_articles = [], 0
    for _, text in articles(dump_path):
        n_articles += 1
        for paragraph in split_lines(strip_markup(text)):
            sentences.extend(s for s in tok.sentences(paragraph) if len(s) > 2)
    if not sentences:
        raise common.RecipeError(f"no article text in {dump_path}")
    n = common.write_sentences(os.path.join(out, "heldout.txt"), sentences)
    return common.mark_done(out, VERSION, {"recipe": "wiki-sample", "source": f"pip {PIP_SPEC}: {MEMBER}",
                                  "articles": n_articles, "sentences": len(sentences), "tokens": n,
                                  "heldout_file": os.path.join(out, "heldout.txt")})
