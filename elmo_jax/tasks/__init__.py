"""Downstream tasks that show what the representations are worth:

    pos   a part-of-speech tagger on Brown (universal tags) over ELMo's scalar mix,
          single layers, or random word embeddings (python -m elmo_jax.tasks.pos)
    wsd   a 1-nearest-neighbour word-sense probe over WordNet usage examples,
          per layer (python -m elmo_jax.tasks.wsd)
"""
