"""Where every results file came from, what kind of number it holds, and how a document dates a timing.

The rule (docs/development.md, "Numbers"): a number the project *computes* (an order, a split, an accuracy) is
guarded by the regression check (``benchmarks/regression.py``); a *timing* (seconds, memory, throughput) is a dated
snapshot, quoted with the commit and machine it was measured on (:func:`stamp`) and measured again on purpose
(``benchmarks/remeasure.py``), never because code changed.

Every file under ``benchmarks/results/`` (and each development model's ``training_log.md``) records what made it
(``benchmarks/common.py``: ``write_results``, ``write_markdown``; a JSON file under ``"provenance"``, a Markdown file
in its last line, a JSON-lines file in each record): the commit, a digest of the settings, the command, the machine,
the regression baseline it was made under, and the project files the run used (information: nothing is judged by
them but what the regression check names when the numbers move).

    python benchmarks/provenance.py            # the table: file, kinds, commit, date, machine, quoted
    python benchmarks/provenance.py --stamps   # write every timing stamp in README.md and docs/ from its file
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import FILES_COMMENT, RESULTS  # noqa: E402

#: The Markdown provenance line (benchmarks.common.provenance_line) read back.
LINE = re.compile(r"^_Provenance: `(?P<command>[^`]*)` at commit (?P<commit>[0-9a-f]+|unknown)(?P<dirty> with "
                  r"uncommitted changes)? \((?P<how>[^)]*)\); config digest (?P<digest>[0-9a-f]{16}|not recorded)"
                  r"(?:; (?P<date>\d{4}-\d\d-\d\d[ \d:]*) on (?P<machine>[^;]+?))?(?:; baseline (?P<baseline>\w+))?\._$")
#: The used files' comment of a Markdown results file (benchmarks.common.FILES_COMMENT) read back.
FILES = re.compile("^" + re.escape(FILES_COMMENT).replace(re.escape("{}"), "(.*)") + "$")

#: What each script's results hold: ``accuracy`` (what the project computes: orders, splits, accuracies, counts;
#: guarded by the regression check) and/or ``timing`` (seconds, memory, throughput, speed-ups: dated snapshots), or
#: ``record`` (how a development model was trained: true of the weights beside it, whatever the code does later).
KINDS: dict[str, frozenset[str]] = {script: frozenset(kinds.split("+")) for script, kinds in {
    "benchmarks/compare_methods.py": "accuracy",
    "benchmarks/compare_methods_deep.py": "accuracy",
    "benchmarks/correction_cost.py": "timing",
    "benchmarks/correction_default.py": "accuracy+timing",
    "benchmarks/correction_finetune.py": "accuracy+timing",
    "benchmarks/correction_selection.py": "accuracy+timing",
    "benchmarks/demo_prune_report.py": "accuracy+timing",
    "benchmarks/finetune_recipe.py": "accuracy+timing",
    "benchmarks/fitness_vs_accuracy.py": "accuracy",
    "benchmarks/gn_cost.py": "timing",
    "benchmarks/gpu_pipeline.py": "timing",
    "benchmarks/gram_approximation.py": "accuracy",
    "benchmarks/greedy_cost.py": "accuracy+timing",
    "benchmarks/latency_budget.py": "timing",
    "benchmarks/later_budgets.py": "accuracy",
    "benchmarks/pixel_baselines.py": "accuracy",
    "benchmarks/quick_cpu.py": "timing",
    "benchmarks/readme_walkthrough.py": "accuracy+timing",
    "benchmarks/research_scores.py": "accuracy",
    "benchmarks/search_convergence.py": "accuracy+timing",
    "benchmarks/search_speed.py": "timing",
    "benchmarks/sensitivity_vs_ablation.py": "accuracy",
    "benchmarks/split_choice.py": "accuracy+timing",
    "benchmarks/stage_floors.py": "timing",
    "benchmarks/throughput.py": "timing",
    "benchmarks/training_log.py": "record",
}.items()}
#: Results files that record past decisions (the selections of defaults): never measured again, whatever changes;
#: their provenance names the commit they measured.
RECORDS = "benchmarks/results/research/"


def results_files() -> list[Path]:
    """Every results file: JSON, JSON lines and Markdown under benchmarks/results/, and the training logs."""
    files = [p for p in RESULTS.rglob("*") if p.suffix in (".json", ".jsonl", ".md") and "cache" not in p.parts]
    return sorted(files + sorted((ROOT / "assets").glob("*/training_log.md")))


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
    if match["date"]:
        record.update(date=match["date"].strip(), machine_text=match["machine"])
    if match["baseline"]:
        record["baseline"] = match["baseline"]
    files = FILES.match(lines[-2]) if len(lines) > 1 else None
    sibling = path.with_suffix(".json")
    if files is not None:
        record["files"] = json.loads(files[1])
    elif sibling.is_file():  # written with its JSON by one run: what that run recorded
        twin = json.loads(sibling.read_text()).get("provenance") or {}
        if all(twin.get(key) == record[key] for key in ("command", "config_digest")) and \
                str(twin.get("commit", "")).startswith(record["commit"]):
            record.update({k: v for k, v in twin.items() if k in ("files", "machine", "date", "baseline")})
    return [record]


def script_of(path: Path) -> Optional[str]:
    """The script that wrote ``path``: the first ``benchmarks/*.py`` of its recorded command."""
    for record in records(path):
        match = re.search(r"benchmarks/\w+\.py", (record or {}).get("command", ""))
        if match:
            return match[0]
    return None


def kinds_of(path: Path) -> frozenset[str]:
    """``accuracy`` and/or ``timing`` (:data:`KINDS`, by the script that wrote the file)."""
    return KINDS.get(script_of(path) or "", frozenset())


def _report_machine(path: Path) -> Optional[dict[str, Any]]:
    if path.suffix != ".json":
        path = path.with_suffix(".json")
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return data.get("provenance", {}).get("machine") or data.get("machine")


def machine_of(path: Path) -> Optional[str]:
    """The machine a file was measured on, in words (from its provenance, else from the report's ``machine``)."""
    record = records(path)[0] or {}
    if record.get("machine_text"):
        return record["machine_text"]
    return describe_machine(record.get("machine") or _report_machine(path))


def describe_machine(machine: Optional[dict[str, Any]]) -> Optional[str]:
    """``x86_64, 2 cores, 1 torch thread, load 2.0`` from :func:`benchmarks.common.machine_info`'s record."""
    if not machine:
        return None
    parts = [str(machine.get("cpu") or "cpu")]
    if machine.get("cpu_count"):
        parts.append(f"{machine['cpu_count']} cores")
    if machine.get("torch_threads"):
        parts.append(f"{machine['torch_threads']} torch thread{'s' if machine['torch_threads'] != 1 else ''}")
    load = machine.get("load_average_1m_at_end")
    if load is not None:
        parts.append(f"load {load:.1f}")
    if machine.get("device") and machine["device"] != "cpu":
        parts.insert(0, str(machine["device"]))
    return ", ".join(parts)


def date_of(path: Path) -> Optional[str]:
    record = records(path)[0] or {}
    date = record.get("date") or (_report_machine(path) or {}).get("date")
    return date.split(" ")[0] if date else None


def stamp(path: Path) -> str:
    """How a document dates a timing quoted from ``path``: ``measured <date> at commit <12 hex> on
    <machine>``, rendered from the file (:func:`write_stamps`), so that it cannot drift from it."""
    record = records(path)[0] or {}
    machine = machine_of(path) or "a machine not recorded"
    return f"measured {date_of(path) or 'on a date not recorded'} at commit {record.get('commit', '?')[:12]} " \
           f"on {machine}"


#: A timing stamp in a document: ``_[<stamp>](<link to the results file>)_`` (``_[measured](<link>)_`` is one to fill).
STAMP = re.compile(r"_\[(?P<text>measured[^\]]*)\]\((?P<link>[^)\s]+)\)_")


#: Where docs/ links results files: the site's pages of benchmarks/results/ (docs/hooks/results_pages.py).
DOCS_RESULTS = ROOT / "docs" / "results"


def stamp_markdown(path: Path, document: Path) -> str:
    """The stamp of ``path`` as ``document`` writes it: a link to the file, relative to the document (from docs/,
    ``results/...``, the site's page of it)."""
    import os

    path = path.resolve()
    if document.resolve().parent == DOCS_RESULTS.parent and path.is_relative_to(RESULTS):
        link = "results/" + str(path.relative_to(RESULTS))
    else:
        link = os.path.relpath(path, document.parent)
    return f"_[{stamp(path)}]({link})_"


def linked_file(link: str, document: Path) -> Path:
    """The results file a document's link names (``results/...`` from docs/ is benchmarks/results/...)."""
    path = (document.parent / link).resolve()
    return RESULTS / path.relative_to(DOCS_RESULTS) if path.is_relative_to(DOCS_RESULTS) else path


def stamps_in(document: Path) -> list[tuple[re.Match, Path]]:
    """Every stamp of a document with the results file it links to."""
    text = document.read_text()
    return [(m, linked_file(m["link"], document)) for m in STAMP.finditer(text)]


def write_stamps(documents_: Optional[list[Path]] = None) -> list[Path]:
    """Render every stamp of the documents from the file it links to; returns the documents changed."""
    changed = []
    for document in documents_ or documents():
        text = document.read_text()
        new = STAMP.sub(lambda m: stamp_markdown(linked_file(m["link"], document), document), text)
        if new != text:
            document.write_text(new)
            changed.append(document)
    return changed


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


def with_inputs(paths: list[Path]) -> list[Path]:
    """``paths`` with, before each merged file, the runs its ``--merge`` command read (measured first)."""
    out: list[Path] = []
    for path in paths:
        for record in records(path):
            words = shlex.split((record or {}).get("command", ""))
            if "--merge" in words:
                start = words.index("--merge") + 1
                end = next((i for i in range(start, len(words)) if words[i].startswith("-")), len(words))
                inputs = [ROOT / w for w in words[start:end]]
                out += [p for p in with_inputs([p for p in inputs if p.is_file()]) if p not in out]
        if path not in out:
            out.append(path)
    return out


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stamps", action="store_true", help="write every timing stamp in README.md and docs/ "
                        "from the results file it links to")
    args = parser.parse_args(argv)
    if args.stamps:
        for document in write_stamps():
            print(f"stamps written: {document.relative_to(ROOT)}")
        return 0
    quoted = quoted_files()
    print("| file | kinds | commit | date | machine | baseline | quoted |\n|---|---|---|---|---|---|---|")
    for path in results_files():
        record = records(path)[0] or {}
        print(f"| {path.relative_to(ROOT)} | {'+'.join(sorted(kinds_of(path))) or '?'} | "
              f"{(record.get('commit') or 'none')[:12]} | {date_of(path) or '-'} | {machine_of(path) or '-'} | "
              f"{record.get('baseline') or '-'} | {'yes' if path in quoted else ''} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
