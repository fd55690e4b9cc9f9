"""bilm-tf's side of `bench/learn.py`: its own `train()` and `test()`, run
under the bilm-tf peer's venv (TensorFlow, `bilm` 0.1.post5, the peer's
`tf1_shim`); nothing of bilm-tf is changed.

    PEER_PYTHON bench/learn_bilm_tf.py --options OPTIONS.json --train TRAIN --heldout HELD \
        --vocab VOCAB --seed 0 --steps 300 1000 3000 --workdir DIR

`train()` runs for the largest horizon (n_epochs 1 over horizon x tokens per
batch: it saves its own checkpoint and ends there); a `tf.Session` subclass
saves a checkpoint of all of train()'s variables after the training call of each
smaller horizon. `test()` then scores each checkpoint (its protocol: 256
streams, one token a step, the state carried, the full softmax); the session
also fetches the LanguageModel's per-direction losses of the same batches, so
each direction's perplexity is reported beside test()'s own number. Prints one
JSON line.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--options", required=True, help="bilm-tf options.json (model and recipe)")
    ap.add_argument("--train", required=True)
    ap.add_argument("--heldout", required=True)
    ap.add_argument("--vocab", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, nargs="+", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--peer_dir", required=True, help="shared/peers/bilm_tf (for tf1_shim)")
    args = ap.parse_args()

    sys.path.insert(0, args.peer_dir)  # the peer's shim, before bilm imports TensorFlow
    import numpy as np
    import tf1_shim

    tf = tf1_shim.tf
    import bilm.training as bilm_training
    from bilm.data import BidirectionalLMDataset

    horizons = sorted(set(args.steps))
    with open(args.options) as fh:
        options = json.load(fh)
    max_chars = options["char_cnn"]["max_characters_per_token"]
    vocab = bilm_training.load_vocab(args.vocab, max_chars)
    tokens_per_batch = options["batch_size"] * options["unroll_steps"]
    options.update(n_tokens_vocab=vocab.size, n_epochs=1,
                   n_train_tokens=horizons[-1] * tokens_per_batch)
    os.makedirs(args.workdir, exist_ok=True)

    savers, calls, ckpts = [], [0], {}
    base_session = tf.Session

    class HorizonSession(base_session):
        """Counts train()'s training calls ([train_op, summary_op, perplexity, ...]) and
        saves after each horizon's; in test() adds the per-direction losses."""
        model = None      # the LanguageModel test() built
        direction_losses: list = []

        def run(self, fetches, feed_dict=None, **kw):
            m = HorizonSession.model
            if m is not None and isinstance(fetches, list) and fetches and fetches[0] is m.total_loss:
                ret, per_dir = super().run([fetches, m.individual_losses], feed_dict, **kw)
                HorizonSession.direction_losses.append(per_dir)
                return ret
            ret = super().run(fetches, feed_dict, **kw)
            if (isinstance(fetches, list) and len(fetches) >= 3
                    and isinstance(fetches[0], tf.Operation) and m is None):
                calls[0] += 1
                if calls[0] in horizons:
                    if not savers:  # train()'s own Saver keeps only its last 2
                        savers.append(tf.train.Saver(tf.global_variables(), max_to_keep=None))
                    path = os.path.join(args.workdir, f"horizon-{calls[0]}")
                    ckpts[calls[0]] = savers[0].save(self, path)
            return ret

    class RecordedLM(bilm_training.LanguageModel):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            HorizonSession.model = self

    tf.Session = HorizonSession

    class TrainData:  # train() reads batches forever; it stops itself at n_batches_total
        def __init__(self):
            self.inner = BidirectionalLMDataset(args.train, vocab, test=False,
                                                shuffle_on_load=True)

        def iter_batches(self, batch_size, num_steps):
            return self.inner.iter_batches(batch_size, num_steps)

    class HeldOut:  # bilm's test data ends in a RuntimeError under Python >= 3.7 (PEP 479)
        def iter_batches(self, batch_size, num_steps):
            inner = BidirectionalLMDataset(args.heldout, vocab, test=True,
                                           shuffle_on_load=False)
            gen = inner.iter_batches(batch_size, num_steps)
            while True:
                try:
                    yield next(gen)
                except (StopIteration, RuntimeError):
                    return

    random.seed(args.seed)
    np.random.seed(args.seed)
    tf.reset_default_graph()
    tf.set_random_seed(args.seed)
    t0 = time.time()
    with contextlib.redirect_stdout(sys.stderr):
        bilm_training.train(options, TrainData(), 1, args.workdir, args.workdir)
    train_s = time.time() - t0
    if sorted(ckpts) != horizons:
        raise SystemExit(f"saved horizons {sorted(ckpts)}, expected {horizons}")

    results = []
    bilm_training.LanguageModel = RecordedLM
    for step in horizons:
        HorizonSession.direction_losses = []
        tf.reset_default_graph()
        with contextlib.redirect_stdout(sys.stderr):
            ppl = float(bilm_training.test(options, ckpts[step], HeldOut(), batch_size=256))
        HorizonSession.model = None
        per_dir = np.mean(np.asarray(HorizonSession.direction_losses, np.float64), axis=0)
        results.append({"step": step, "ppl": ppl, "ppl_forward": float(np.exp(per_dir[0])),
                        "ppl_backward": float(np.exp(per_dir[1])),
                        "batches": len(HorizonSession.direction_losses)})
        print(f"[bilm-tf] seed {args.seed} step {step}: {results[-1]}", file=sys.stderr,
              flush=True)
    print(json.dumps({"system": "bilm-tf", "seed": args.seed, "results": results,
                      "train_s": round(train_s, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
