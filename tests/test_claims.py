"""Every measured number the README and docs/ publish is the number a committed script wrote into benchmarks/results/.

Three kinds of claims:

- ``docs/claims.yaml`` entries with ``values``: a text in a document, formatted from values of a results JSON file
  (``{name:.2f}`` with ``values: {name: dotted.key.path}``, optionally ``scale: {name: 100}``); the formatted text must
  appear in the document verbatim. A value is one key path (see ``lookup``: ``[key=value]`` picks a list item,
  ``[key]`` is a key that holds dots, ``#`` counts a list's items, ``#[key=value]`` those whose key equals value), or
  two joined by `` - `` or `` / `` (the right one may be a number) where the document quotes a difference or a ratio
  of recorded values;
- ``docs/claims.yaml`` entries with ``numbers``: only for a results file that no JSON of the same name accompanies
  (a Markdown table aggregated from JSON lines, a benchmark that writes Markdown only): numbers a document quotes from
  it; each must appear verbatim in both, and in the document within ``within`` characters after ``near`` (the
  sentence that makes the claim);
- blocks ``<!-- results: benchmarks/results/X.md -->`` ... ``<!-- /results -->`` in a document: every non-empty line
  between the markers must be a line of that results file (tables are copied, never retyped).

Editing a published number (or a results file) without the other makes this test fail.
"""
import copy
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = ROOT / "docs" / "claims.yaml"
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"<!-- results: (?P<source>\S+) -->\n(?P<body>.*?)<!-- /results -->", re.S)
OPERATION = re.compile(r"(?P<left>.+?) (?P<op>[-/]) (?P<right>.+)")


def _steps(path: str) -> list[str]:
    return re.findall(r"#?\[[^\]]*\]|[^.]+", path)  # a [...] step may hold dots


def _step(data, step: str):
    count = re.fullmatch(r"#(?:\[(\w+)=(.+)\])?", step)
    if count:
        return len([item for item in data if count[1] is None or str(item[count[1]]) == count[2]])
    match = re.fullmatch(r"\[(\w+)=(.+)\]", step)
    if match:
        return next(item for item in data if str(item[match[1]]) == match[2])
    key = re.fullmatch(r"\[(.+)\]", step)
    if key:
        return data[key[1]]
    return data[int(step)] if isinstance(data, list) else data[step]


def lookup(data, path: str):
    """``a.b.0.c`` in nested dicts and lists; a ``[key=value]`` step picks the list item whose key equals value, a
    ``[key]`` step is a dict key that may hold dots, ``#`` is the number of a list's items and ``#[key=value]`` the
    number of those whose key equals value."""
    for step in _steps(path):
        data = _step(data, step)
    return data


def value(data, spec: str):
    """A key path, or ``path - path`` / ``path / path`` (the right operand may be a number)."""
    operation = OPERATION.fullmatch(spec)
    if not operation:
        return lookup(data, spec)
    left = lookup(data, operation["left"])
    try:
        right = float(operation["right"])
    except ValueError:
        right = lookup(data, operation["right"])
    return left - right if operation["op"] == "-" else left / right


def formatted(claim, source=None) -> str:
    """The text of a ``values`` claim, formatted from its results file (or from ``source``, that file's data)."""
    if source is None:
        source = json.loads((ROOT / claim["source"]).read_text())
    scale = claim.get("scale", {})
    values = {name: value(source, spec) * scale.get(name, 1) for name, spec in claim["values"].items()}
    return claim["text"].format(**values)


def claims():
    return yaml.safe_load(REGISTRY.read_text())


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("claim", claims(), ids=lambda c: f"{c['doc']}: {c.get('text') or c.get('near')}"[:60])
def test_registered_claim_matches_its_results_file(claim):
    document = _flat((ROOT / claim["doc"]).read_text())
    if "numbers" in claim:
        sibling = Path(claim["source"]).with_suffix(".json")
        assert not (ROOT / sibling).exists(), \
            f"{claim['source']} has {sibling} beside it: register a `values` claim naming the fields (the numbers: " \
            f"{claim['numbers']})"
        source = _flat((ROOT / claim["source"]).read_text())
        start = document.find(_flat(claim["near"]))
        assert start >= 0, f"{claim['doc']} no longer says {claim['near']!r}"
        sentence = document[start:start + claim.get("within", 400)]
        for number in claim["numbers"]:
            assert re.search(rf"(?<![\d.]){re.escape(number)}(?![\d])", source), f"{number} is not in {claim['source']}"
            assert re.search(rf"(?<![\d.]){re.escape(number)}(?![\d])", sentence), \
                f"{claim['doc']}: {number} ({claim['source']}) is not in the claim {claim['near']!r} ..."
        return
    text = formatted(claim)
    assert _flat(text) in document, f"{claim['doc']} does not say {text!r} ({claim['source']})"


def test_a_changed_result_fails_its_claim():
    """One digit more in a results file's value, and the document no longer says what the claim formats."""
    claim = next(c for c in claims() if c["doc"] == "docs/development_models.md" and c["text"].startswith("own head"))
    document = _flat((ROOT / claim["doc"]).read_text())
    source = json.loads((ROOT / claim["source"]).read_text())
    assert _flat(formatted(claim, source)) in document
    path = claim["values"]["head"]
    *parent, last = _steps(path)
    changed = copy.deepcopy(source)
    container = changed
    for step in parent:
        container = _step(container, step)
    decimals = int(re.search(r"\{head:\.(\d+)f\}", claim["text"])[1])
    container[last] += 10 ** -decimals / claim.get("scale", {}).get("head", 1)  # +1 in the last digit shown
    assert lookup(changed, path) != lookup(source, path)
    assert _flat(formatted(claim, changed)) not in document


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.name)
def test_result_blocks_are_copies_of_their_results_files(document):
    for block in BLOCK.finditer(document.read_text()):
        source = ROOT / block["source"]
        assert source.exists(), f"{document.name}: {block['source']} does not exist"
        lines = set(source.read_text().splitlines())
        for line in block["body"].splitlines():
            assert not line.strip() or line in lines, f"{document.name}: {line!r} is not in {block['source']}"


def test_the_registry_names_existing_documents_and_results():
    for claim in claims():
        assert (ROOT / claim["doc"]).exists() and (ROOT / claim["source"]).exists(), claim
        if "values" in claim:
            assert set(claim["values"]) <= set(re.findall(r"\{(\w+)", claim["text"])), claim
        else:
            assert claim["numbers"] and claim["near"], claim


def _timing_claims():
    """Claims quoted from a results file that holds timings (benchmarks/provenance.py's KINDS)."""
    from benchmarks.provenance import kinds_of

    return [c for c in claims() if "timing" in kinds_of(ROOT / c["source"])]


def _blocks(text: str) -> list[str]:
    return re.split(r"\n\s*\n", text)


def _claim_block(claim) -> int:
    """The index of the document's block (paragraph, list, table) that holds the claim."""
    quoted = _flat(claim["near"] if "numbers" in claim else formatted(claim))
    blocks = [_flat(b) for b in _blocks((ROOT / claim["doc"]).read_text())]
    found = [i for i, block in enumerate(blocks) if quoted in block]
    assert found, f"{claim['doc']}: the claim {quoted[:60]!r} is not inside one paragraph"
    return found[0]


def _twins(path: Path) -> set:
    return {path.with_suffix(".json").resolve(), path.with_suffix(".md").resolve()}


@pytest.mark.parametrize("claim", _timing_claims(), ids=lambda c: f"{c['doc']}: {c.get('text') or c.get('near')}"[:60])
def test_a_quoted_timing_is_dated_by_its_file(claim):
    """A timing is a dated snapshot: the paragraph that quotes it (or the one right after a table) carries the
    stamp of its results file, the date, commit and machine it was measured on (``python
    benchmarks/provenance.py --stamps`` writes them)."""
    import sys

    sys.path.insert(0, str(ROOT))
    from benchmarks.provenance import stamps_in

    document = ROOT / claim["doc"]
    index = _claim_block(claim)
    blocks = _blocks(document.read_text())
    near = "\n\n".join(blocks[index:index + 2])
    linked = [path for match, path in stamps_in(document) if match[0] in near]
    assert _twins(ROOT / claim["source"]) & set(linked), \
        f"{claim['doc']}: the paragraph quoting {claim['source']} has no stamp of it; add " \
        f"`_[measured](relative/path/to/{Path(claim['source']).name})_` and run python benchmarks/provenance.py --stamps"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.name)
def test_every_stamp_is_rendered_from_its_file(document):
    """A stamp says what its results file records, so it cannot drift from it."""
    import sys

    sys.path.insert(0, str(ROOT))
    from benchmarks.provenance import stamp, stamps_in

    for match, path in stamps_in(document):
        assert path.is_file(), f"{document.name}: a stamp links to {match['link']}, which does not exist"
        assert match["text"] == stamp(path), \
            f"{document.name}: {match['text']!r} is not {stamp(path)!r}: run python benchmarks/provenance.py --stamps"


def test_a_stamp_that_drifts_from_its_file_is_caught_and_written_again(tmp_path):
    import sys

    sys.path.insert(0, str(ROOT))
    from benchmarks.provenance import stamp, stamps_in, write_stamps

    source = ROOT / "benchmarks" / "results" / "gn_cost.md"
    document = tmp_path / "doc.md"
    document.write_text(f"It took 3 s. _[measured 1999-01-01 at commit 000000000000 on a toaster]({source})_\n")
    (match, path), = stamps_in(document)
    assert path == source and match["text"] != stamp(source)
    assert write_stamps([document]) == [document]
    (match, path), = stamps_in(document)
    assert match["text"] == stamp(source) and "commit " + stamp(source).split("commit ")[1][:12] in match["text"]
    assert write_stamps([document]) == []  # nothing left to write
