"""Sphinx configuration of the elmo-jax site (`make docs`: offline, warnings
are errors). Pages are Markdown (MyST); the API reference is generated from
the docstrings (autodoc, Google style through napoleon); the commands'
reference from their argparse parsers (`_ext/commands.py`); the quick-start
notebook (`notebooks/`, linked as docs/notebooks) is executed by every build
(myst-nb), and a cell that fails fails the build."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the checkout's elmo_jax
sys.path.insert(0, os.path.join(HERE, "_ext"))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

project = "elmo-jax"
author = "the elmo-jax authors"
copyright = "2026, the elmo-jax authors"
extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "commands",
              "registry_table"]
exclude_patterns = ["_build", "notebooks/.ipynb_checkpoints"]
nb_execution_mode = "force"  # run at every build: the page cannot drift from the code
nb_execution_timeout = 600
nb_execution_show_tb = True  # a failing cell: a warning with its traceback, an error under -W
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]
autodoc_member_order = "bysource"
autodoc_typehints = "signature"  # types and defaults in the signatures (the config's fields)
napoleon_google_docstring = True
napoleon_numpy_docstring = False
html_theme = "alabaster"
html_title = "elmo-jax"
html_theme_options = {"description": "ELMo in JAX/Flax", "fixed_sidebar": True}


def setup(app):
    from pygments.lexers.shell import BashLexer
    from sphinx.highlighting import lexers

    lexers["gcs"] = BashLexer()  # the pod commands the tests run against the GCS emulator
