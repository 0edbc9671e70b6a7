"""``dblog verify``'s output: a progress bar on stderr, then the differing ranges (or
one JSON object with ``--json``)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click
import orjson
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pydblog.config import Config
from pydblog.verifier.run import Options, Report, run_verify


def verify_command(cfg: Config, patterns: Sequence[str], sink: str | None, as_json: bool,
                   opts: Options) -> int:
    from pydblog.ui import stderr_console

    console = stderr_console()
    bar = Progress(TextColumn("[bold]verify"), TextColumn("{task.description}"), BarColumn(),
                   MofNCompleteColumn(), TextColumn("rows"), TimeElapsedColumn(),
                   console=console, transient=True, disable=not console.is_terminal)
    task = bar.add_task("", total=None)
    with bar:
        report = run_verify(
            cfg, patterns, sink, opts,
            on_start=lambda total: bar.update(task, total=max(total, 1)),
            advance=lambda n: bar.advance(task, n),
            on_table=lambda table, mirror: bar.update(task, description=f"{table} -> {mirror}"),
        )
    if as_json:
        sys.stdout.write(orjson.dumps(report.to_json(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        click.echo(render(report))
    return report.exit_code()


def render(report: Report) -> str:
    lines = []
    for t in report.tables:
        mark = "OK      " if t.ok else "DIFFERS "
        lines.append(f"{mark}{t.table} -> {t.sink}: {t.source_rows} rows, {t.ranges} ranges "
                     f"({t.mode}, {t.seconds:.1f} s)")
        if t.error:
            lines.append(f"  error: {t.error}")
        for r in t.differing:
            d = r.diff
            what = []
            if d.missing:
                what.append(f"{len(d.missing)} missing")
            if d.extra:
                what.append(f"{len(d.extra)} extra")
            if d.different:
                what.append(f"{len(d.different)} different")
            if r.unsettled:
                what.append(f"{r.unsettled} unsettled (changing while read)")
            lines.append(f"  range {r.range.label()}: {r.status}: {', '.join(what)}")
            for kind, keys in (("missing", d.missing), ("extra", d.extra), ("different", d.different)):
                if keys:
                    shown = ", ".join(orjson.dumps(list(k), default=str).decode() for k in keys[:5])
                    more = f" (+{len(keys) - 5})" if len(keys) > 5 else ""
                    lines.append(f"    {kind}: {shown}{more}")
    rate = f", {report.rows / report.seconds:,.0f} rows/s" if report.seconds > 0 else ""
    verdict = "mirrors equal their source" if report.ok else "mirrors differ from their source"
    lines.append(f"{verdict}: {len(report.tables)} table mirrors, {report.rows} source rows, "
                 f"{report.seconds:.1f} s{rate}")
    return "\n".join(lines)
