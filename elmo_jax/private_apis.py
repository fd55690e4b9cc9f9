"""The one module that touches private APIs of jax and orbax, each for the
version it was written for (`JAX_WRITTEN_FOR`, `ORBAX_WRITTEN_FOR`); with
another version it changes nothing and says so, and `tests/test_package.py`
fails until this module is checked against it. The first two change the
process: the commands call them (`cli/process.py`, `cli/train.py`), the
library never does.

`one_cache_key_for_every_process`: JAX writes persistent-cache entries from
process 0 only, for every process to read; but on the CPU its key hashes a
topology fingerprint that differs from process to process, so every other
process missed and compiled every program on every start. There the key
hashes the devices instead (their kinds, ids and processes: the same on every
process); TPU and GPU keys are left as they are (their fingerprints are the
slice's).

`bound_storage_retries`: TensorStore retries a bucket request in orbax's saves
32 times, up to 32 s apart (a quarter of an hour blocked in a save while GCS
is down); orbax has no argument for it, so its module's default contexts are
set.

`first_replica_checkpoint_handler`: orbax's replica-parallel save has each
replica write a slice of an array, cut by slicing programs it compiles at the
first save: in a run of several processes, programs compiled mid-run (18 in
the tiny model). orbax's standard handler takes no registry of type handlers,
so this one is given its own, where every array is written by its first
replica (as in a single process); orbax's process-wide registry is left as
it is. Unlike the two above it changes nothing of the process: the library
uses it (`checkpoints.manager`)."""
from __future__ import annotations

import logging

JAX_WRITTEN_FOR = "0.10."  # jax._src.cache_key._hash_accelerator_config
ORBAX_WRITTEN_FOR = "0.12."  # orbax's tensorstore_utils._BASE_TS_CONTEXT and OCDBT's


def written_for_this_jax() -> bool:
    import jax

    return jax.__version__.startswith(JAX_WRITTEN_FOR)


def one_cache_key_for_every_process() -> bool:
    """Give CPU devices a persistent-cache key that every process computes
    alike; True once done (now or before), False with another jax."""
    if not written_for_this_jax():
        import jax

        logging.getLogger(__name__).warning(
            "jax %s is not the %s that elmo_jax/private_apis.py was written for: processes "
            "of a multi-process CPU run each compile their own programs", jax.__version__,
            JAX_WRITTEN_FOR)
        return False
    from jax._src import cache_key

    original = cache_key._hash_accelerator_config
    if getattr(original, "elmo_jax", False):
        return True

    def accelerator_config(hash_obj, accelerators):
        devices = list(accelerators.flat)
        if not devices or devices[0].platform != "cpu":
            return original(hash_obj, accelerators)
        for d in devices:
            hash_obj.update(f"{d.device_kind}:{d.id}:{d.process_index};".encode())

    accelerator_config.elmo_jax = True
    cache_key._hash_accelerator_config = accelerator_config
    return True


def bound_storage_retries(seconds: float) -> bool:
    """Bound how long TensorStore retries a bucket request in orbax's saves
    and restores, to about `seconds` (its default is 32 tries with up to 32 s
    between them: a quarter of an hour blocked in a save while GCS is down).
    False (and nothing changed) with another orbax."""
    import orbax.checkpoint as ocp

    if not ocp.__version__.startswith(ORBAX_WRITTEN_FOR):
        logging.getLogger(__name__).warning(
            "orbax %s is not the %s that elmo_jax/private_apis.py was written for: a save "
            "to a bucket that is down waits out TensorStore's own retries", ocp.__version__,
            ORBAX_WRITTEN_FOR)
        return False
    from orbax.checkpoint._src.serialization import tensorstore_utils as ts_utils

    delays, delay = [], 1.0
    while sum(delays) < seconds and len(delays) < 32:
        delays.append(delay)
        delay = min(delay * 2, 8.0)
    retries = {"max_retries": max(1, len(delays)), "initial_delay": "1s", "max_delay": "8s"}
    for context in (ts_utils._BASE_TS_CONTEXT, ts_utils._DEFAULT_OCDBT_TS_CONTEXT):
        context["gcs_request_retries"] = dict(retries)
    return True


def first_replica_checkpoint_handler():
    """An orbax StandardCheckpointHandler whose arrays are each written by
    their first replica (orbax's default registry otherwise)."""
    import jax
    import orbax.checkpoint as ocp
    from orbax.checkpoint._src.handlers import pytree_checkpoint_handler
    from orbax.checkpoint._src.metadata import array_metadata_store
    from orbax.checkpoint._src.serialization import type_handler_registry as registry

    handlers = [(kind, ocp.type_handlers.ArrayHandler(
                    use_replica_parallel=False, array_metadata_store=array_metadata_store.Store())
                 if kind is jax.Array else handler)
                for kind, handler in registry._DEFAULT_TYPE_HANDLERS]
    handler = ocp.StandardCheckpointHandler()
    handler._impl = pytree_checkpoint_handler.PyTreeCheckpointHandler(
        type_handler_registry=registry.create_type_handler_registry(*handlers))
    return handler
