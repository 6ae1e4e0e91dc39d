"""Measure quoted results again, in one go: every quoted timing, or the files a regression names.

    python benchmarks/remeasure.py                  # every timing README.md and docs/ quote (an issue about speed,
                                                    # a release), then the documents' timing stamps
    python benchmarks/remeasure.py FILE [FILE ...]  # the commands that wrote these files (what the regression check
                                                    # names after a deliberate change of behaviour)
    python benchmarks/remeasure.py --dry-run ...    # print the commands as a shell script, run nothing

Each command runs once, in the order first met, one after the other (timings compare only when taken on an
otherwise idle machine), from the repository's root, as its results file recorded it; a merged file's input runs
are measured before the merge. After a run the documents' timing stamps are written from the new files
(``python benchmarks/provenance.py --stamps``); the numbers the documents quote are checked by
``tests/test_claims.py``, which then names every sentence to update.
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.provenance import (  # noqa: E402
    RECORDS, commands_for, kinds_of, quoted_files, results_files, with_inputs, write_stamps,
)


def quoted_timings() -> list[Path]:
    """Every quoted results file that holds a timing (records of past decisions aside: they are never re-run)."""
    quoted = quoted_files()
    return [p for p in results_files() if p in quoted and "timing" in kinds_of(p)
            and not str(p.relative_to(ROOT)).startswith(RECORDS)]


def run(command: str) -> int:
    """A recorded command (``VAR=value ... python script ...``) run from the repository's root."""
    words = shlex.split(command)
    env = dict(os.environ)
    while words and "=" in words[0] and not words[0].startswith("-"):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    if words and words[0] == "python":
        words[0] = sys.executable
    return subprocess.run(words, cwd=ROOT, env=env).returncode


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help="results files to measure again (default: every quoted "
                        "timing)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.files if not (ROOT / p).is_file()]
    if missing:
        print(f"error: no such results file: {', '.join(missing)}; name files under benchmarks/results/",
              file=sys.stderr)
        return 2
    paths = with_inputs([(ROOT / p).resolve() for p in args.files] if args.files else quoted_timings())
    commands = commands_for(paths)
    if not commands:
        print("nothing to measure: the files record no command")
        return 0
    print("# measured again, one after the other, from the repository's root (benchmarks/remeasure.py)")
    for command, written in commands:
        print(f"# for {', '.join(str(p.relative_to(ROOT)) for p in written)}\n{command}", flush=True)
        if args.dry_run:
            continue
        code = run(command)
        if code != 0:
            print(f"error: `{command}` exited with {code}; the files after it were not measured again",
                  file=sys.stderr)
            return code
    if not args.dry_run:
        for document in write_stamps():
            print(f"# timing stamps written: {document.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
