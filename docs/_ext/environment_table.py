"""`{environment-table}`: the environment variables elmo-jax reads, from
`elmo_jax.environment.VARIABLES` (the one module that reads them)."""
from docutils import nodes
from docutils.parsers.rst import Directive


class EnvironmentTable(Directive):
    def run(self):
        from elmo_jax.environment import VARIABLES

        table = nodes.table()
        group = nodes.tgroup(cols=3)
        table += group
        for width in (3, 2, 6):
            group += nodes.colspec(colwidth=width)
        head, body = nodes.thead(), nodes.tbody()
        group += head
        group += body
        for cells, where in ((("variable", "default", "what it does"), head),
                             *(((name, default, meaning), body)
                               for name, (default, meaning) in VARIABLES.items())):
            row = nodes.row()
            for cell in cells:
                entry = nodes.entry()
                entry += nodes.paragraph(text=cell.replace("`", ""))
                row += entry
            where += row
        return [table]


def setup(app):
    app.add_directive("environment-table", EnvironmentTable)
    return {"parallel_read_safe": True}
