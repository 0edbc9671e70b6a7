"""``dblog verify``'s output: a progress bar on stderr, then the differing ranges (or
one JSON object with ``--json``)."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import click
import orjson
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pydblog.config import Config
from pydblog.errors import DblogError
from pydblog.verifier.run import Options, Report, run_verify


def verify_command(cfg: Config, patterns: Sequence[str], sink: str | None, as_json: bool,
                   opts: Options, repair: bool = False, repair_timeout_s: float = 600.0) -> int:
    report = _verify(cfg, patterns, sink, opts)
    if not repair or report.ok:
        _print(report, as_json)
        return report.exit_code()
    if not as_json:
        click.echo(render(report))
    outcome, final = repair_report(cfg, report, sink, opts, repair_timeout_s)
    if as_json:
        out = {"before": report.to_json(), "repair": outcome, "after": final.to_json() if final else None}
        sys.stdout.write(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode() + "\n")
    elif final is not None:
        click.echo("after the repair:")
        click.echo(render(final))
    return final.exit_code() if final is not None else 1


def _print(report: Report, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(orjson.dumps(report.to_json(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        click.echo(render(report))


def repair_report(cfg: Config, report: Report, sink: str | None, opts: Options,
                  timeout_s: float) -> tuple[dict[str, Any], Report | None]:
    """Repair the differing ranges of ``report`` through the capture, wait for the
    markers and for every mirror to apply them, then verify the repaired tables again."""
    from pydblog.changelog import open_reader
    from pydblog.verifier import repair
    from pydblog.verifier.ranges import is_keyless
    from pydblog.verifier.run import DeltaRoot, captured_tables, open_mirrors

    plan = repair.RepairPlan()
    reader = open_reader(cfg.log)
    try:
        schemas = {s.qualified: s for s in captured_tables(cfg, reader, ())}
        start = reader.next_offset()
    finally:
        reader.close()
    skipped: dict[str, str] = {}
    keyless: list[str] = []
    for t in report.tables:
        if t.ok or t.table not in schemas:
            continue
        schema = schemas[t.table]
        if t.error is not None:
            skipped[t.table] = t.error
            continue
        plan.schemas[t.table] = schema
        if is_keyless(schema):  # repaired whole, chunked by a column verify picks
            keyless.append(t.table)
            plan.ranges[t.table] = None
            continue
        have = plan.ranges.setdefault(t.table, [])
        assert have is not None
        for r in t.differing:
            if all((x.lo_text, x.hi_text) != (r.range.lo_text, r.range.hi_text) for x in have):
                have.append(r.range)
    if keyless:
        from pydblog.verifier.run import open_source, source_table

        conn = open_source(cfg)
        try:
            for table in keyless:
                try:
                    plan.chunk_by[table] = repair.chunk_column(
                        source_table(cfg, conn, schemas[table]))
                except DblogError as exc:
                    skipped[table] = exc.message
                    del plan.ranges[table]
        finally:
            conn.close()
    info: dict[str, Any] = {"skipped": skipped}
    if not plan:
        return info, None
    ids = [repair.send(cfg, data) for data in repair.signals(cfg, plan)]
    info["signal_id"] = ids[0]
    info["signal_ids"] = ids
    info["ranges"] = {t: len(r or ()) for t, r in plan.ranges.items()}
    info["whole"] = sorted(plan.chunk_by)
    click.echo(f"sent repair signal(s) {', '.join(ids)} ({sum(info['ranges'].values())} "
               f"ranges, {len(plan.chunk_by)} whole tables)", err=True)
    outcome = repair.RepairOutcome(ids[0])
    deadline = time.monotonic() + timeout_s
    for signal_id in ids:
        got = repair.wait_markers(cfg, signal_id, start, max(1.0, deadline - time.monotonic()))
        outcome.markers.update(got.markers)
        outcome.failed.update(got.failed)
    info["markers"] = outcome.markers
    info["failed"] = outcome.failed
    if outcome.failed:
        return info, None
    mirrors = open_mirrors(cfg, sink)
    try:
        lagging = []
        deadline = time.monotonic() + timeout_s
        for m in mirrors:
            waits: list[tuple[Callable[[], int], int]]
            if isinstance(m, DeltaRoot):  # each table's version says where that table is
                waits = [(m.table(plan.schemas[q]).applied, at + 1)
                         for q, at in outcome.markers.items()]
            else:
                waits = [(m.applied, outcome.end)]
            for applied, end in waits:
                if not repair.wait_applied(applied, end, max(0.0, deadline - time.monotonic())):
                    lagging.append(m.name)
                    break
    finally:
        for m in mirrors:
            m.close()
    info["lagging"] = lagging
    if lagging:
        click.echo(f"the markers are logged; {', '.join(lagging)} did not apply them within "
                   f"{timeout_s:.0f} s (is `dblog sync` running?)", err=True)
        return info, None
    patterns = [re.escape(t) for t in plan.ranges]
    return info, _verify(cfg, patterns, sink, opts)


def _verify(cfg: Config, patterns: Sequence[str], sink: str | None, opts: Options) -> Report:
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
    return report


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
