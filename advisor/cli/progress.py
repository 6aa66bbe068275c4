"""The progress of a running campaign, drawn from the runner's events (``campaign_run``).

On a terminal, a rich progress bar (runs done and left, elapsed and remaining time, the run in
progress) with a line above it for every run that did not end "ok"; elsewhere (a log, CI), one
plain line per event. Both write to stderr, so stdout keeps only the summary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import click


def _result(event: dict) -> str:
    text = f"{event['status']} ({event['seconds']:.1f} s)"
    if event["status"] != "ok":
        text += f": {event.get('where') or ''} {event.get('error') or ''}".rstrip()
    return text


@dataclass
class Lines:
    """One line per event, for a stderr that is not a terminal."""

    total: int = 0

    def handle(self, event: dict) -> None:
        kind = event.get("event")
        if kind == "campaign":
            self.total = event["runs"]
            click.echo(f"{event['runs']} runs in {event['out']}: {event['complete']} complete, "
                       f"{event['runs'] - event['complete']} to run", err=True)
        elif kind == "run":
            width = len(str(self.total))
            click.echo(f"[{event['index']:>{width}}/{self.total}] {event['id']}: {_result(event)}", err=True)

    def close(self) -> None:
        pass


@dataclass
class Bar:
    """A rich progress bar on a terminal."""

    progress: object = None
    task: object = None
    total: int = 0
    shown: list = field(default_factory=list)

    def handle(self, event: dict) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
            TimeRemainingColumn

        from advisor.render import DEFAULT_WIDTH, RICH_HEIGHT, stderr_width

        kind = event.get("event")
        if kind == "campaign":
            self.total = event["runs"]
            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
                                     console=Console(stderr=True, width=stderr_width() or DEFAULT_WIDTH,
                                                     height=RICH_HEIGHT), transient=False)
            self.progress.start()
            self.task = self.progress.add_task("profiling", total=event["runs"], completed=event["complete"])
        elif kind == "start" and self.progress is not None:
            self.progress.update(self.task, description=f"running {event['id']}")
        elif kind == "run" and self.progress is not None:
            if event["status"] != "ok":
                self.progress.console.print(f"{event['id']}: {_result(event)}", markup=False, highlight=False)
            self.progress.update(self.task, advance=1, description="profiling")

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def view(terminal: bool) -> Lines | Bar:
    return Bar() if terminal else Lines()
