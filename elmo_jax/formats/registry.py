"""The published ELMo models, by name (data only; `hub.py` fetches them).

Each entry says where its facts come from (`sources`: the page or file and
the commit or date it was read at) and which of them are not published but
inferred (`inferred`). Each file lists its URLs in the order they are tried
(a publisher's alternatives: AllenNLP's path-style S3 URLs, then the
virtual-host form AllenNLP's own code uses), with the digests and sizes its
publisher gives; `note` is said when every URL fails (links reported dead,
and where users have found copies).

Families: AllenNLP's models and the contributed ones listed on
allennlp.org/elmo (an options/weights pair each; the German one a tarball in
four parts), HIT-SCIR's ELMoForManyLangs (an archive of a model folder,
`manylangs.py`), and ELMo models in bilm-tf's format from the NLPL
repository (a zip of model.hdf5, options.json and a vocabulary).
"""
from __future__ import annotations

import dataclasses

READ = "2026-12-04"  # when the sources below were read for this registry


@dataclasses.dataclass(frozen=True)
class File:
    role: str                       # options, weights, vocab, softmax or archive
    urls: tuple = ()                # tried in order
    size: int | None = None         # bytes, where known
    md5: str | None = None          # digests, where the publisher gives them
    sha1: str | None = None
    sha256: str | None = None
    parts: tuple = ()               # a file published in pieces (Files), joined in order

    @property
    def digests(self) -> dict:
        return {k: v for k, v in (("md5", self.md5), ("sha1", self.sha1),
                                  ("sha256", self.sha256)) if v}


@dataclasses.dataclass(frozen=True)
class Published:
    name: str
    kind: str              # "pair" (options + weights), "archive" (a model folder) or
                           # "unsupported" (another architecture)
    family: str            # who publishes it
    language: str
    data: str              # what it was trained on, as published
    files: tuple           # Files
    params: str = ""       # parameters, as published ("" where not)
    sources: tuple = ()    # (what, where, read at) for the facts above
    inferred: tuple = ()   # the facts above that no source states
    note: str = ""         # said when no URL answers, or when it is asked for unsupported

    def file(self, role: str) -> File | None:
        return next((f for f in self.files if f.role == role), None)

    def url(self, role: str) -> str | None:
        f = self.file(role)
        if f is None:
            return None
        return f.urls[0] if f.urls else f.parts[0].urls[0]


# -- AllenNLP (allennlp.org/elmo) --------------------------------------------

_ELMO_PAGE = ("allennlp.org/elmo", "github.com/allenai/allennlp-website elmo.html",
              f"commit 04d542e9, read {READ}")
_S3 = "https://s3-us-west-2.amazonaws.com/allennlp/models/elmo"
_S3_HOST = "https://allennlp.s3.amazonaws.com/models/elmo"  # allennlp's own code's form


def _allennlp_urls(path: str) -> tuple:
    return (f"{_S3}/{path}", f"{_S3_HOST}/{path}")


def _pair(name, options, weights, language, data, params="", family="AllenNLP",
          sources=(_ELMO_PAGE,), inferred=(), weights_size=None, extra=()):
    files = (File("options", _allennlp_urls(options)),
             File("weights", _allennlp_urls(weights), size=weights_size)) + tuple(extra)
    return Published(name, "pair", family, language, data, files, params, sources, inferred)


_ORIGINAL = "elmo_2x4096_512_2048cnn_2xhighway"
_BENCHMARK = "1B Word Benchmark (about 800M tokens of WMT 2011 news crawl)"
_SOFTMAX_ISSUE = ("the softmax's URL", "github.com/allenai/bilm-tf issue #126 (quoted there; "
                  "not in bilm-tf's README)", f"read {READ}")
_VOCAB_PR = ("the vocabulary's URL", "github.com/allenai/allennlp pull request #1725 "
             "(the softmax vocabulary of `allennlp elmo`)", f"read {READ}")

MODELS = [
    _pair("small", "2x1024_128_2048cnn_1xhighway/elmo_2x1024_128_2048cnn_1xhighway_options.json",
          "2x1024_128_2048cnn_1xhighway/elmo_2x1024_128_2048cnn_1xhighway_weights.hdf5",
          "English", _BENCHMARK, "13.6M"),
    _pair("medium", "2x2048_256_2048cnn_1xhighway/elmo_2x2048_256_2048cnn_1xhighway_options.json",
          "2x2048_256_2048cnn_1xhighway/elmo_2x2048_256_2048cnn_1xhighway_weights.hdf5",
          "English", _BENCHMARK, "28.0M"),
    _pair("original", f"2x4096_512_2048cnn_2xhighway/{_ORIGINAL}_options.json",
          f"2x4096_512_2048cnn_2xhighway/{_ORIGINAL}_weights.hdf5", "English", _BENCHMARK,
          "93.6M", sources=(_ELMO_PAGE, _SOFTMAX_ISSUE, _VOCAB_PR),
          inferred=("the weights' size, 374,434,792 bytes: from download logs, not published",),
          weights_size=374_434_792,
          extra=(File("vocab", _allennlp_urls("2x4096_512_2048cnn_2xhighway/vocab-2016-09-10.txt")),
                 File("softmax", _allennlp_urls(f"2x4096_512_2048cnn_2xhighway/"
                                                f"{_ORIGINAL}_softmax_weights.hdf5")))),
    _pair("original-5.5b", f"2x4096_512_2048cnn_2xhighway_5.5B/{_ORIGINAL}_5.5B_options.json",
          f"2x4096_512_2048cnn_2xhighway_5.5B/{_ORIGINAL}_5.5B_weights.hdf5", "English",
          "5.5B tokens: Wikipedia (1.9B) + WMT 2008-2012 monolingual news crawl (3.6B)", "93.6M"),
    _pair("pubmed", f"contributed/pubmed/{_ORIGINAL}_options.json",
          f"contributed/pubmed/{_ORIGINAL}_weights_PubMed_only.hdf5", "English (biomedical)",
          "a random selection of PubMed abstracts, 797M tokens", "93.6M",
          family="AllenNLP (Matthew Peters)",
          sources=(_ELMO_PAGE, ("the corpus", "github.com/allenai/allennlp issue #4896 "
                                "(matt-peters, 2021-01-08)", f"read {READ}")),
          inferred=("the 93.6M parameters: the original's architecture (its options), "
                    "not published for this model",)),
    _pair("pt-wikipedia", "contributed/pt/wikipedia/options.json",
          "contributed/pt/wikipedia/elmo_pt_weights.hdf5", "Portuguese", "Portuguese Wikipedia",
          family="Federal University of Goiás (UFG)"),
    _pair("pt-brwac", "contributed/pt/brwac/options.json",
          "contributed/pt/brwac/elmo_pt_weights_dgx1.hdf5", "Portuguese",
          "brWaC (Brazilian web corpus)", family="Federal University of Goiás (UFG)"),
    Published("ja-exawizards", "pair", "ExaWizards Inc. (Enkhbold Bataa, Joshua Wu)", "Japanese",
              "not stated on allennlp.org/elmo (see the paper it links: ACL 2019, P19-1458)",
              (File("options", ("https://exawizardsallenlp.blob.core.windows.net/data/"
                                "options.json",)),
               File("weights", ("https://exawizardsallenlp.blob.core.windows.net/data/"
                                "weights.hdf5",))),
              sources=(_ELMO_PAGE,)),
]

# The German model: a tarball in four parts on the repository's release, with the
# MD5 and SHA-1 of each part and of the whole; it holds weights.hdf5, options.json,
# vocab-train.txt and bilm-tf's checkpoint.
_DE = ("https://github.com/t-systems-on-site-services-gmbh/german-elmo-model/releases/download/"
       "files_1/bilm-output-result.tgz.part-0")
_DE_PARTS = [("755379908885a6fa6fb5b68e4806eae0", "39b16d8eaeaa6ff8c161d092fd223704cc3963e6"),
             ("0a6544017c64cda91a2b209ecbdc5f2c", "4647c43037b01a67e6c206c9748c5e5b8ab936f8"),
             ("f316774e8bd12d078bd5e869c64be14b", "10530cb852cf26f6340c2b4d1cfbeb882f44692b"),
             ("ae44a2d3cf95795edacba690b77a4e7b", "c54bcdc27d769e2c5a077d7ab342ee34dd1f3ec2")]
MODELS.append(Published(
    "de-tsystems", "archive", "T-Systems on site services (Philip May)", "German",
    "German Wikipedia with its talk pages (t-systems-on-site-services-gmbh/"
    "german-wikipedia-text-corpus): 962,868,231 training tokens, an 800,000-word vocabulary",
    (File("archive", md5="2aa41bbc32d42eae052a7ddf37909443",
          sha1="9af7efbdd480a919c45e11188625d59a5943f9b9",
          parts=tuple(File(f"part {i}", (f"{_DE}{i}",), md5=md5, sha1=sha1)
                      for i, (md5, sha1) in enumerate(_DE_PARTS))),),
    sources=(_ELMO_PAGE, ("files, digests, corpus", "github.com/t-systems-on-site-services-gmbh/"
                          "german-elmo-model README.md", f"commit f3ff86e4, read {READ}")),
    note="published as four parts joined in order (`cat`), each part and the whole checked "
         "against the README's MD5 and SHA-1"))

_PLUR = ("files, corpus", "github.com/stefan-it/plur README.md", f"commit 9159eee6, read {READ}")
MODELS += [
    Published("eu-schweter", "pair", "Stefan Schweter", "Basque",
              "Basque Wikipedia + OPUS + Leipzig Corpora Collection: 72,683,662 tokens "
              "(tokenized), a 700,000-word vocabulary",
              (File("options", ("https://schweter.eu/cloud/eu-elmo/options.json",)),
               File("weights", ("https://schweter.eu/cloud/eu-elmo/weights.hdf5",))),
              sources=(_ELMO_PAGE, _PLUR)),
    Published("ta-schweter", "pair", "Stefan Schweter", "Tamil", "not stated",
              (File("options", ("https://schweter.eu/cloud/ta-elmo/options.json",)),
               File("weights", ("https://schweter.eu/cloud/ta-elmo/weights.hdf5",))),
              sources=(_PLUR,),
              inferred=("the URLs: eu-elmo's with ta-elmo; the plur README read lists "
                        "Basque only",)),
    Published("transformer-elmo", "unsupported", "AllenNLP (Joel Grus, Brendan Roof)", "English",
              _BENCHMARK,
              (File("archive", ("https://s3-us-west-2.amazonaws.com/allennlp/models/"
                                "transformer-elmo-2019.01.10.tar.gz",)),),
              sources=(_ELMO_PAGE,),
              inferred=("the corpus: the page says so of every model but the 5.5B one",),
              note="the Transformer ELMo is another architecture (a bidirectional transformer "
                   "language model, not the LSTM biLM elmo-jax runs); AllenNLP's "
                   "training_transformer_elmo tutorial loads it"),
]

# -- ELMoForManyLangs (HIT-SCIR) -----------------------------------------------

# ISO 639-1 code (grc: ISO 639-3, Ancient Greek has none), language, NLPL repository id.
_MANYLANGS = [
    ("ar", "Arabic", 136), ("bg", "Bulgarian", 137), ("ca", "Catalan", 138),
    ("cs", "Czech", 139), ("cu", "Old Church Slavonic", 140), ("da", "Danish", 141),
    ("de", "German", 142), ("el", "Greek", 143), ("en", "English", 144),
    ("es", "Spanish", 145), ("et", "Estonian", 146), ("eu", "Basque", 147),
    ("fa", "Persian", 148), ("fi", "Finnish", 149), ("fr", "French", 150),
    ("ga", "Irish", 151), ("gl", "Galician", 152), ("grc", "Ancient Greek", 153),
    ("he", "Hebrew", 154), ("hi", "Hindi", 155), ("hr", "Croatian", 156),
    ("hu", "Hungarian", 157), ("id", "Indonesian", 158), ("it", "Italian", 159),
    ("ja", "Japanese", 160), ("ko", "Korean", 161), ("la", "Latin", 162),
    ("lv", "Latvian", 163), ("nl", "Dutch", 164), ("nb", "Norwegian Bokmål", 165),
    ("nn", "Norwegian Nynorsk", 166), ("pl", "Polish", 167), ("pt", "Portuguese", 168),
    ("ro", "Romanian", 169), ("ru", "Russian", 170), ("sk", "Slovak", 171),
    ("sl", "Slovene", 172), ("sv", "Swedish", 173), ("tr", "Turkish", 174),
    ("ug", "Uyghur", 175), ("uk", "Ukrainian", 176), ("ur", "Urdu", 177),
    ("vi", "Vietnamese", 178), ("zht", "Chinese (Traditional)", 179),
]
_MANYLANGS_README = ("files, corpus", "github.com/HIT-SCIR/ELMoForManyLangs README.md "
                     "(Downloads; Technique Details)", f"read {READ}")
_CONLL = "CoNLL 2017 raw text (Wikipedia + Common Crawl), 20M words sampled"
_MANYLANGS_PARAMS = ("the parameters: not published; the architecture "
                     "(cnn_50_100_512_4096_sample.json) is the original's with 50-d characters "
                     "and a 100-d word embedding, so a 2,148-wide projection input, plus each "
                     "language's character and word tables")
_HANDLE = ("the year: the README says the shared task's raw text; the CoNLL 2018 task reused "
           "CoNLL 2017's (LINDAT 11234/1-1989)")
MODELS += [Published(f"manylangs-{code}", "archive", "HIT-SCIR (ELMoForManyLangs)", language,
                     _CONLL, (File("archive", (f"http://vectors.nlpl.eu/repository/11/"
                                               f"{number}.zip",)),),
                     sources=(_MANYLANGS_README,), inferred=(_MANYLANGS_PARAMS, _HANDLE))
           for code, language, number in _MANYLANGS]
MODELS.append(Published(
    "manylangs-zhs", "archive", "HIT-SCIR (ELMoForManyLangs)", "Chinese (Simplified)",
    "the Xinhua portion of Chinese Gigaword v5 (LDC2011T13)",
    (File("archive", ("http://39.96.43.154/zhs.model.tar.bz2",)),),
    sources=(_MANYLANGS_README + ("(its link since 2020-10)",),
             ("the dead links", "github.com/HIT-SCIR/ELMoForManyLangs issues #36, #57, #61, "
              "#106 (2025-04: the README's link is broken)", f"read {READ}")),
    inferred=(_MANYLANGS_PARAMS,),
    note="its publisher's link is reported dead (ELMoForManyLangs issue #106; the earlier "
         "pan.baidu.com and pbmpb9h15.bkt.gdipper.com links were removed after issue #36). "
         "Users have found a copy that the GNES project's build scripts fetch: "
         "https://gnes-1252847528.cos.ap-guangzhou.myqcloud.com/zhs.model.tar.bz2 (not the "
         "publisher's, no digest published): download it yourself and pass its path"))

# -- the NLPL repository (bilm-tf's format: model.hdf5, options.json, vocab.txt[.gz]) -------

_NLPL_URLS = "http://vectors.nlpl.eu/repository/{v}/{id}.zip"
_NORELMO = ("ids, corpora", "wiki.nlpl.eu Vectors/norlm/norelmo (NorELMo)",
            f"revision of 2021-03-12 (oldid 1318), read {READ}")
_RUSVECTORES = ("ids, corpora", "the models' RusVectores names (rusvectores.org/en/models), "
                "as lists and scripts that download them by NLPL id quote them", f"read {READ}")
_NLPL_PATH = ("the URL's repository version: /20/ (the 2020 repository) is tried first and "
              "/11/ second; sources use both")


def _nlpl(number, language, data, sources, inferred=()):
    urls = tuple(_NLPL_URLS.format(v=v, id=number) for v in (20, 11))
    return Published(f"nlpl-{number}", "archive", "NLPL repository", language, data,
                     (File("archive", urls),), sources=(sources,),
                     inferred=(_NLPL_PATH,) + tuple(inferred))


MODELS += [
    _nlpl(210, "Norwegian", "NorELMo: lemmatized Norwegian Wikipedia (September 2020 "
          "dump), about 160M words (give it lemmas)", _NORELMO),
    _nlpl(211, "Norwegian", "NorELMo: tokenized Norwegian Wikipedia (September 2020 "
          "dump), about 160M words", _NORELMO),
    _nlpl(217, "Norwegian", "NorELMo30: the NorBERT corpus (Wikipedia + Norsk Aviskorpus), "
          "a 30,000-word target vocabulary", _NORELMO),
    _nlpl(218, "Norwegian", "NorELMo100: the NorBERT corpus (Wikipedia + Norsk Aviskorpus), "
          "a 100,000-word target vocabulary", _NORELMO),
    _nlpl(195, "Russian", "ruwikiruscorpora_tokens_elmo_1024_2019: the Russian National "
          "Corpus + Russian Wikipedia (December 2018), tokens", _RUSVECTORES),
    _nlpl(196, "Russian", "ruwikiruscorpora_lemmas_elmo_1024_2019: the Russian National "
          "Corpus + Russian Wikipedia (December 2018), lemmas (give it lemmas)", _RUSVECTORES),
    _nlpl(212, "Russian", "araneum_lemmas_elmo_2048_2020: Araneum Russicum (web), lemmas "
          "(give it lemmas)", _RUSVECTORES,
          inferred=("the corpus: from the model's name",)),
]

REGISTRY = {m.name: m for m in MODELS}


def list_models() -> list[dict]:
    """The published models `from_pretrained` knows (what `elmo-jax models` prints).

    Returns:
        One dict per model: name, family, language, data, params,
        supported, files (role -> URLs), checks (role -> size and digests),
        sources, inferred (what the sources do not state) and note.
    """
    return [{"name": m.name, "family": m.family, "language": m.language, "data": m.data,
             "params": m.params or None, "supported": m.kind != "unsupported",
             "files": {f.role: list(f.urls) or [p.urls[0] for p in f.parts] for f in m.files},
             "checks": {f.role: {**({"size": f.size} if f.size else {}), **f.digests}
                        for f in m.files if f.size or f.digests or f.parts},
             "sources": [" | ".join(s) for s in m.sources], "inferred": list(m.inferred),
             "note": m.note or None} for m in MODELS]
