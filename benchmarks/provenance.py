"""Where every results file came from, and which ones are older than the code they measure.

Every file under ``benchmarks/results/`` (and each development model's ``training_log.md``) records what made it:
the commit, a digest of the settings and the command (``benchmarks/common.py``: ``write_results``,
``write_markdown``; a JSON file under ``"provenance"``, a Markdown file in its last line, a JSON-lines file in each
record), and, since issue 51, the project files the run used with a digest of each (the modules it imported, the
configs and assets it opened: ``benchmarks.common.used_files``; in a Markdown-only file, the comment before its last
line). A file that records its used files is *stale* when one of them is no longer what the run read (a changed
module it did not import changes nothing); a file recorded before that is stale when the code it may have measured
(its script and :data:`benchmarks.common.MEASURED_CODE`) changed in a commit after the recorded one, which needs the
history: in a shallow clone that check is an error, not a pass. A file that measures behaviour only
(:data:`BEHAVIOUR`: accuracies, orders, splits) stays current when the files that changed changed nothing the
project computes, as two behaviour records show (one made with the files its run used, one with today's, the same
numbers: ``benchmarks/behaviour.py``); a timing is stale on any change to the code it timed. A record of a past
decision (``research/``) may age if the documents quoting it name the commit it measured (:func:`dated_where_quoted`).

    python benchmarks/provenance.py            # the table: file, recorded commit, stale or not
    python benchmarks/provenance.py --commands # the commands that measure every stale quoted file again (a script)
    python benchmarks/provenance.py --backfill # once: files written before provenance was recorded get the
                                               # commit that wrote them (from git), marked "recorded: git"
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import FILES_COMMENT, MEASURED_CODE, RESULTS, file_digest, provenance_line  # noqa: E402

#: The Markdown provenance line (benchmarks.common.provenance_line) read back.
LINE = re.compile(r"^_Provenance: `(?P<command>[^`]*)` at commit (?P<commit>[0-9a-f]+|unknown)(?P<dirty> with "
                  r"uncommitted changes)? \((?P<how>[^)]*)\); config digest (?P<digest>[0-9a-f]{16}|not recorded)\._$")
#: Results files whose script is not benchmarks/<stem>.py.
SCRIPTS = {"full_size_cpu": "benchmarks/gpu_pipeline.py",
           "training_log": "benchmarks/training_log.py", "holdout": "benchmarks/research_scores.py",
           "selection": "benchmarks/research_scores.py", "probes": "benchmarks/research_scores.py",
           "LOG": "benchmarks/research_scores.py", "selection_issue38": "benchmarks/research_scores.py",
           "selection_issue46": "benchmarks/research_scores.py", "bf16_orders": "benchmarks/research_scores.py",
           "issue38": "benchmarks/research_scores.py", "issue46": "benchmarks/research_scores.py",
           "giant_cpu": "benchmarks/quick_cpu.py"}


def results_files() -> list[Path]:
    """Every results file: JSON, JSON lines and Markdown under benchmarks/results/, and the training logs."""
    files = [p for p in RESULTS.rglob("*") if p.suffix in (".json", ".jsonl", ".md")
             and "cache" not in p.parts and "behaviour" not in p.parts]  # (behaviour records vouch; not results)
    return sorted(files + sorted((ROOT / "assets").glob("*/training_log.md")))


def script_of(path: Path) -> str:
    """The script that writes ``path`` (relative to the checkout)."""
    if path.parent.name == "compare_methods_runs":
        return "benchmarks/compare_methods.py"
    return SCRIPTS.get(path.stem, f"benchmarks/{path.stem}.py")


def records(path: Path) -> list[Optional[dict[str, Any]]]:
    """The provenance a file records (a JSON-lines file: one per line; None where a record has none)."""
    text = path.read_text()
    if path.suffix == ".json":
        return [json.loads(text).get("provenance")]
    if path.suffix == ".jsonl":
        return [json.loads(line).get("provenance") for line in text.splitlines() if line.strip()]
    lines = text.rstrip("\n").splitlines() if text.strip() else [""]
    match = LINE.match(lines[-1])
    if match is None:
        return [None]
    record = {"command": match["command"], "commit": match["commit"], "dirty": bool(match["dirty"]),
              "recorded": "run" if match["how"] == "recorded when it ran" else "git",
              "config_digest": None if match["digest"] == "not recorded" else match["digest"]}
    files = FILES.match(lines[-2]) if len(lines) > 1 else None
    if files is not None:
        record["files"] = json.loads(files[1])
    elif path.with_suffix(".json").is_file():  # written with its JSON by one run: the files that run used
        sibling = json.loads(path.with_suffix(".json").read_text()).get("provenance") or {}
        same = all(sibling.get(key) == record[key] for key in ("command", "config_digest"))
        if same and str(sibling.get("commit", "")).startswith(record["commit"]) and sibling.get("files"):
            record["files"] = sibling["files"]
    return [record]


#: The used files' comment of a Markdown results file (benchmarks.common.FILES_COMMENT) read back.
FILES = re.compile("^" + re.escape(FILES_COMMENT).replace(re.escape("{}"), "(.*)") + "$")


def _git(*args: str) -> Optional[str]:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


#: Results files that live among the measured code (a development model's training log beside its weights): their
#: changes change nothing a benchmark measures.
NOT_CODE = (":(exclude)assets/*/training_log.md",)


def last_change(paths: list[str]) -> Optional[str]:
    """The newest commit that changed any of ``paths`` (results files among them, :data:`NOT_CODE`, aside)."""
    return _git("log", "-1", "--format=%H", "--", *paths, *NOT_CODE) or None


@dataclass
class Status:
    """One results file: the commit it records, what changed in what it measures (a file it used, or for a file
    without recorded files the last commit that changed the code), whether it is older, and the behaviour records
    that vouch for it when a file it used changed without changing what the project computes."""
    path: Path
    commit: Optional[str]
    recorded: Optional[str]
    changed_in: Optional[str]
    stale: Optional[bool]  # None: not known (no provenance, or the history does not hold the commit)
    vouched_by: Optional[str] = None  # "<then>.json = <now>.json" (benchmarks/results/behaviour/)


#: Results files whose quoted numbers measure behaviour only (accuracies, orders, chosen splits; never a time or a
#: memory size): when a file their run used changed, a pair of behaviour records showing the same numbers before and
#: after keeps them current (:func:`vouched_by`, benchmarks/behaviour.py).
BEHAVIOUR = {f"benchmarks/results/{name}" for name in (
    "compare_methods.json", "compare_methods.md", "compare_methods_deep.json", "compare_methods_deep.md",
    "fitness_vs_accuracy.json", "fitness_vs_accuracy.md", "pixel_baselines.json", "pixel_baselines.md",
    "sensitivity_vs_ablation.json", "sensitivity_vs_ablation.md", "gram_approximation.json",
    "gram_approximation.md", "research/bf16_orders.md", "search_convergence.json")}
#: The files of :data:`BEHAVIOUR` whose runs race no grid point (their split choices, if any, are made with
#: ``export.split_grid`` 0: tests/benchmarks/test_provenance.py reads their scripts): the grid's races in the behaviour
#: records (``benchmarks.behaviour.without_grid``) do not bear on them, and a change to those alone keeps them current.
NO_GRID = frozenset(BEHAVIOUR)
#: Where benchmarks/behaviour.py writes its records (one per state of the code).
BEHAVIOUR_RECORDS = ROOT / "benchmarks" / "results" / "behaviour"


def behaviour_records(folder: Optional[Path] = None) -> dict[str, dict[str, Any]]:
    """The behaviour records by file name: ``{"numbers": ..., "provenance": {"files": ...}}``."""
    folder = folder or BEHAVIOUR_RECORDS
    return {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))} if folder.is_dir() else {}


def vouched_by(files: dict[str, str], changed: list[str], root: Optional[Path] = None,
               records: Optional[dict[str, dict[str, Any]]] = None, grid: bool = True) -> Optional[str]:
    """Whether behaviour records show that the ``changed`` files (of a run that used ``files``) changed nothing the
    suite computes: a record made with the files the run used (the same digest for every file both used) and one made
    with today's files (every file it used as it is now), both having used every changed file, with the same numbers
    (``benchmarks.behaviour.same_behaviour``); without ``grid``, the grid points' races aside (:data:`NO_GRID`).
    Returns ``"<then> = <now>"`` (with ``" without the grid's races"`` where only those differ), or None."""
    from benchmarks.behaviour import same_behaviour, without_grid

    root = root or ROOT
    records = behaviour_records() if records is None else records
    then = [(name, r) for name, r in records.items()
            if all(r["provenance"]["files"].get(f, d) == d for f, d in files.items())
            and set(changed) <= set(r["provenance"]["files"])]
    now = [(name, r) for name, r in records.items()
           if all(file_digest(root / f) == d for f, d in r["provenance"]["files"].items())
           and set(changed) <= set(r["provenance"]["files"])]
    for name_now, record_now in now:
        for name_then, record_then in then:
            if record_then["suite"] != record_now["suite"]:
                continue
            if same_behaviour(record_then["numbers"], record_now["numbers"]):
                return f"{name_then} = {name_now}"
            if not grid and same_behaviour(without_grid(record_then["numbers"]), without_grid(record_now["numbers"])):
                return f"{name_then} = {name_now} without the grid's races"
    return None


def changed_files(found: list[dict[str, Any]], root: Optional[Path] = None) -> Optional[list[str]]:
    """The files the records say their runs used whose content is no longer what they read (missing ones
    included); None when a record does not list its files."""
    if not all(r.get("files") for r in found):
        return None
    root = root or ROOT
    return sorted({name for r in found for name, digest in r["files"].items() if file_digest(root / name) != digest})


def check_history() -> None:
    """Refuse to judge by commits in a clone without the history (``git clone --depth``): every commit before the
    clone's would look missing, and every file unknown rather than stale."""
    if _git("rev-parse", "--is-shallow-repository") == "true":
        raise RuntimeError("this clone is shallow: results files recorded before their runs recorded the files they "
                           "used are judged by the commits that changed the code, which a shallow clone does not "
                           "hold; run `git fetch --unshallow` first")


def measured_by(path: Path, script: str) -> list[str]:
    """What a results file describes: its script and the measured code, or, for a development model's
    ``training_log.md`` (the record of how the model beside it was trained, read from that run's events), the model's
    weights and its training log's script: the log is out of date when the model is, not when later code changes."""
    if path.name == "training_log.md" and path.parent.parent == ROOT / "assets":
        return [script, str((path.parent / "model.safetensors").relative_to(ROOT))]
    return [script, *MEASURED_CODE]


def status(path: Path) -> Status:
    """Whether ``path`` is older than the code it measures (its oldest record's commit is the one compared)."""
    found = records(path)
    if any(r is None or not r.get("commit") for r in found):
        return Status(path, None, None, None, None)
    changed_now = changed_files(found)
    if changed_now is not None:
        commit = sorted(r["commit"] for r in found)[0]
        if changed_now and str(path.relative_to(ROOT)) in BEHAVIOUR:
            grid = str(path.relative_to(ROOT)) not in NO_GRID
            vouchers = [vouched_by(r["files"], changed_files([r]) or [], grid=grid) for r in found]
            if all(vouchers):
                return Status(path, commit, found[0]["recorded"], changed_now[0], False, "; ".join(sorted(set(vouchers))))
        return Status(path, commit, found[0]["recorded"], changed_now[0] if changed_now else None, bool(changed_now))
    check_history()
    script = script_of(path)
    changed = last_change(measured_by(path, script))
    commits = {r["commit"] for r in found}
    full = [_git("rev-parse", "--verify", "--quiet", f"{c}^{{commit}}") for c in commits]
    if changed is None or None in full:
        return Status(path, sorted(commits)[0], found[0]["recorded"], changed, None)
    stale = any(subprocess.run(["git", "-C", str(ROOT), "merge-base", "--is-ancestor", changed, c]).returncode != 0
                for c in full)
    return Status(path, sorted(commits)[0], found[0]["recorded"], changed, stale)


#: Results files that record past decisions: they may age, quoted as what they are (:func:`dated_where_quoted`).
RECORDS = "benchmarks/results/research/"


def documents() -> list[Path]:
    """The documents that quote results: the README and docs/*.md."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def quoted_files() -> set[Path]:
    """The results files a document quotes: docs/claims.yaml's sources and the results blocks' files."""
    import yaml

    quoted = {ROOT / claim["source"] for claim in yaml.safe_load((ROOT / "docs" / "claims.yaml").read_text())}
    for doc in documents():
        quoted |= {ROOT / m for m in re.findall(r"<!-- results: (\S+) -->", doc.read_text())}
    return quoted


def sections_naming(text: str, names: set[str]) -> list[str]:
    """The sections of a Markdown document (from one heading to the next) that name any of ``names``."""
    parts = re.split(r"(?m)^(?=#{1,6} )", text)
    return [part for part in parts if any(name in part for name in names)]


def dated_where_quoted(path: Path, commit: str, documents: list[Path]) -> bool:
    """Whether a record of a past decision (a file under :data:`RECORDS`) is quoted as what it is: every document
    that names it says, in each section naming it, the commit it was measured at (``commit <12 hex digits>``), and
    at least one does."""
    name = str(path.relative_to(ROOT))
    if not name.startswith(RECORDS):
        return False
    stamp = f"commit {commit[:12]}"
    # the record as a document names it: itself, or its twin of the other format (one run writes both; a claim's
    # source is the JSON, the prose links the Markdown)
    names = {str(Path(name).with_suffix(suffix)).removeprefix("benchmarks/results/") for suffix in (".json", ".md")}
    names.add(name.removeprefix("benchmarks/results/"))
    quoting = [sections_naming(doc.read_text(), names) for doc in documents]
    quoting = [sections for sections in quoting if sections]
    return bool(quoting) and all(stamp in section for sections in quoting for section in sections)


def _command_in(text: str, script: str) -> str:
    """The command a Markdown file names for itself (its first `python ...` code span), else the script's name."""
    match = re.search(r"`((?:OMP_NUM_THREADS=\d+ )?python (?:" + re.escape(script) + r"|prune\.py)[^`]*)`", text)
    return match[1] if match else f"python {script} (its arguments were not recorded)"


def backfill(path: Path) -> bool:
    """Give a file written before provenance was recorded the commit that last wrote it (``recorded: git``);
    returns whether it changed. Its values are left as they are."""
    if all(r is not None for r in records(path)):
        return False
    commit = _git("log", "-1", "--format=%H", "--", str(path.relative_to(ROOT)))
    if not commit:
        return False
    script = script_of(path)
    sibling = path.with_suffix(".md")
    command = _command_in(sibling.read_text() if sibling.is_file() else path.read_text(), script)
    record = {"commit": commit, "dirty": False, "config_digest": None, "command": command, "recorded": "git"}
    text = path.read_text()
    if path.suffix == ".json":
        data = json.loads(text)
        data["provenance"] = record
        second = text.split("\n", 2)[1] if text.startswith("{\n") else ""
        indent = (len(second) - len(second.lstrip(" "))) or None  # as the file was written
        path.write_text(json.dumps(data, indent=indent) + ("\n" if text.endswith("\n") else ""))
    elif path.suffix == ".jsonl":
        lines = [json.loads(line) for line in text.splitlines() if line.strip()]
        path.write_text("".join(json.dumps({**r, "provenance": r.get("provenance") or record}) + "\n" for r in lines))
    else:
        path.write_text(text.rstrip("\n") + "\n\n" + provenance_line(record) + "\n")
    return True


def commands_for(paths: list[Path]) -> list[tuple[str, list[Path]]]:
    """The commands that wrote ``paths`` (as their provenance records them), each once and in the order first met,
    with the files each wrote: running them again measures those files again."""
    found: dict[str, list[Path]] = {}
    for path in paths:
        for record in records(path):
            if record is not None:
                written = found.setdefault(record["command"], [])
                if path not in written:
                    written.append(path)
    return list(found.items())


def to_measure_again() -> list[Path]:
    """The quoted results files older than their code (what the test suite fails for), records of past decisions
    quoted with their commit left out."""
    quoted, docs = quoted_files(), documents()
    return [path for path in results_files() if path in quoted and (s := status(path)).stale
            and not dated_where_quoted(path, s.commit, docs)]


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backfill", action="store_true", help="record the writing commit (from git) in every "
                        "results file without provenance, then show the table")
    parser.add_argument("--commands", action="store_true", help="print, as a shell script, the commands that measure "
                        "every stale quoted results file again (each once; a comment names the files it writes)")
    args = parser.parse_args(argv)
    if args.commands:
        print("# The quoted results files older than their code, measured again (from the repository's root). First\n"
              "# `python benchmarks/behaviour.py` (a change that computes the same numbers keeps the behaviour files\n"
              "# current: they leave this list); a --merge command merges earlier runs, measure those first. Timings\n"
              "# compare only when run one or two at a time on an otherwise idle machine (docs/development.md).")
        for command, paths in commands_for(to_measure_again()):
            print(f"# for {', '.join(str(p.relative_to(ROOT)) for p in paths)}\n{command}")
        return 0
    if args.backfill:
        for path in results_files():
            if backfill(path):
                print(f"backfilled {path.relative_to(ROOT)}")
    quoted, docs = quoted_files(), documents()
    print("| file | recorded commit | how | stale | quoted |\n|---|---|---|---|---|")
    for path in results_files():
        s = status(path)
        shown = "n/a" if s.stale is None else ("**stale**" if s.stale else "current") + \
            (f" (its code changed; behaviour records {s.vouched_by})" if s.vouched_by else "")
        if s.stale and path in quoted and dated_where_quoted(path, s.commit, docs):
            shown += " (a record of a past decision, quoted with its commit)"
        print(f"| {path.relative_to(ROOT)} | {(s.commit or 'none')[:12]} | {s.recorded or '-'} | {shown} | "
              f"{'yes' if path in quoted else ''} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
