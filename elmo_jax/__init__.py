"""elmo-jax: ELMo (Peters et al. 2018) in JAX/Flax.

    import elmo_jax
    elmo = elmo_jax.Elmo.from_pretrained("original")   # or a URL, a path; `elmo-jax models`
    vectors = elmo.embed_sentences([["Hello", "world", "."]])   # [3, 3, 1024] each
    elmo_jax.tokenize("你什么时候方便", lang="zh")               # jieba: the elmo-jax[zh] extra

or, inside your own jitted code:

    out = elmo_jax.embed(params, elmo_jax.batch_to_char_ids(sentences), options)

or as a Flax module (linen; `NnxElmoEmbedder` for NNX):

    elmo = elmo_jax.ElmoEmbedder.from_pretrained("runs/x/export")   # mixes are its params

Any stored model (a training workdir, an export folder, a weights file):

    model = elmo_jax.open_model("runs/x")   # options, params, vocab, softmax

A corpus embedded once (`elmo-jax embed --input 'corpus/*.txt' --output DIR`):

    store = elmo_jax.open_embeddings("DIR")   # store[i]: line i's [3, n_i, 1024]
"""
import importlib

# The public API, imported when first used (PEP 562), so that `import elmo_jax`
# costs nothing and a command can set the process up (huge_pages.py) before
# JAX, Flax and orbax load.
_API = {
    "ElmoOptions": "core.options", "OptionsError": "core.options", "batch_to_char_ids": "core.chars",
    "load_weights": "formats.weights", "save_weights": "formats.weights", "WeightsError": "formats.weights",
    "embed": "core.embedding", "embed_token_vectors": "core.embedding", "encode_tokens": "core.embedding",
    "EmbedOutput": "core.embedding", "init_mix": "core.embedding", "scalar_mix": "core.embedding",
    "init_state": "core.bilm", "init_params": "core.bilm", "LSTMState": "core.bilm", "Elmo": "api.elmo",
    "load_export": "formats.export", "save_export": "formats.export", "ElmoEmbedder": "api.flax_modules",
    "NnxElmoEmbedder": "api.flax_modules", "ElmoOutput": "api.flax_modules", "BiLMWeights": "api.flax_modules",
    "score_sentences": "api.scoring", "open_model": "formats.stored_model",
    "tokenize": "data.segmentation", "Lexicon": "core.lexicon", "list_models": "formats.registry",
    "open_embeddings": "corpus.store", "embed_corpus": "corpus", "CorpusSettings": "corpus",
    "export_model": "formats.serving", "ArgumentError": "core.embedding",
}
__all__ = list(_API)
__version__ = "0.1.0"


def __getattr__(name):
    if name in _API:
        return getattr(importlib.import_module(f"elmo_jax.{_API[name]}"), name)
    try:  # a submodule: elmo_jax.core.vocab, elmo_jax.training, ...
        return importlib.import_module(f"elmo_jax.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"elmo_jax.{name}":  # the submodule exists but needs something missing
            raise
        raise AttributeError(f"module 'elmo_jax' has no attribute {name!r}") from None


def __dir__():
    return sorted(__all__ + ["__version__"])
