"""A progress bar on stderr for long work: transient (gone when the work ends), and nothing at all when
stderr is no terminal, so scripts and `--json` readers see only their output."""

from __future__ import annotations


class StderrProgress:
    """One bar a task: `add(description, total)` gives the task, `update(task, completed, line)` moves it."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(stderr=True)
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[line]}"),
                            TimeElapsedColumn(), console=console, transient=True,
                            disable=not console.is_terminal)

    def __enter__(self) -> StderrProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.stop()

    def add(self, description: str, total: int):
        return self.bar.add_task(description, total=total, line="")

    def update(self, task, completed: int, line: str) -> None:
        self.bar.update(task, completed=completed, line=line)
