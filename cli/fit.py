"""Tables that fit the terminal: abbreviate headers, shorten what may be shortened, then drop the least
needed columns, and say so in a legend. `wide` keeps everything. Pure: the width comes in."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Group
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text


@dataclass(slots=True, frozen=True)
class Col:
    header: str
    short: str | None = None  # the header when room is short (the legend spells it out)
    drop: int = 0  # 0: always shown; the highest numbers go first when the table does not fit
    justify: str = "left"
    shrink_to: int | None = None  # a column whose values may be cut (with an ellipsis) down to this


@dataclass(slots=True, frozen=True)
class Fitted:
    table: Table
    legend: Text | None


def cell_width(cell) -> int:
    if isinstance(cell, ProgressBar):
        return cell.width or 10
    if isinstance(cell, Text):
        return cell.cell_len
    return len(str(cell))


def table_width(widths: list[int]) -> int:
    """What rich's default box takes for these column widths: a border, and padding either side."""
    return sum(widths) + 3 * len(widths) + 1


def fit(cols: list[Col], rows: list[list], width: int,
        wide: bool = False) -> tuple[list[int], dict[int, str], dict[int, int]]:
    """(the columns kept, the short headers used, the widths of cut columns) for `width`."""
    content = [max([cell_width(r[i]) for r in rows], default=0) for i in range(len(cols))]
    kept, shorts, cut = list(range(len(cols))), {}, {}

    def widths() -> list[int]:
        return [max(cut.get(i, content[i]), len(shorts.get(i, cols[i].header))) for i in kept]

    if wide:
        return kept, shorts, cut
    for i, c in enumerate(cols):
        if table_width(widths()) <= width:
            break
        if c.short and len(c.short) < len(c.header) and content[i] < len(c.header):
            shorts[i] = c.short
    for i, c in enumerate(cols):
        if table_width(widths()) > width and c.shrink_to is not None and content[i] > c.shrink_to:
            excess = table_width(widths()) - width
            cut[i] = max(c.shrink_to, content[i] - excess)
    for i in sorted((i for i, c in enumerate(cols) if c.drop), key=lambda i: -cols[i].drop):
        if table_width(widths()) <= width:
            break
        kept.remove(i)
    for i in list(cut):  # room a dropped column left goes back to the values that were cut
        room = width - table_width(widths())
        cut[i] = min(content[i], cut[i] + max(0, room))
        if cut[i] >= content[i]:
            del cut[i]
    return kept, shorts, cut


def fitted_table(title: str, cols: list[Col], rows: list[list], width: int, wide: bool = False,
                 empty: str | None = None) -> Fitted:
    """A table of `rows` that fits `width` columns of terminal, and the legend of what changed."""
    kept, shorts, cut = fit(cols, rows, width, wide)
    table = Table(title=title, title_justify="left")
    for i in kept:
        c = cols[i]
        table.add_column(shorts.get(i, c.header), justify=c.justify, no_wrap=True,
                         overflow="ellipsis" if i in cut else "fold", max_width=cut.get(i))
    for r in rows:
        table.add_row(*[r[i] for i in kept])
    if not rows and empty:
        at = min(1, len(kept) - 1)  # the second column: the first is usually a narrow id
        table.add_row(*[Text(empty, style="dim") if n == at else "" for n in range(len(kept))])
    notes = [f"{shorts[i]} = {cols[i].header}" for i in sorted(shorts) if i in kept]
    hidden = [cols[i].header for i in range(len(cols)) if i not in kept]
    if hidden:
        notes.append(f"not shown at this width: {', '.join(hidden)} (--wide shows all)")
    return Fitted(table, Text("  " + "; ".join(notes), style="dim") if notes else None)


def with_legend(fitted: Fitted, *lines: Text) -> Group:
    parts = [fitted.table, *(x for x in (fitted.legend, *lines) if x is not None)]
    return Group(*parts)
