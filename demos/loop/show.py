"""What the demo shows: live progress while it runs, then the verdict table and the chart."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from demos.loop.verdict import Verdict, percentile

STAGES = ("produced", "applied", "published", "verified")
COLOURS = {"spark": "tab:red", "relay": "tab:purple", "broker": "black"}


@dataclass
class Timeline:
    """Samples of the stages' counts over time, and when each component was killed."""

    samples: list[tuple[float, int, int, int]] = field(
        default_factory=list
    )  # t, produced, applied, published
    kills: list[tuple[float, str]] = field(default_factory=list)


class Display:
    """A bar per stage and a line of chaos counts; plain lines when the output is not a terminal."""

    def __init__(self, console: Console, total: int, planned: Mapping[str, int]) -> None:
        self.console = console
        self.planned = planned
        self.bars = Progress(
            TextColumn("{task.description:>10}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[note]}"),
            TimeElapsedColumn(),
            console=console,
        )
        self.tasks = {s: self.bars.add_task(s, total=total, note="") for s in STAGES}
        self.chaos = Text()
        self.live = Live(Group(self.bars, self.chaos), console=console, refresh_per_second=4)

    def __enter__(self) -> Display:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(*exc)  # type: ignore[arg-type]

    def update(
        self, counts: Mapping[str, int], notes: Mapping[str, str], kills: Mapping[str, int], exits: int
    ) -> None:
        for stage, task in self.tasks.items():
            if stage in counts:
                self.bars.update(task, completed=counts[stage], note=notes.get(stage, ""))
        done = " · ".join(f"{c} killed {kills.get(c, 0)}/{n}" for c, n in self.planned.items())
        self.chaos.plain = f"{'chaos':>10}  {done or 'none (--no-chaos)'}" + (
            f" · exited on their own {exits}" if exits else ""
        )

    def verified(self, records: int, problems: int) -> None:
        """The final read-back: how many output records were checked, and what was found."""
        note = "no problem found" if not problems else f"{problems} problems"
        self.bars.update(self.tasks["verified"], completed=records, note=note)

    def say(self, line: str) -> None:
        self.console.log(line)


def table(
    v: Verdict,
    kills: Mapping[str, int],
    exits: int,
    applied: int,
    latencies: Sequence[float],
    warmups: Sequence[float],
) -> Table:
    p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
    t = Table(title="verdict", show_header=True, header_style="bold")
    t.add_column("check")
    t.add_column("value", justify="right")
    t.add_column("")
    rows: list[tuple[str, str, bool | None]] = [
        ("committed input events", f"{v.committed_in:,}", None),
        ("  redelivered copies in the input", f"{v.redelivered_in:,}", None),
        ("applied to PostgreSQL", f"{applied:,}", applied == v.committed_in),
        ("published to the output topic", f"{v.published:,}", v.published == v.committed_in),
        ("duplicates", str(v.duplicates), v.duplicates == 0),
        ("missing", str(v.missing), v.missing == 0),
        ("out of order", str(v.out_of_order), v.out_of_order == 0),
        ("leaked (aborted or unknown)", str(v.leaked), v.leaked == 0),
        ("wrongly transformed", str(v.wrong), v.wrong == 0),
        *((f"kills: {c}", str(n), None) for c, n in kills.items()),
        ("exited on their own (restarted)", str(exits), None),
        ("Spark job start to first batch, median", _ms(percentile(warmups, 50)), None),
        ("end-to-end latency p50", _ms(p50), None),
        ("end-to-end latency p99", _ms(p99), None),
    ]
    for name, value, ok in rows:
        t.add_row(name, value, "" if ok is None else ("[green]ok" if ok else "[red]FAIL"))
    return t


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:,.0f} ms"


def chart(path: Path, timeline: Timeline, latencies: Sequence[float], verdict: Verdict) -> None:
    """Events produced, applied and published over time with the kills marked; the latency histogram."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (flow, lat) = plt.subplots(2, 1, figsize=(11, 8), gridspec_kw={"height_ratios": [3, 2]})
    if timeline.samples:
        t, produced, applied, published = zip(*timeline.samples, strict=True)
        flow.plot(t, produced, label="produced (committed)", color="tab:blue")
        flow.plot(t, applied, label="applied (PostgreSQL)", color="tab:orange")
        flow.plot(t, published, label="published (output topic)", color="tab:green")
    marked: set[str] = set()
    for at, component in timeline.kills:
        label = (
            None
            if component in marked
            else f"kill -9 {component}"
            if component != "broker"
            else "broker restart"
        )
        marked.add(component)
        flow.axvline(at, color=COLOURS[component], linestyle="--", linewidth=1, alpha=0.7, label=label)
    flow.set_xlabel("seconds")
    flow.set_ylabel("events")
    verdict_text = "OK" if verdict.ok else "FAILED"
    flow.set_title(
        f"{verdict_text}: {verdict.committed_in:,} committed in, {verdict.published:,} out;"
        f" {verdict.duplicates} duplicates, {verdict.missing} missing,"
        f" {verdict.out_of_order} out of order, {verdict.leaked} leaked"
    )
    flow.legend(loc="upper left", fontsize=8)
    flow.grid(alpha=0.3)
    if latencies:
        ms = [x * 1000 for x in latencies]
        lat.hist(ms, bins=60, color="tab:green", alpha=0.8)
        lat.set_yscale("log")
        for q, style in ((50, "-"), (99, "--")):
            value = percentile(ms, q)
            lat.axvline(value, color="black", linestyle=style, label=f"p{q} {value:,.0f} ms")
        lat.legend(fontsize=8)
    lat.set_xlabel("end-to-end latency, input commit to output read (ms)")
    lat.set_ylabel("events")
    lat.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
