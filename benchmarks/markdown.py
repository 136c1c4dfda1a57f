"""Markdown tables for BENCHMARKS.md, from the rows a benchmark prints with rich.

>>> print_table(("a", "b"), [("1", "2")])
| a | b |
|---|---|
| 1 | 2 |
"""


def print_table(columns, rows):
    """Print a Markdown table: a header of ``columns``, then one line per row."""
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(row) + " |")


def show_rows(console, caption, rows, markdown):
    """Print ``rows`` (dicts with the same keys, the columns) as a rich table titled
    ``caption`` on ``console`` and, if ``markdown``, as a Markdown table too."""
    from rich.table import Table

    columns = list(rows[0])
    cells = [[str(value) for value in row.values()] for row in rows]
    table = Table(title=caption)
    for column in columns:
        table.add_column(column)
    for row in cells:
        table.add_row(*row)
    console.print(table)
    if markdown:
        print_table(columns, cells)
