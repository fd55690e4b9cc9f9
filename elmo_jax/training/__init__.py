"""Pretraining the biLM as bilm-tf does, data-parallel over a device mesh.

    steps.py         TrainState, the loss, `train_step`, `eval_step` (pure)
    partitioning.py  the Mesh, shardings, global batch, `create_train_step`
    workdir.py       saving and resuming checkpoints, the run's config, export, fine-tune loading
    loop.py          `train_and_evaluate(config, workdir)`: set-up, resume, the step loop
    feeding.py       batches placed on the devices ahead of the loop, by a thread
    stopping.py      the stop policy: signals, the time limit, timed saves (agreed by all)
    reporting.py     the metrics window, the progress bar, the profile window, compile counts
    evaluation.py    held-out perplexity: `evaluate`, `evaluate_workdir`
    pod.py           several processes: failures that stop all, agreed decisions
    plan.py          the train step compiled ahead of time for a mesh: bytes, FLOPs, epoch time,
                     collectives
    targets.py       named TPU slices and GPU hosts, and their compile-only devices
"""
from elmo_jax.training.evaluation import evaluate, evaluate_workdir
from elmo_jax.training.loop import train_and_evaluate
from elmo_jax.training.partitioning import (create_train_step, global_batch, make_mesh,
                                            train_mesh)
from elmo_jax.training.steps import TrainState, eval_step, init_train_state, train_step
from elmo_jax.training.workdir import TrainingError, export, load_pretrained

__all__ = ["train_and_evaluate", "evaluate", "evaluate_workdir", "create_train_step",
           "global_batch", "make_mesh", "train_mesh", "TrainState", "train_step", "eval_step",
           "init_train_state", "TrainingError", "export", "load_pretrained"]
