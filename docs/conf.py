"""Sphinx configuration of the elmo-jax site (`make docs`: offline, warnings
are errors). Pages are Markdown (MyST); the API reference is generated from
the docstrings (autodoc, Google style through napoleon); the commands'
reference from their argparse parsers (`_ext/commands.py`); the quick-start
notebook (`notebooks/`, linked as docs/notebooks) is executed by every build
(myst-nb), and a cell that fails fails the build."""
import atexit
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the checkout's elmo_jax
sys.path.insert(0, os.path.join(HERE, "_ext"))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# the notebook's kernel gets an IPython profile of its own: the reader's
# startup files and history stay out of the build, and the kernel's log keeps
# to errors (its note on a kernel over local TCP is not the site's concern)
_IPYTHON = tempfile.mkdtemp(prefix="elmo-jax-docs-ipython-")
atexit.register(shutil.rmtree, _IPYTHON, True)
os.makedirs(os.path.join(_IPYTHON, "profile_default"))
with open(os.path.join(_IPYTHON, "profile_default", "ipython_kernel_config.py"), "w") as fh:
    fh.write('c.IPKernelApp.log_level = "ERROR"\n')
os.environ["IPYTHONDIR"] = _IPYTHON

project = "elmo-jax"
author = "the elmo-jax authors"
copyright = "2026, the elmo-jax authors"
extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "commands",
              "registry_table", "layout", "environment_table"]
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
