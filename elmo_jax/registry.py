"""The published ELMo models, by name (data only; `hub.py` fetches them).

AllenNLP's models are an options/weights pair (the URLs as AllenNLP published
them; the original model's vocabulary and softmax too, from bilm-tf's README).
ELMoForManyLangs' are archives of a model folder (`manylangs.py`): the 44 of
the NLPL repository, as its README links them, and the Simplified Chinese one.
`size` is the byte count of the weights or the archive, `sha256` its digest,
where published (neither is, for any of these: sizes are then checked against
the server's Content-Length, and a digest is recorded at download).
"""
from __future__ import annotations

import dataclasses

_S3 = "https://s3-us-west-2.amazonaws.com/allennlp/models/elmo"
_NLPL = "http://vectors.nlpl.eu/repository/11"


@dataclasses.dataclass(frozen=True)
class Published:
    name: str
    kind: str              # "allennlp" (options + weights) or "manylangs" (an archive)
    language: str
    data: str              # what it was trained on
    files: tuple           # ((role, url), ...): options, weights, vocab, softmax | archive
    params: str = ""       # parameters, as published
    size: int | None = None
    sha256: str | None = None

    def url(self, role: str) -> str | None:
        return dict(self.files).get(role)


def _allennlp(name, stem, folder, language, data, params, extra=()):
    files = (("options", f"{_S3}/{folder}/{stem}_options.json"),
             ("weights", f"{_S3}/{folder}/{stem}_weights.hdf5")) + tuple(extra)
    return Published(name, "allennlp", language, data, files, params)


_ORIGINAL = "elmo_2x4096_512_2048cnn_2xhighway"
_BENCHMARK = "1B Word Benchmark (800M tokens)"
MODELS = [
    _allennlp("small", "elmo_2x1024_128_2048cnn_1xhighway", "2x1024_128_2048cnn_1xhighway",
              "English", _BENCHMARK, "13.6M"),
    _allennlp("medium", "elmo_2x2048_256_2048cnn_1xhighway", "2x2048_256_2048cnn_1xhighway",
              "English", _BENCHMARK, "28.0M"),
    _allennlp("original", _ORIGINAL, "2x4096_512_2048cnn_2xhighway", "English", _BENCHMARK,
              "93.6M", extra=(("vocab", f"{_S3}/vocab-2016-09-10.txt"),
                              ("softmax", f"{_S3}/2x4096_512_2048cnn_2xhighway/"
                                          f"{_ORIGINAL}_softmax_weights.hdf5"))),
    _allennlp("original-5.5b", f"{_ORIGINAL}_5.5B", "2x4096_512_2048cnn_2xhighway_5.5B",
              "English", "Wikipedia (1.9B) + WMT 2008-2012 news crawl (3.6B tokens)", "93.6M"),
    Published("pubmed", "allennlp", "English (biomedical)", "PubMed abstracts",
              (("options", f"{_S3}/contributed/pubmed/{_ORIGINAL}_options.json"),
               ("weights", f"{_S3}/contributed/pubmed/{_ORIGINAL}_weights_PubMed_only.hdf5")),
              "93.6M"),
    Published("pt-wikipedia", "allennlp", "Portuguese", "Portuguese Wikipedia",
              (("options", f"{_S3}/contributed/pt/elmo_pt_options.json"),
               ("weights", f"{_S3}/contributed/pt/elmo_pt_weights.hdf5"))),
    Published("pt-brwac", "allennlp", "Portuguese", "brWaC (Brazilian web corpus)",
              (("options", f"{_S3}/contributed/pt/brwac/options.json"),
               ("weights", f"{_S3}/contributed/pt/brwac/elmo_pt_weights_dgx1.hdf5"))),
]

# ELMoForManyLangs: ISO 639-1 code (grc: ISO 639-3, Ancient Greek has none), language,
# NLPL repository id. Each was trained on 20M words of the CoNLL 2018 shared task's raw
# text (Wikipedia + Common Crawl); the architecture is the original's plus a 100-d word
# embedding (93.6M + the word table's parameters).
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
_CONLL = "CoNLL 2018 raw text, 20M words (Wikipedia + Common Crawl)"
MODELS += [Published(f"manylangs-{code}", "manylangs", language, _CONLL,
                     (("archive", f"{_NLPL}/{number}.zip"),))
           for code, language, number in _MANYLANGS]
MODELS.append(Published("manylangs-zhs", "manylangs", "Chinese (Simplified)",
                        "Xinhua portion of Chinese Gigaword v5",
                        (("archive", "http://pbmpb9h15.bkt.gdipper.com/zhs.model.tar.xz"),)))

REGISTRY = {m.name: m for m in MODELS}


def list_models() -> list[dict]:
    """The registry as rows (what `elmo-jax models` prints)."""
    return [{"name": m.name, "language": m.language, "data": m.data,
             "params": m.params or None, "size": m.size,
             "files": dict(m.files)} for m in MODELS]
