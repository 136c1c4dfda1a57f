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
