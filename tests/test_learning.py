"""The learning guard: a young biLM trained on real text has a sane held-out
perplexity in both directions (BENCHMARKS.md, "Learning").

Real text: the Brown corpus through its recipe (npm; conftest's
`brown_corpus`). The tiny model with bilm-tf's recipe, but a vocabulary of the
20,000 most frequent words and 64 negative samples a step, so that after 300
steps most softmax rows have never been drawn: there bilm-tf's start
(`train.softmax_init=bilm-tf`, biases at 0) blows up at the seed tested
(held-out perplexity forward / backward: seed 0 576 / 3.8e11; seed 2, also
checked, 590 / 1.5e10; seed 1 572 / 570), against an add-one unigram model's
660. Both directions must beat that unigram model (computed here in float64)
and lie within 2x of each other. One seed: the suite's time is short, and
learning across seeds is bench/learn.py's job. Marked e2e (a short training
run).

The same run is the loop's check on real text: over its 300 steps the host
reads nothing from the devices except on log and save steps (every read of an
array's value is counted by step: JAX's transfer guard, which
`train.transfer_guard` sets on accelerators, lets a CPU's reads through), and
no program compiles after step 1 (the log records count them).
"""
import collections
import json
import math
import os

import pytest

from elmo_jax import training
from elmo_jax.config import load_config
from elmo_jax.data import list_shards, read_sentences, vocab_from_files

pytestmark = pytest.mark.e2e
STEPS, VOCAB, NEGATIVES, HELD_OUT_LINES = 300, 20_000, 64, 1_500


@pytest.fixture(scope="module")
def brown_lm(brown_corpus, tmp_path_factory):
    """(train glob, held-out file, vocabulary file, add-one unigram perplexity)."""
    d = tmp_path_factory.mktemp("brown_lm")
    train = brown_corpus["train_files"]
    vocab, _ = vocab_from_files(train, max_vocab=VOCAB)
    vocab.to_file(d / "vocab.txt")
    with open(brown_corpus["dev_file"], encoding="utf-8") as fh:
        lines = fh.read().split("\n")[:HELD_OUT_LINES]
    (d / "heldout.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    # each direction predicts every word and one boundary token per sentence
    known = set(vocab.words)
    counts = collections.Counter()
    for path in list_shards(train):
        for s in read_sentences(path):
            counts.update([w if w in known else "<UNK>" for w in s] + ["</S>"])
    total = sum(counts.values()) + len(vocab)
    nll, n = 0.0, 0
    for s in read_sentences(str(d / "heldout.txt")):
        for w in [w if w in known else "<UNK>" for w in s] + ["</S>"]:
            nll -= math.log((counts[w] + 1) / total)
            n += 1
    return train, str(d / "heldout.txt"), str(d / "vocab.txt"), math.exp(nll / n)


def _count_reads_by_step(monkeypatch) -> collections.Counter:
    """Device-to-host reads of array values, counted by the training step the
    loop was at (the step `pod.Decisions.poll` last saw; 0 before step 1)."""
    from jax._src import array

    from elmo_jax.training import pod

    reads, at = collections.Counter(), {"step": 0}
    value = array.ArrayImpl._value

    def counted(self):
        reads[at["step"]] += 1
        return value.fget(self)

    poll = pod.Decisions.poll

    def tracked(self, step, *args):
        at["step"] = step
        return poll(self, step, *args)

    monkeypatch.setattr(array.ArrayImpl, "_value", property(counted))
    monkeypatch.setattr(pod.Decisions, "poll", tracked)
    return reads


@pytest.mark.parametrize("seed", [0])
def test_a_young_bilm_beats_unigram_in_both_directions(brown_lm, tmp_path, seed, monkeypatch):
    train, heldout, vocab, unigram = brown_lm
    reads = _count_reads_by_step(monkeypatch)
    config = load_config("tiny", [
        f"train.seed={seed}", f"train.max_steps={STEPS}", "train.checkpoint_every=150",
        "train.log_every=100", "train.eval_batch_size=64",
        f"model.n_negative_samples_batch={NEGATIVES}", f"data.train_files={train}",
        f"data.vocab_file={vocab}", f"data.eval_files={heldout}"])
    last = training.train_and_evaluate(config, str(tmp_path), progress=False)
    forward, backward = last["eval_ppl_forward"], last["eval_ppl_backward"]
    assert max(forward, backward) < unigram, (forward, backward, unigram)
    assert max(forward, backward) < 2 * min(forward, backward), (forward, backward)
    with open(os.path.join(tmp_path, "metrics.jsonl")) as fh:
        records = [json.loads(line) for line in fh]
    assert [r["step"] for r in records] == [100, 200, 300, 300]  # 3 logs, the evaluation
    assert all(r["compiled_since_step_1"] == 0 for r in records), records
    assert set(reads) <= {0, 100, 150, 200, 300} and reads[150] > 0, reads  # logs, saves
