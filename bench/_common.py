"""Shared pieces of the trades benchmark harness: input generation, ground truth, databases, machine info.

Nothing here imports ``tandem`` or ``pyspark``: the harness (``trades_throughput.py``) uses it for
both sides, and the plain baseline (``plain_trades.py``) does not use it at all.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import platform
import shutil
import subprocess
import tempfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import pandas as pd
import psycopg2

UTC = timezone.utc
# By default the event times are centred on this midnight, so every granularity (second … year)
# has at least two buckets per symbol.
NEW_YEAR = datetime(2025, 1, 1, tzinfo=UTC)
MEASURES = ("price_sum", "trade_count", "quantity_sum", "price_min", "price_max")

# Bad lines (~0.5 % of the input): malformed JSON, wrong JSON types, missing fields, values that
# fail a check. ``{sym}`` and ``{ts}`` are filled in so bad lines look like their neighbours.
BAD_TEMPLATES = (
    '{{not json',
    '[1, 2, 3]',
    '{{"symbol": "{sym}", "price": "abc", "quantity": 1, "timestamp": {ts}}}',
    '{{"symbol": "{sym}", "quantity": 3, "timestamp": {ts}}}',
    '{{"symbol": "{sym}", "price": 10.5, "quantity": -3, "timestamp": {ts}}}',
    '{{"symbol": "{sym}", "price": -1.25, "quantity": 3, "timestamp": {ts}}}',
    '{{"symbol": "", "price": 2.5, "quantity": 4, "timestamp": {ts}}}',
    '{{"symbol": "{sym}", "price": 2.5, "quantity": 4, "timestamp": "yesterday"}}',
    '{{"symbol": "{sym}", "price": 10.0, "quantity": 1.5, "timestamp": {ts}}}',
    '{{"price": 10.0, "quantity": 1, "timestamp": {ts}}}',
)


@dataclass(frozen=True)
class InputSpec:
    """What the pre-written input looks like; the same spec always produces the same files."""

    events: int = 1_500_000
    files: int = 1_000
    symbols: int = 200
    span_hours: float = 1.0
    bad_ratio: float = 0.005
    jitter_ms: int = 2_000
    seed: int = 7
    start: str | None = None  # default: centred on New Year's midnight, so every granularity has 2+ buckets

    @property
    def start_ms(self) -> int:
        if self.start:
            return int(datetime.fromisoformat(self.start).timestamp() * 1000)
        midnight = int(NEW_YEAR.timestamp() * 1000)
        return midnight - int(self.span_hours * 3_600_000) // 2 // 60_000 * 60_000

    @property
    def key(self) -> str:
        return hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


@dataclass
class InputSet:
    spec: InputSpec
    directory: Path
    files: int
    lines: int
    valid: int
    invalid: int
    bytes: int
    first_event: str
    last_event: str
    second_rows: int
    truth_hour: pd.DataFrame  # ground truth per (hour bucket, symbol) over the valid events

    def describe(self) -> dict:
        return {
            "events_total": self.lines, "valid_events": self.valid, "invalid_lines": self.invalid,
            "bad_ratio": round(self.invalid / self.lines, 5), "files": self.files,
            "events_per_file": round(self.lines / self.files), "bytes": self.bytes,
            "symbols": self.spec.symbols, "event_time_first": self.first_event, "event_time_last": self.last_event,
            "span_hours": self.spec.span_hours, "distinct_second_symbol_buckets": self.second_rows,
            "instance_directories": 1, "format": "JSON lines, one event per line",
            "event_order": f"event times increase through the files (jitter up to {self.spec.jitter_ms} ms, "
                           "below the 10 s watermark, so no event is late)",
            "seed": self.spec.seed, "directory": str(self.directory),
        }


def symbol_names(count: int, seed: int) -> list[str]:
    """``count`` distinct ticker-like names (3–5 capital letters), reproducible."""
    rng = np.random.default_rng(seed + 1)
    names: list[str] = []
    seen: set[str] = set()
    while len(names) < count:
        length = int(rng.integers(3, 6))
        name = "".join(chr(65 + int(c)) for c in rng.integers(0, 26, length))
        if name not in seen:
            seen.add(name)
            names.append(name)
    return names


def _arrays(spec: InputSpec) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(spec.seed)
    n = spec.events
    start_ms = spec.start_ms
    span_ms = int(spec.span_hours * 3_600_000)
    base = start_ms + (np.arange(n, dtype=np.int64) * span_ms) // n
    timestamp = np.maximum(base - rng.integers(0, spec.jitter_ms + 1, n), start_ms)
    symbol = rng.integers(0, spec.symbols, n)
    levels = np.round(rng.uniform(5, 900, spec.symbols), 2)
    price = np.maximum(np.round(levels[symbol] * np.exp(rng.normal(0, 0.02, n)), 2), 0.01)
    quantity = rng.integers(1, 501, n)
    bad = rng.random(n) < spec.bad_ratio
    template = rng.integers(0, len(BAD_TEMPLATES), n)
    return {"timestamp": timestamp, "symbol": symbol, "price": price, "quantity": quantity, "bad": bad,
            "template": template}


def _measures(events: pd.DataFrame) -> pd.DataFrame:
    """The trades plan's measures of ``events`` (``bucket_start, symbol, price, quantity``) per bucket and symbol."""
    return events.groupby(["bucket_start", "symbol"]).agg(
        price_sum=("price", "sum"), trade_count=("price", "size"), quantity_sum=("quantity", "sum"),
        price_min=("price", "min"), price_max=("price", "max")).reset_index()


def _aggregate(data: dict[str, np.ndarray], names: np.ndarray, bucket_ms: int) -> pd.DataFrame:
    good = ~data["bad"]
    return _measures(pd.DataFrame({"bucket_start": data["timestamp"][good] // bucket_ms * bucket_ms,
                                   "symbol": names[data["symbol"][good]], "price": data["price"][good],
                                   "quantity": data["quantity"][good]}))


def ground_truth(spec: InputSpec, bucket_ms: int) -> pd.DataFrame:
    """The trades plan's measures per (bucket of ``bucket_ms``, symbol) over the valid events of ``spec``, computed
    in plain pandas from the generator (``bucket_start`` in epoch ms)."""
    return _aggregate(_arrays(spec), np.array(symbol_names(spec.symbols, spec.seed), dtype=object), bucket_ms)


def prepare_input(spec: InputSpec, root: Path, write_file, progress=None) -> InputSet:
    """Write the input once into ``root/landing/trades/0`` (reused when it already exists).

    ``write_file(directory, lines)`` writes one file atomically. File modification times are set
    one second apart in file order so every reader sees the same order.
    """
    directory = root / "landing" / "trades" / "0"  # partition 0: what shard-1 reads
    manifest = root / "manifest.json"
    data = _arrays(spec)
    names = np.array(symbol_names(spec.symbols, spec.seed), dtype=object)
    good = ~data["bad"]
    truth = _aggregate(data, names, 3_600_000).rename(columns={"bucket_start": "hour"})
    second_rows = len(np.unique(data["timestamp"][good] // 1000 * spec.symbols + data["symbol"][good]))

    if not (manifest.is_file() and json.loads(manifest.read_text()).get("spec") == asdict(spec)):
        if directory.exists():
            for old in directory.iterdir():
                old.unlink()
        directory.mkdir(parents=True, exist_ok=True)
        ts, sym, price, qty = (data[k].tolist() for k in ("timestamp", "symbol", "price", "quantity"))
        bad, template = data["bad"].tolist(), data["template"].tolist()
        name_list = names.tolist()
        bounds = np.linspace(0, spec.events, spec.files + 1).astype(int).tolist()
        written: list[Path] = []
        task = progress.add_task("writing input files", total=spec.files) if progress else None
        for f in range(spec.files):
            lines = []
            for i in range(bounds[f], bounds[f + 1]):
                if bad[i]:
                    lines.append(BAD_TEMPLATES[template[i]].format(sym=name_list[sym[i]], ts=ts[i]))
                else:
                    lines.append(f'{{"symbol": "{name_list[sym[i]]}", "price": {price[i]}, '
                                 f'"quantity": {qty[i]}, "timestamp": {ts[i]}}}')
            written.append(write_file(directory, lines))
            if progress:
                progress.advance(task)
        first = time.time_ns() - spec.files * 1_000_000_000
        for index, path in enumerate(written):
            stamp = first + index * 1_000_000_000
            os.utime(path, ns=(stamp, stamp))
        manifest.write_text(json.dumps({"spec": asdict(spec)}, indent=2))
        if progress:
            progress.remove_task(task)

    files = sorted(p for p in directory.iterdir() if p.suffix == ".jsonl")
    invalid = int(data["bad"].sum())
    ts_good = data["timestamp"][good]
    return InputSet(
        spec=spec, directory=directory, files=len(files), lines=spec.events, valid=spec.events - invalid,
        invalid=invalid, bytes=sum(p.stat().st_size for p in files),
        first_event=datetime.fromtimestamp(int(ts_good.min()) / 1000, UTC).isoformat(),
        last_event=datetime.fromtimestamp(int(ts_good.max()) / 1000, UTC).isoformat(),
        second_rows=second_rows, truth_hour=truth,
    )


TRADE_KEY = ("bucket_start", "symbol")
MAX_EPOCH_MILLIS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, the plans' bound for epoch_millis fields


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def valid_trade(line: str) -> dict | None:
    """The trades plan's rule for one input line, in plain Python: the event when the line is a JSON object with a
    non-empty string ``symbol`` (no NUL), a number ``price`` > 0, an integer ``quantity`` > 0 and an integer
    ``timestamp`` of epoch milliseconds between 1970 and 9999; else None."""
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if not isinstance(event, dict):
        return None
    symbol, price, quantity, timestamp = (event.get(k) for k in ("symbol", "price", "quantity", "timestamp"))
    if not (isinstance(symbol, str) and symbol.strip() and "\x00" not in symbol):
        return None
    if not (_is_number(price) and price > 0):
        return None
    if not (isinstance(quantity, int) and not isinstance(quantity, bool) and quantity > 0):
        return None
    if not (isinstance(timestamp, int) and not isinstance(timestamp, bool) and 0 <= timestamp <= MAX_EPOCH_MILLIS):
        return None
    return event


def valid_event(line: str, fields) -> dict | None:
    """A stream's rule for one input line, in plain Python, from its declared ``fields`` (name → the declaration's
    field: ``type``, ``checks()``, ``default``, ``path(name)``): the event (each field by its name, defaults filled
    in) when the line is a JSON object without a repeated key whose fields have their types and pass their checks;
    else None. Restates the rule for the benchmarks' checks without Spark (``tandem.runtime.records`` is the
    rule)."""

    def unique(pairs):
        keys = [key for key, _ in pairs]
        if len(set(keys)) != len(keys):
            raise ValueError("a repeated key")
        return dict(pairs)

    try:
        parsed = json.loads(line, object_pairs_hook=unique)
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    event = {}
    for name, field in fields.items():
        value = parsed
        for key in field.path(name):
            value = value.get(key) if isinstance(value, dict) else None
        if value is None:
            value = field.default
        if value is None or not _of_type(value, field.type) or not all(
                _passes(value, operator, bound) for operator, bound, _ in field.checks()):
            return None
        event[name] = value
    return event


def _of_type(value, declared: str) -> bool:
    if declared == "string":
        return isinstance(value, str)
    if declared == "boolean":
        return isinstance(value, bool)
    if declared == "double":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, int) and not isinstance(value, bool) and -2**63 <= value < 2**63  # long, epoch_millis


def _passes(value, operator: str, bound) -> bool:
    tests = {"not_empty": lambda: bool(value.strip()), "no_nul": lambda: "\x00" not in value,
             "max_length": lambda: len(value) <= bound, "finite": lambda: math.isfinite(value),
             "between": lambda: bound[0] <= value <= bound[1], ">": lambda: value > bound,
             ">=": lambda: value >= bound, "<": lambda: value < bound, "<=": lambda: value <= bound}
    return tests[operator]()


def trades_reference(paths, bucket_ms: int = 1000) -> tuple[pd.DataFrame, int, int]:
    """The trades plan's measures per (bucket, symbol) over the valid lines of ``paths``, read and checked line by
    line (:func:`valid_trade`); returns the frame (``bucket_start`` in epoch ms), the valid and the invalid lines."""
    events, invalid = good_events(paths, valid_trade)
    return trades_measures(events, bucket_ms), len(events), invalid


def good_events(paths, rule) -> tuple[list[dict], int]:
    """The events of the lines of ``paths`` that ``rule`` keeps (it returns the event, or None for a bad line), and
    how many lines it refused."""
    events, invalid = [], 0
    for path in paths:
        for line in Path(path).read_text().splitlines():
            event = rule(line)
            if event is None:
                invalid += 1
            else:
                events.append(event)
    return events, invalid


def trades_measures(events: list[dict], bucket_ms: int = 1000) -> pd.DataFrame:
    """The trades plan's measures per (bucket, symbol) of good trade events (``bucket_start`` in epoch ms)."""
    rows = [(e["timestamp"] // bucket_ms * bucket_ms, e["symbol"], float(e["price"]), e["quantity"]) for e in events]
    return _measures(pd.DataFrame(rows, columns=["bucket_start", "symbol", "price", "quantity"]))


def compare_frames(left: pd.DataFrame, right: pd.DataFrame, rtol: float = 1e-9) -> dict:
    """Two frames of trade aggregates keyed by :data:`TRADE_KEY`: rows only on one side, and rows whose measures
    differ (counts and integer sums exactly, the float measures within ``rtol``)."""
    merged = left.merge(right, on=list(TRADE_KEY), how="outer", suffixes=("_l", "_r"), indicator=True)
    both = merged[merged["_merge"] == "both"]
    mismatched = np.zeros(len(both), dtype=bool)
    max_rel = 0.0
    for column in MEASURES:
        a = both[f"{column}_l"].to_numpy(dtype=float)
        b = both[f"{column}_r"].to_numpy(dtype=float)
        if column in ("trade_count", "quantity_sum"):
            mismatched |= a != b
        else:
            mismatched |= ~np.isclose(a, b, rtol=rtol, atol=1e-9)
            if len(a):
                max_rel = max(max_rel, float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-300))))
    result = {"rows_left": int(len(left)), "rows_right": int(len(right)),
              "only_left": int((merged["_merge"] == "left_only").sum()),
              "only_right": int((merged["_merge"] == "right_only").sum()),
              "mismatched": int(mismatched.sum()), "max_relative_difference": max_rel}
    result["match"] = result["only_left"] == result["only_right"] == result["mismatched"] == 0
    return result


# ---------------------------------------------------------------------------------------------
# PostgreSQL: throw-away databases and reading an aggregate table into pandas


def module_at(repo: Path, path: str, revision: str):
    """The module at ``path`` in ``repo`` as it was at git ``revision``, loaded under a name of its own (for a
    benchmark of this tree's code against a revision's)."""
    import importlib.util
    import sys

    source = subprocess.run(["git", "-C", str(repo), "show", f"{revision}:{path}"], capture_output=True, text=True,
                            check=True).stdout
    name = f"{Path(path).stem}_at_{revision}"
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as file:
        file.write(source)
    try:
        spec = importlib.util.spec_from_file_location(name, file.name)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the class is made
        spec.loader.exec_module(module)
    finally:
        os.unlink(file.name)
    return module


def with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


def admin_connection(server_url: str):
    conn = psycopg2.connect(with_database(server_url, "postgres"), connect_timeout=5)
    conn.autocommit = True
    return conn


def create_database(server_url: str, label: str) -> str:
    name = f"tandem_bench_{label}_{uuid.uuid4().hex[:8]}"
    conn = admin_connection(server_url)
    try:
        with conn.cursor() as cursor:
            cursor.execute(f'CREATE DATABASE "{name}"')
    finally:
        conn.close()
    return with_database(server_url, name)


def drop_database(url: str) -> None:
    name = urlsplit(url).path.lstrip("/")
    if not name.startswith("tandem_bench_"):
        raise ValueError(f"refusing to drop {name!r}: not a benchmark database")
    conn = admin_connection(url)
    try:
        with conn.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        conn.close()


@contextmanager
def private_storage(label: str, repo: Path, server_url: str, keep: bool = False):
    """A temp copy of ``repo``'s conf/, a storage root and a database, selected through the environment (the
    ``TANDEM_*`` variables) for the run, the drivers' scratch folders inside it as in the tests' projects; yields
    (project folder, database URL). Removed after, unless ``keep``."""
    root = Path(tempfile.mkdtemp(prefix=f"tandem-{label}-"))
    url = create_database(server_url, label)
    shutil.copytree(repo / "conf", root / "conf")
    saved = {k: os.environ.get(k) for k in ("TANDEM_HOME", "TANDEM_CONF_DIR", "TANDEM_STORAGE_ROOT",
                                            "TANDEM_SCRATCH_DIR", "TANDEM_DATABASE_URL")}
    os.environ.update({"TANDEM_HOME": str(repo), "TANDEM_CONF_DIR": str(root / "conf"),
                       "TANDEM_STORAGE_ROOT": str(root / "data"), "TANDEM_SCRATCH_DIR": str(root / "scratch"),
                       "TANDEM_DATABASE_URL": url})
    try:
        yield root, url
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
        if not keep:
            drop_database(url)
            shutil.rmtree(root, ignore_errors=True)


def checkpoint(server_url: str) -> None:
    """Flush PostgreSQL's dirty pages so a run does not pay for the previous run's writes."""
    conn = admin_connection(server_url)
    try:
        with conn.cursor() as cursor:
            cursor.execute("CHECKPOINT")
    finally:
        conn.close()


def read_query(url: str, sql: str) -> pd.DataFrame:
    """Run ``sql`` and return the result as a DataFrame (through COPY … CSV: fast for 1M rows)."""
    import pyarrow.csv as pacsv

    buffer = io.BytesIO()
    conn = psycopg2.connect(url, options="-c TimeZone=UTC")
    try:
        with conn.cursor() as cursor:
            cursor.copy_expert(f"COPY ({sql}) TO STDOUT WITH (FORMAT csv, HEADER true)", buffer)
    finally:
        conn.close()
    buffer.seek(0)
    if buffer.getbuffer().nbytes == 0:
        return pd.DataFrame()
    return pacsv.read_csv(buffer, convert_options=pacsv.ConvertOptions(
        column_types={"bucket_start": "string", "symbol": "string", "granularity": "string"})).to_pandas()


def scalar(url: str, sql: str, params=None):
    conn = psycopg2.connect(url, options="-c TimeZone=UTC")
    try:
        with conn.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
            return row[0] if row else None
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------------
# Machine description


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:  # noqa: BLE001 - informational only
        return None


def git_commit(repo: Path) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except Exception:  # noqa: BLE001
        return None


def machine_info(spark=None, server_url: str | None = None) -> dict:
    info = {
        "hostname": platform.node(), "os": platform.platform(), "cpu_model": _cpu_model(),
        "cores": os.cpu_count(), "memory_gib": _memory_gib(), "python": platform.python_version(),
        "pyspark": _version("pyspark"), "deltalake": _version("deltalake"), "pyarrow": _version("pyarrow"),
        "pandas": _version("pandas"), "psycopg2": _version("psycopg2"),
    }
    if spark is not None:
        jvm = spark.sparkContext._jvm
        info["java"] = f"{jvm.System.getProperty('java.vendor')} {jvm.System.getProperty('java.version')}"
        info["spark"] = spark.version
        info["spark_master"] = spark.sparkContext.master
        info["spark_driver_memory"] = spark.conf.get("spark.driver.memory", "1g (default)")
        info["spark_shuffle_partitions"] = spark.conf.get("spark.sql.shuffle.partitions")
    if server_url:
        try:
            info["postgresql"] = scalar(with_database(server_url, "postgres"), "SHOW server_version")
        except Exception:  # noqa: BLE001
            info["postgresql"] = None
    return info


# ---------------------------------------------------------------------------------------------
# Other work on a shared machine: CPU used by processes that are not this benchmark


_TICKS = os.sysconf("SC_CLK_TCK")


def _stat(path: Path) -> tuple[str, float, float, int] | None:
    """A process's or thread's ``stat`` file: its name, the CPU seconds it used, those of the children it reaped and
    its parent's pid (``None`` when it has gone)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return (text[text.index("(") + 1:text.rindex(")")], (int(fields[11]) + int(fields[12])) / _TICKS,
            (int(fields[13]) + int(fields[14])) / _TICKS, int(fields[1]))


def process_cpu_s(pid: int) -> float:
    """The CPU seconds process ``pid`` has used itself (0 when it has gone)."""
    stat = _stat(Path(f"/proc/{pid}/stat"))
    return stat[1] if stat else 0.0


def _cpu_by_process() -> dict[int, tuple[str, float, float, int]]:
    """Per process: its name, the CPU seconds it used, those of the children it reaped, and its parent's pid."""
    return {int(entry.name): stat for entry in Path("/proc").iterdir()
            if entry.name.isdigit() and (stat := _stat(entry / "stat")) is not None}


def family(ours: set[int], parents: dict[int, int]) -> set[int]:
    """``ours`` and every process descending from one of them (``parents``: pid → parent pid), e.g. the Python
    workers a Spark JVM forks through its daemon, which neither it nor the daemon has reaped yet."""
    found = set(ours)
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    pending = list(ours)
    while pending:
        for child in children.get(pending.pop(), []):
            if child not in found:
                found.add(child)
                pending.append(child)
    return found


def _used_by(ours: set[int]) -> dict[str, float]:
    """CPU seconds used so far by the benchmark's processes (``ours`` and their descendants) and by PostgreSQL's,
    each with the children it reaped: a process that ends between two readings moves into its parent's figure."""
    processes = _cpu_by_process()
    mine = family(ours, {pid: stat[3] for pid, stat in processes.items()})
    used = {"benchmark": 0.0, "postgresql": 0.0}
    for pid, (comm, own, reaped, _parent) in processes.items():
        if pid in mine:
            used["benchmark"] += own + reaped
        elif comm.startswith("postgres"):
            used["postgresql"] += own + reaped
    return used


class ForeignCpu:
    """CPU seconds used by other processes than ``ours`` and their descendants (and PostgreSQL's, which serve us
    too): machine-wide busy time minus theirs, so short-lived processes that come and go during a run are counted."""

    def __init__(self, ours: set[int]) -> None:
        self.ours = ours
        self.busy = _busy_seconds()
        self.start = _used_by(ours)

    def seconds(self) -> float:
        busy = _busy_seconds() - self.busy
        now = _used_by(self.ours)
        return max(0.0, busy - sum(now[name] - self.start[name] for name in now))


def _cpu_by_thread(pids: set[int]) -> dict[tuple[int, int], tuple[str, float]]:
    """Per thread of ``pids``: ``process: thread`` (the thread's name without digits) and its CPU seconds."""
    found = {}
    for pid in pids:
        try:
            process = Path(f"/proc/{pid}/comm").read_text().strip()
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            if (stat := _stat(task / "stat")) is not None:
                found[(pid, int(task.name))] = (f"{process}: {stat[0].rstrip('0123456789#-_ ')}", stat[1])
    return found


def _busy_seconds() -> float:
    """CPU seconds all processes used since boot (/proc/stat: everything but idle and iowait)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    values = [int(v) for v in fields[:8]]
    return (sum(values) - values[3] - values[4]) / _TICKS


class CpuSplit:
    """CPU seconds a run used, split between this benchmark's processes (``ours``: Python and its JVM, and every
    process descending from them, with the children they reaped) and PostgreSQL's (every ``postgres`` process; a
    backend that ended meanwhile through the children the postmaster reaped). What the cores did for a run, as
    against its wall time."""

    def __init__(self, ours: set[int]) -> None:
        self.ours = ours
        self.start = _used_by(ours)
        self.threads_start = _cpu_by_thread(ours)

    def seconds(self) -> dict[str, float]:
        return {name: round(value - self.start[name], 1) for name, value in _used_by(self.ours).items()}

    def by_thread(self, least_s: float = 0.5) -> dict[str, float]:
        """The benchmark's own CPU seconds since the start by kind of thread (``java: Executor task launch worker``,
        ``java: GC Thread``, ``python: python``...: a thread's name without its number), busiest first; kinds that
        used less than ``least_s`` are summed as ``other``. Threads that ended during the run are not counted."""
        used: dict[str, float] = {}
        for key, (kind, cpu) in _cpu_by_thread(self.ours).items():
            before = self.threads_start.get(key)
            used[kind] = used.get(kind, 0.0) + cpu - (before[1] if before and before[0] == kind else 0.0)
        shown = {kind: round(cpu, 1) for kind, cpu in sorted(used.items(), key=lambda item: -item[1])
                 if cpu >= least_s}
        rest = sum(cpu for kind, cpu in used.items() if cpu < least_s)
        return {**shown, "other": round(rest, 1)} if rest else shown


def wait_for_quiet(ours: set[int], max_wait_s: float = 900, window_s: float = 5.0, cores: float = 0.15,
                   on_wait=None) -> float:
    """Wait (up to ``max_wait_s``) until other processes use < ``cores`` CPU over ``window_s``.

    Returns the seconds waited. The machine is shared; the waits and the foreign CPU of every run
    are recorded in the results so a disturbed run can be recognised.
    """
    started = time.time()
    while True:
        probe = ForeignCpu(ours)
        time.sleep(window_s)
        busy = probe.seconds() / window_s
        if busy < cores or time.time() - started > max_wait_s:
            return time.time() - started
        if on_wait:
            on_wait(busy)


@contextmanager
def pinned(cpus: set[int] | None):
    """Processes started inside run on ``cpus`` only (``None``: no change).

    Linux sets the affinity of the calling thread, and a child inherits the mask of the thread that
    forks it: the JVM of a ``spark-submit`` started here stays on ``cpus`` for its whole life.
    """
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return float(np.percentile(np.array(values, dtype=float), q))


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
