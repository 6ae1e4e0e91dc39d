"""Every measured number the README and docs/ publish is the number a committed script wrote into benchmarks/results/.

Three kinds of claims:

- ``docs/claims.yaml`` entries with ``values``: a text in a document, formatted from values of a results JSON file
  (``{name:.2f}`` with ``values: {name: dotted.key.path}``); the formatted text must appear in the document verbatim;
- ``docs/claims.yaml`` entries with ``numbers``: numbers a document quotes from a results file (a Markdown table an
  aggregate was printed into); each must appear verbatim in both, and in the document within ``near`` (the sentence
  that makes the claim);
- blocks ``<!-- results: benchmarks/results/X.md -->`` ... ``<!-- /results -->`` in a document: every non-empty line
  between the markers must be a line of that results file (tables are copied, never retyped).

Editing a published number (or a results file) without the other makes this test fail.
"""
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = ROOT / "docs" / "claims.yaml"
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"<!-- results: (?P<source>\S+) -->\n(?P<body>.*?)<!-- /results -->", re.S)


def lookup(data, path: str):
    """``a.b.0.c`` in nested dicts and lists; a ``[key=value]`` step picks the list item whose key equals value."""
    for step in re.findall(r"\[[^\]]*\]|[^.]+", path):  # a [key=value] step may hold dots
        match = re.fullmatch(r"\[(\w+)=(.+)\]", step)
        if match:
            data = next(item for item in data if str(item[match[1]]) == match[2])
        else:
            data = data[int(step)] if isinstance(data, list) else data[step]
    return data


def claims():
    return yaml.safe_load(REGISTRY.read_text())


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("claim", claims(), ids=lambda c: f"{c['doc']}: {c.get('text') or c.get('near')}"[:60])
def test_registered_claim_matches_its_results_file(claim):
    document = _flat((ROOT / claim["doc"]).read_text())
    if "numbers" in claim:
        source = _flat((ROOT / claim["source"]).read_text())
        start = document.find(_flat(claim["near"]))
        assert start >= 0, f"{claim['doc']} no longer says {claim['near']!r}"
        sentence = document[start:start + claim.get("within", 400)]
        for number in claim["numbers"]:
            assert re.search(rf"(?<![\d.]){re.escape(number)}(?![\d])", source), f"{number} is not in {claim['source']}"
            assert re.search(rf"(?<![\d.]){re.escape(number)}(?![\d])", sentence), \
                f"{claim['doc']}: {number} ({claim['source']}) is not in the claim {claim['near']!r} ..."
        return
    source = json.loads((ROOT / claim["source"]).read_text())
    values = {name: lookup(source, path) * claim.get("scale", {}).get(name, 1) for name, path in claim["values"].items()}
    text = claim["text"].format(**values)
    assert _flat(text) in document, f"{claim['doc']} does not say {text!r} ({claim['source']})"


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
