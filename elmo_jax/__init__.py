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
    "ElmoOptions": "options", "OptionsError": "options", "batch_to_char_ids": "chars",
    "load_weights": "weights", "save_weights": "weights", "WeightsError": "weights",
    "embed": "embedding", "embed_token_vectors": "embedding", "encode_tokens": "embedding",
    "EmbedOutput": "embedding", "init_mix": "embedding", "scalar_mix": "embedding",
    "init_state": "model", "init_params": "model", "LSTMState": "model", "Elmo": "elmo",
    "load_export": "export", "save_export": "export", "ElmoEmbedder": "modules",
    "NnxElmoEmbedder": "modules", "score_sentences": "scoring", "open_model": "stored",
    "tokenize": "segmentation", "Lexicon": "lexicon", "list_models": "registry",
    "open_embeddings": "store", "embed_corpus": "corpus", "CorpusSettings": "corpus",
}
__all__ = list(_API)
__version__ = "0.1.0"


def __getattr__(name):
    if name in _API:
        return getattr(importlib.import_module(f"elmo_jax.{_API[name]}"), name)
    try:  # a submodule: elmo_jax.vocab, elmo_jax.training, ...
        return importlib.import_module(f"elmo_jax.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"elmo_jax.{name}":  # the submodule exists but needs something missing
            raise
        raise AttributeError(f"module 'elmo_jax' has no attribute {name!r}") from None


def __dir__():
    return sorted(__all__ + ["__version__"])
