"""The `dblog` command.

Every expected failure is a ``DblogError``: its message (and hint) is printed, no
traceback, and the process exits with the error's code.
"""

from __future__ import annotations

import faulthandler
import logging
import signal
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import orjson

from pydblog.config import Config, load_config
from pydblog.errors import ConfigError, DblogError

F = TypeVar("F", bound=Callable[..., Any])

# Each command imports what it runs inside its function: `dblog --help` and every
# command load only their own modules (the capture, the API, Spark's job and its
# session: the last take seconds to import), and a missing optional extra fails only
# the command that needs it.

config_option = click.option(
    "--config", "-c", "config_path", required=True, type=click.Path(dir_okay=False),
    help="Path of the TOML configuration file.",
)


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _fail(exc: DblogError) -> None:
    click.echo(f"error: {exc}", err=True)
    sys.exit(exc.exit_code)


def _load(path: str) -> Config:
    try:
        return load_config(path)
    except DblogError as exc:
        _fail(exc)
        raise AssertionError from exc  # unreachable


@click.group()
@click.version_option(package_name="pydblog")
def main() -> None:
    """pydblog: DBLog-style change data capture into a durable change log."""


@main.command()
@config_option
@click.option("--verbose", "-v", is_flag=True, help="Debug logging.")
@click.option("--release-ha", is_flag=True,
              help="Remove a high-availability group's claim on the embedded change log "
              "first (after stopping every [ha] member), then run without [ha].")
def run(config_path: str, verbose: bool, release_ha: bool) -> None:
    """Capture the source's log into the change log until SIGINT/SIGTERM."""
    _setup_logging(verbose)
    cfg = _load(config_path)
    from pydblog.config import SYNC_ONLY_DSN

    if cfg.source.dsn == SYNC_ONLY_DSN:
        _fail(ConfigError("this config has no [source]: it is a `dblog sync` config "
                          "([[sync.sources]] name the change logs)",
                          hint="run `dblog run` with each source's own config"))
    if release_ha:
        if cfg.ha is not None or cfg.log.type != "embedded":
            _fail(ConfigError("--release-ha applies to a `dblog run` without [ha] on the "
                              "embedded change log",
                              hint="remove [ha] from this config (or drop the flag)"))
        from pydblog.changelog.sqlite import release_ha_claim

        epoch = release_ha_claim(cfg.log.path)
        if epoch is not None:
            logging.getLogger("pydblog").warning(
                "released the high-availability claim (epoch %d) on the change log", epoch)
    from pydblog.api.capture import start_capture_api
    from pydblog.capture.service import run_capture

    stop = threading.Event()

    def _stop(signum: int, _frame: Any) -> None:
        logging.getLogger("pydblog").info("received %s, shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    # `kill -USR1 <pid>` prints every thread's stack to stderr (a stalled capture's
    # where-is-it, without stopping it).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        run_capture(cfg, stop, serve_api=start_capture_api)
    except DblogError as exc:
        _fail(exc)


@main.command()
@config_option
@click.option("--from-offset", type=int, default=None, help="First offset to print (default: the oldest kept).")
@click.option("--follow/--no-follow", default=True, help="Keep printing new events (default) or exit at the end.")
@click.option("--table", "tables", multiple=True, help="Only events of this schema.table (repeatable).")
def tail(config_path: str, from_offset: int | None, follow: bool, tables: tuple[str, ...]) -> None:
    """Print the change log as JSON lines, in change-log (offset) order."""
    cfg = _load(config_path)
    from pydblog.changelog import open_reader
    from pydblog.events import with_offset

    try:
        reader = open_reader(cfg.log)
    except DblogError as exc:
        _fail(exc)
        return
    out = sys.stdout.buffer
    table_list = list(tables) or None
    try:  # (a Kafka reader connects at its first read: its errors come from here on)
        start = reader.first_offset() if from_offset is None else from_offset
        if follow:
            for rec in reader.follow(start, 0.1, table_list):
                out.write(with_offset(rec.offset, rec.body) + b"\n")
                out.flush()
        else:
            end = reader.next_offset()
            offset = start
            while offset < end:
                batch = reader.read(offset, 10_000, table_list)
                batch = [r for r in batch if r.offset < end]
                if not batch:
                    break
                for rec in batch:
                    out.write(with_offset(rec.offset, rec.body) + b"\n")
                offset = batch[-1].offset + 1
            out.flush()
    except (KeyboardInterrupt, BrokenPipeError):
        pass
    except DblogError as exc:
        _fail(exc)
    finally:
        reader.close()


@main.command()
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def status(config_path: str, as_json: bool) -> None:
    """Show the source position, slot lag, change log size and rate."""
    cfg = _load(config_path)
    from pydblog.capture.service import collect_status

    try:
        info = collect_status(cfg)
    except DblogError as exc:
        _fail(exc)
        return
    if as_json:
        click.echo(orjson.dumps(info, option=orjson.OPT_INDENT_2).decode())
        return
    from rich.console import Console

    from pydblog.ui import snapshot_bars

    for key, value in info.items():
        if key == "snapshot" and isinstance(value, dict) and value.get("tables_total"):
            Console().print(snapshot_bars(value))
        elif isinstance(value, dict):
            click.echo(f"{key}:")
            for k, v in value.items():
                click.echo(f"  {k}: {v}")
        else:
            click.echo(f"{key}: {value}")


@main.command()
@config_option
@click.option("--print-sql", is_flag=True, required=True,
              help="Print the SQL an administrator runs for a least-privilege capture.")
@click.option("--dsn", default=None,
              help="PostgreSQL: an administrator's connection to the same database, to list "
                   "the tables [source] tables matches (default: the configured DSN).")
@click.option("--host", default="%", show_default=True,
              help="MySQL/MariaDB: the host the capture user connects from ('user'@'host').")
def setup(config_path: str, print_sql: bool, dsn: str | None, host: str) -> None:
    """Print what a DBA runs so that the configured capture needs the least privilege:
    its role or user and grants, the publication (PostgreSQL), the server settings
    (MySQL/MariaDB), and pydblog's signal and watermark tables when the watermark mode
    writes them. Passwords are never printed: set them yourself."""
    cfg = _load(config_path)
    from pydblog.setup_sql import print_sql as generate

    try:
        click.echo(generate(cfg, dsn, host), nl=False)
    except DblogError as exc:
        _fail(exc)


@main.command(context_settings={"ignore_unknown_options": False})
@config_option
@click.argument("args", nargs=-1)
@click.option("--filter", "filter_", default=None, help="SQL boolean condition applied to the rows read.")
@click.option("--surrogate-key", default=None, help="Column to chunk by instead of the primary key.")
@click.option("--blocking", is_flag=True, help="Blocking snapshot: streaming waits while the tables are read.")
@click.option("--wait", is_flag=True, help="Follow the snapshot to its end with a progress bar (exit 1 if aborted or rejected).")
@click.option("--repair", is_flag=True,
              help="A repair: the sinks also delete the rows the source no longer has.")
def snapshot(config_path: str, args: tuple[str, ...], filter_: str | None,
             surrogate_key: str | None, blocking: bool, wait: bool, repair: bool) -> None:
    """Ask for a snapshot of TABLE_REGEX... (or: snapshot stop|pause|resume [TABLE_REGEX...]).

    The request is a row in the signal table; the running `dblog run` picks it up
    (read-only snapshots: it goes to the running capture's API, which needs [api] token).
    """
    cfg = _load(config_path)
    from pydblog.capture.signals import post_signal, send_signal, signals_go_direct

    actions = {"stop": "stop-snapshot", "pause": "pause-snapshot", "resume": "resume-snapshot"}
    data: dict[str, Any]
    if args and args[0] in actions:
        kind = actions[args[0]]
        if repair:
            raise click.UsageError("--repair applies to a snapshot request, not to stop/pause/resume")
        data = {"data-collections": list(args[1:])} if args[1:] else {}
        if kind == "stop-snapshot":
            data["type"] = "incremental"
    else:
        if not args:
            raise click.UsageError("name at least one TABLE_REGEX (schema.table regex)")
        kind = "execute-snapshot"
        data = {"data-collections": list(args), "type": "blocking" if blocking else "incremental"}
        if filter_:
            data["additional-conditions"] = [
                {"data-collection": pattern, "filter": filter_} for pattern in args
            ]
        if surrogate_key:
            data["surrogate-key"] = surrogate_key
        if repair:
            if filter_ or blocking:
                raise click.UsageError("--repair reads whole tables: drop --filter and --blocking")
            data["repair"] = [{"data-collection": pattern, "ranges": None} for pattern in args]
    signal_id = f"cli-{uuid.uuid4()}"
    start = _log_end(cfg) if wait else 0
    try:
        if signals_go_direct(cfg):
            answer = post_signal(cfg, signal_id, kind, data)
            if answer.get("duplicate"):
                click.echo(f"{kind} signal {signal_id} was already applied")
        else:
            send_signal(cfg, signal_id, kind, data)
    except DblogError as exc:
        _fail(exc)
    click.echo(f"sent {kind} signal {signal_id}")
    if wait and kind == "execute-snapshot":
        from pydblog.ui import wait_for_snapshot

        try:
            sys.exit(wait_for_snapshot(cfg, signal_id, start))
        except KeyboardInterrupt:
            sys.exit(130)


def _log_end(cfg: Config) -> int:
    """The change log's end (notifications of a signal sent now come after it)."""
    from pydblog.changelog import open_reader

    try:
        reader = open_reader(cfg.log)
    except DblogError as exc:
        _fail(exc)
        raise AssertionError from exc  # unreachable
    try:
        return reader.next_offset()
    finally:
        reader.close()


@main.command("sync-jars")
@click.option("--s3", is_flag=True, help="Also the S3A file system (hadoop-aws).")
def sync_jars_cmd(s3: bool) -> None:
    """Fetch the Spark packages `dblog sync` needs (Maven, cached) and print their files."""
    from pydblog.extras import needs_extra

    try:
        with needs_extra("spark", "dblog sync-jars"):
            from pydblog.spark.jars import sync_jars

            for jar in sync_jars(s3):
                click.echo(jar)
    except DblogError as exc:
        _fail(exc)


@main.command()
@config_option
@click.argument("patterns", nargs=-1, metavar="[TABLE_REGEX]...")
@click.option("--sink", "sink", default=None,
              help="Only this sink (its type, or type#n when several share it).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--chunk-size", default=10_000, show_default=True, type=click.IntRange(1),
              help="Source rows per key range.")
@click.option("--lag-timeout", default=60.0, show_default=True, type=click.FloatRange(0),
              help="Seconds to wait for the capture and the mirror to pass a differing range's read.")
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(1),
              help="Reads of a differing range before its lagging keys count as unsettled.")
@click.option("--repair", is_flag=True,
              help="Repair the differing ranges through the capture, wait for the mirrors "
              "to apply the repair, then verify them again.")
@click.option("--repair-timeout", default=600.0, show_default=True, type=click.FloatRange(0),
              help="Seconds to wait for the repair's markers, and for each mirror to apply them.")
@click.option("--delta-mode", type=click.Choice(["spark", "rows"]), default="spark",
              show_default=True,
              help="Delta mirrors: checksums through Spark where the column types allow "
              "(starts a Spark session), or every row compared in Python.")
def verify(config_path: str, patterns: tuple[str, ...], sink: str | None, as_json: bool,
           chunk_size: int, lag_timeout: float, rounds: int, repair: bool,
           repair_timeout: float, delta_mode: str) -> None:
    """Compare each captured table with each mirror, key range by key range.

    Exit 0 when every mirror equals its source (after --repair: once repaired), 1 when
    a range differs.
    """
    cfg = _load(config_path)
    from pydblog.verifier.cli import verify_command
    from pydblog.verifier.run import Options

    try:
        code = verify_command(cfg, patterns, sink, as_json,
                              Options(chunk_size, rounds, lag_timeout,
                                      delta_spark=delta_mode == "spark"),
                              repair, repair_timeout)
    except DblogError as exc:
        _fail(exc)
        return
    sys.exit(code)


@main.command()
@config_option
@click.option("--available-now", is_flag=True, help="Apply everything in the change log, then exit.")
@click.option("--verbose", "-v", is_flag=True,
              help="Debug logging, and Spark's own output (log4j, JVM) on the console.")
def sync(config_path: str, available_now: bool, verbose: bool) -> None:
    """Apply the change log to the configured sinks with PySpark, exactly once."""
    _setup_logging(verbose)
    cfg = _load(config_path)
    from pydblog.console import configure
    from pydblog.extras import needs_extra

    configure(verbose, cfg.log_dir)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        with needs_extra("spark", "dblog sync"):
            from pydblog.spark.session import check_config, preload, spark_session

            # The job's modules are imported in the background while the driver JVM
            # starts (spark/session.py); run_sync reuses the session.
            preload()
            check_config(cfg)
            from pydblog.spark.job import _uses_s3, run_sync

            spark_session(cfg.sync.master, s3=_uses_s3(cfg))

            code = run_sync(cfg, available_now=available_now, stop_event=stop)
    except DblogError as exc:
        _fail(exc)
        return
    sys.exit(code)


@main.command()
@click.option("--dir", "workdir", type=click.Path(file_okay=False), default=None,
              help="Where to put the demo's files (default: a temporary directory).")
@click.option("--rows", default=2000, show_default=True, help="Rows in the demo workload.")
@click.option("--with-sync/--no-sync", default=None, help="Also run `dblog sync` (default: when PySpark is installed).")
@click.option("--verbose", "-v", is_flag=True, help="Spark's own output (log4j, JVM) on the console.")
def demo(workdir: str | None, rows: int, with_sync: bool | None, verbose: bool) -> None:
    """Start a throwaway PostgreSQL, write a workload, capture it and show the result."""
    _setup_logging(False)
    from pydblog.console import configure
    from pydblog.demo import run_demo

    configure(verbose, None)
    try:
        code = run_demo(Path(workdir) if workdir else None, rows, with_sync)
    except DblogError as exc:
        _fail(exc)
        return
    sys.exit(code)
