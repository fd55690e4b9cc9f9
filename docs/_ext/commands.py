"""`{command-help} NAME`: the `--help` of an elmo-jax command, taken from its
argparse parser at build time (so the reference is the code's)."""
import contextlib
import io

from docutils import nodes
from docutils.parsers.rst import Directive


def help_text(name: str) -> str:
    """`elmo-jax NAME --help`, without running the command."""
    from elmo_jax.cli import embed, models, train

    if name == "embed":
        module, argv, prog = embed, ["--help"], "elmo-jax embed"
    elif name == "models":
        module, argv, prog = models, ["--help"], "elmo-jax models"
    elif name == "train":
        module, argv, prog = train, ["--help"], "elmo-jax train"
    else:  # train.py's subcommands: export, eval, vocab, score, plan, prepare
        module, argv, prog = train, [name, "--help"], "elmo-jax"
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        module.main(argv, prog=prog)
    return out.getvalue()


class CommandHelp(Directive):
    required_arguments = 1

    def run(self):
        text = help_text(self.arguments[0])
        return [nodes.literal_block(text, text)]


def setup(app):
    app.add_directive("command-help", CommandHelp)
    return {"parallel_read_safe": True}
