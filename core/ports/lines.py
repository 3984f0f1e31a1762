"""Which of a job's finished rows its results give: whole lines only, every store alike.

A line of several choices is one row a choice; its output line is written
only once every choice has ended, with the done ones (a failed or cancelled
choice fails the whole line, which then goes to the errors).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from fsched.core.ports.records import RequestResult


def finished_lines(rows: Iterable[RequestResult], errors: bool) -> Iterator[RequestResult]:
    """From a job's rows in input order (the requested state's, and every finished row of a line of
    several choices), the rows of the lines that ended as asked: done, or with `errors` otherwise."""
    line: list[RequestResult] = []
    for result in rows:
        if result.choice == 0 and line:
            yield from _if_line_is(line, errors)
            line = []
        line.append(result)
    yield from _if_line_is(line, errors)


def _if_line_is(line: list[RequestResult], errors: bool) -> list[RequestResult]:
    """A line's rows when the line ended as asked: every choice there and done (or, with `errors`,
    every choice ended and one did not finish done)."""
    if not line:
        return []
    answer = line[0].answer
    if len(line) != answer.n * answer.prompts:
        return []  # a choice has not ended yet
    done = all(r.status.succeeded for r in line)
    return line if done != errors else []
