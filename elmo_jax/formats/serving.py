"""One function from any model to an artifact other stacks load
(`train.py export --model M --format F --out DIR`):

    bilm-tf     options.json + weights.hdf5 (+ vocab, softmax, lexicon): bilm-tf's
                and AllenNLP's format (`export.py`)
    savedmodel  a TF2 SavedModel with TF-Hub ELMo's signatures (`saved_model.py`)
    jax         a `jax.export` program and its weights (`jax_export.py`)

The folder is written whole: it must not exist or be empty, and an interrupted
export leaves nothing that loads (docs/formats/serving.md).
"""
from __future__ import annotations

import os

from elmo_jax.errors import UserError
from elmo_jax.storage import copies

FORMATS = ("bilm-tf", "savedmodel", "jax")
# per format, the file a reader opens first: written (uploaded) last
# (export.OPTIONS_FILE, saved_model.SAVED_MODEL_FILE, jax_export.PROGRAM_FILE;
# named here so that the command's --help imports no JAX)
OPENED_FIRST = {"bilm-tf": ("options.json",), "savedmodel": ("saved_model.pb",),
                "jax": ("embed.jaxexport",)}


class ExportError(UserError, ValueError):
    """An export that cannot be made: an unknown format, a flag of another format."""


def export_model(model: str | os.PathLike, out: str | os.PathLike, format: str = "bilm-tf",
                 *, trainable_bilm: bool = False, options: str | os.PathLike | None = None,
                 step: int | None = None) -> dict:
    """Write `model` as an artifact in `format` into the new folder `out`.

    Args:
        model: whatever `open_model` opens: a published name, an export
            folder, a weights file, a training workdir, an ELMoForManyLangs
            folder, local or in a bucket.
        out: a folder that does not exist or is empty (local or in a bucket).
        format: "bilm-tf" (with the vocabulary and softmax where the model
            has them), "savedmodel" or "jax".
        trainable_bilm: a SavedModel whose biLM weights train too.
        options: the options.json of a weights file.
        step: a workdir's checkpoint (default: the newest).

    Returns:
        {"format", "out_dir", "step" (a workdir's checkpoint, else None)}.

    Raises:
        ExportError: an unknown format, `trainable_bilm` outside a SavedModel.
        FolderNotEmpty: `out` holds something.
    """
    if format not in FORMATS:
        raise ExportError(f"unknown export format {format!r}: one of {', '.join(FORMATS)}")
    if trainable_bilm and format != "savedmodel":
        raise ExportError("trainable_bilm is a SavedModel's (format 'savedmodel')")
    from elmo_jax.formats import export as export_lib
    from elmo_jax.formats.jax_export import write_jax_export
    from elmo_jax.formats.saved_model import write_saved_model
    from elmo_jax.formats.stored_model import open_model

    out = os.fspath(out)
    with copies.new_folder(out, last=OPENED_FIRST[format]) as folder:  # refused before reading
        m = open_model(model, options=options, step=step)
        if format == "bilm-tf":
            export_lib.save_export(folder, m.params, m.options, m.vocab, softmax=m.softmax,
                                   lexicon=m.lexicon)
        elif format == "savedmodel":
            write_saved_model(folder, m.params, m.options, m.lexicon,
                              trainable_bilm=trainable_bilm)
        else:
            write_jax_export(folder, m.params, m.options)
    return {"format": format, "out_dir": out, "step": m.step}
