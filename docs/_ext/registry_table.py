"""`{registry-table}`: the published models, generated from the registry
(`elmo_jax/formats/registry.py`) as `elmo-jax models` prints them."""
import contextlib
import io

from docutils import nodes
from docutils.parsers.rst import Directive


def registry_table() -> str:
    """`elmo-jax models`'s table, with an empty cache (the same anywhere)."""
    import os
    import tempfile

    from elmo_jax.cli import models

    out, before = io.StringIO(), os.environ.get("ELMO_JAX_CACHE")
    with tempfile.TemporaryDirectory() as empty:
        os.environ["ELMO_JAX_CACHE"] = empty
        try:
            with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
                models.main([], prog="elmo-jax models")
        finally:
            if before is None:
                del os.environ["ELMO_JAX_CACHE"]
            else:
                os.environ["ELMO_JAX_CACHE"] = before
    return out.getvalue().split("\n\ncache:")[0].strip("\n")


class RegistryTable(Directive):
    def run(self):
        text = registry_table()
        return [nodes.literal_block(text, text)]


def setup(app):
    app.add_directive("registry-table", RegistryTable)
    return {"parallel_read_safe": True}
