#!/usr/bin/env python
"""The supervision trigger's read of a plan's landing folders, each poll: CPU per read, remembered against fresh.

Every second the supervision DAG's trigger (in Airflow's triggerer) reads the modification times of every input
file of the plan's landing folders, to tell input that waits for a stalled query. The soak found the triggerer
using a fifth of a core for it on a 2-core machine. This measures, over ``--folders`` folders of ``--files``
files each (one new file per folder between two polls, as a steady producer adds them):

- ``previous``: the implementation before ``tandem.layout.InputMtimes`` (a sorted list of paths, one ``stat``
  each), kept here as the baseline;
- ``fresh``: a new ``InputMtimes`` each poll (what a one-shot reader, ``tandem status`` or landing retention, pays);
- ``remembered``: one ``InputMtimes`` across polls (the trigger's), which stats only the files it has not seen.

    python bench/landing_poll.py [--folders 14] [--files 3000] [--polls 30]

Results: ``bench/results/landing_poll.json`` (CPU milliseconds per poll, ratios against ``previous``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT / "include"))
sys.path.insert(0, str(BENCH))

import _common as C  # noqa: E402
from rich.console import Console  # noqa: E402

from tandem.layout import InputMtimes, input_files  # noqa: E402

RESULTS = BENCH / "results" / "landing_poll.json"


def previous_read(directory: Path) -> dict[Path, float]:
    """``tandem.layout.input_mtimes`` as it was: every input file's path, sorted, then one ``stat`` each."""
    mtimes = {}
    for path in input_files(directory):
        try:
            mtimes[path] = path.stat().st_mtime
        except FileNotFoundError:
            continue
    return mtimes


def cpu_ms_per_poll(folders: list[Path], read, polls: int, counter: list[int]) -> float:
    """Median CPU milliseconds of one poll (``read`` of every folder), a new file landing in each between polls."""
    times = []
    for _ in range(polls):
        for folder in folders:
            counter[0] += 1
            (folder / f"events-{counter[0]:09d}.jsonl").write_text("{}\n")
        started = time.process_time()
        for folder in folders:
            read(folder)
        times.append((time.process_time() - started) * 1000)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--folders", type=int, default=14, help="landing folders (the soak's three plans read 14)")
    parser.add_argument("--files", type=int, default=3000, help="input files in each at the start")
    parser.add_argument("--polls", type=int, default=30)
    args = parser.parse_args()
    console = Console(stderr=True)
    root = Path(tempfile.mkdtemp(prefix="tandem-landing-poll-"))
    try:
        folders = [root / "landing" / "stream" / str(p) for p in range(args.folders)]
        counter = [0]
        with console.status(f"writing {args.folders} × {args.files} files"):
            for folder in folders:
                folder.mkdir(parents=True)
                for _ in range(args.files):
                    counter[0] += 1
                    (folder / f"events-{counter[0]:09d}.jsonl").write_text("{}\n")
        remembered = InputMtimes()
        readers = {"previous": previous_read, "fresh": lambda folder: InputMtimes().of(folder),
                   "remembered": remembered.of}
        for folder in folders:
            remembered.of(folder)  # the trigger's first poll
        figures = {}
        for name, read in readers.items():
            with console.status(f"{name}: {args.polls} polls"):
                figures[name] = cpu_ms_per_poll(folders, read, args.polls, counter)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results = {"started_at": C.now_iso(), "git_commit": C.git_commit(ROOT), "machine": C.machine_info(),
               "folders": args.folders, "files_per_folder": args.files, "polls": args.polls,
               "cpu_ms_per_poll": {name: round(ms, 2) for name, ms in figures.items()},
               "ratio_to_previous": {name: round(ms / figures["previous"], 3) for name, ms in figures.items()}}
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    console.print(f"CPU per poll of {args.folders} folders × ~{args.files} files: "
                  + ", ".join(f"{name} {ms:.1f} ms" for name, ms in figures.items())
                  + f"; remembered / previous = {results['ratio_to_previous']['remembered']}; wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
