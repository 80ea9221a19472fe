"""Live progress of a sweep: a rich bar with a count by status (terminal) or one line per cell (logs)."""

from __future__ import annotations

from collections import Counter
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gradsweep.results import CellResult

_STYLE = {"green": "green", "red_verdict": "red", "red_no_backward": "red", "error": "bold red",
          "blocked_hardware": "dim", "blocked_c2": "magenta", "skipped": "dim"}


class SweepProgress:
    def __init__(self, console: Console, total: int, done: list[CellResult], bar: bool):
        self.console = console
        self.total = total
        self.counts: Counter[str] = Counter(r.status.value for r in done)
        self.finished = len(done)
        self.progress: Progress | None = None
        if bar:
            self.progress = Progress(TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), TextColumn("{task.description}"),
                                     console=console, transient=True)
            self.task = self.progress.add_task(self._counts(), total=total, completed=self.finished)

    def _counts(self) -> str:
        return " ".join(f"[{_STYLE.get(k, '')}]{k} {v}[/]" for k, v in sorted(self.counts.items()))

    def update(self, result: CellResult) -> None:
        self.counts[result.status.value] += 1
        self.finished += 1
        if self.progress is not None:
            self.progress.update(self.task, advance=1, description=self._counts())
        else:
            width = len(str(self.total))
            shown = result.reason and result.status.value != "green"
            reason = f"  {result.reason[:120]}" if shown else ""
            self.console.print(f"[{self.finished:>{width}}/{self.total}] {result.status.value:<16} "
                               f"{result.key.id}{reason}", markup=False, highlight=False)

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()

    def __enter__(self) -> SweepProgress:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
