"""The documentation: the README stays a short user guide, the MkDocs site builds in strict mode (a broken link, a
missing page or an API reference that names nothing fails), and every relative link of the README and the pages
leads to a file of the repository."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def test_the_readme_is_a_short_user_guide():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 200, f"README.md has {len(lines)} lines: move reference material into docs/"
    assert "pip install -e '.[test]' && python -m pytest" in lines  # the test command CI runs (.ci/run)


def _target(document: Path, link: str) -> Path:
    """Where a relative link leads: from docs/, results/ is benchmarks/results/ (docs/hooks/results_pages.py)."""
    if document.parent == ROOT / "docs" and link.startswith("results/"):
        return ROOT / "benchmarks" / link
    return document.parent / link


@pytest.mark.parametrize("document", [ROOT / "README.md", *PAGES], ids=lambda p: p.name)
def test_every_relative_link_resolves(document):
    broken = []
    for link in LINK.findall(document.read_text()):
        path = link.split("#", 1)[0]
        if not path or re.match(r"[a-z]+:", path):  # an anchor on the page, or a URL
            continue
        if not _target(document, path).exists():
            broken.append(link)
    assert not broken, f"{document.name}: links to missing files: {broken}"


def test_the_site_builds_in_strict_mode(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in ("fit_elastic", "ElasticScores", "load_pruned", "Budget", "OutputSensitivity", "GaussNewtonGreedy"):
        assert f'id="snapvit_pl.' in api and name in api, name
    assert 'class="autorefs autorefs-internal"' in api  # the docstrings' cross-references are links
    unrendered = {str(page.relative_to(tmp_path / "site")): found for page in sorted((tmp_path / "site").rglob("*.html"))
                  if (found := leftover_markup(page.read_text()))}
    assert not unrendered, unrendered


#: What a page shows when its Markdown or its docstrings were not rendered: a reST role (``:class:`x```), a table
#: left as text (its separator row ``|---|``, a table without a blank line before it or with rows of another width).
RAW_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|data|obj|exc|const):(?:`|<code>)")
RAW_TABLE = re.compile(r"\|\s*:?-{3,}:?\s*\|")


def leftover_markup(page: str) -> list[str]:
    """The raw reST roles, unrendered tables and repeated top headings of one built HTML page (code excepted)."""
    text = re.sub(r"<pre\b.*?</pre>", "", page, flags=re.S)
    text = re.sub(r"<code>.*?</code>", "<code></code>", text, flags=re.S)  # code shows markup on purpose
    found = [f"raw role {m.group(0)}" for m in RAW_ROLE.finditer(text)]
    found += [f"unrendered table {m.group(0)}" for m in RAW_TABLE.finditer(re.sub(r"<[^>]+>", "", text))]
    headings = re.findall(r"<h1[^>]*>(.*?)</h1>", page, flags=re.S)
    found += [f"a second <h1> {h}" for h in sorted(set(headings)) if headings.count(h) > 1]
    return found


def test_the_docs_check_finds_raw_roles_unrendered_tables_and_repeated_headings():
    assert leftover_markup("<p>A <code>x</code> and <a href='#'>y</a>.</p><table><tr><td>a</td></tr></table>") == []
    assert leftover_markup("<p>see :class:<code>~snapvit_pl.Pipeline</code></p>") == [
        "raw role :class:<code>"]
    assert leftover_markup("<p>rows:\n| a | b |\n|---|---|\n| 1 | 2 |</p>") == ["unrendered table |---|"]
    assert leftover_markup("<pre><code>|---|---|</code></pre><p><code>:meth:`x`</code></p>") == []
    assert leftover_markup("<h1 id='a'>Data</h1><p>x</p><h1 id='b'>Data</h1>") == ["a second <h1> Data"]


@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").exists(), reason="apt-get install dataset-fashion-mnist")
def test_the_lightning_components_example_runs_as_written(tmp_path):
    """docs/python.md, "As Lightning components": the block, run offline in an empty directory, makes its run."""
    text = (ROOT / "docs" / "python.md").read_text()
    section = text[text.index("## As Lightning components"):]
    code = re.search(r"<!-- executed: [^>]*-->\n```python\n(.*?)```", section, re.S)[1]
    (tmp_path / "example.py").write_text(code)
    done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "runs" / "composed"
    assert (run / "elastic_scores.safetensors").exists() and (run / "report.json").exists()


def test_the_own_scorer_example_runs_and_registers(monkeypatch):
    """docs/python.md, "Your own scorer": the block runs on a small random ViT (a shorter search), its scorer
    registers under its name, its specification is frozen, and the head scores are the columns' norms."""
    import torch

    from snapvit_pl.models import BackboneSpec, load_backbone
    from snapvit_pl.scoring import SCORERS, ScoringError

    text = (ROOT / "docs" / "python.md").read_text()
    section = text[text.index("## Your own scorer"):]
    code = re.search(r"<!-- executed: [^>]*-->\n```python\n(.*?)```", section, re.S)[1]
    model = load_backbone(BackboneSpec("vit_tiny_patch16_224", False, None, {
        "img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 4, "num_classes": 0}))
    images = torch.randn(32, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    import snapvit_pl

    fit = snapvit_pl.fit_elastic  # (a short search: the example's call, with fewer evaluations)
    monkeypatch.setattr(snapvit_pl, "fit_elastic", lambda *a, **k: fit(*a, search=snapvit_pl.SearchSettings(
        max_evaluations=4, popsize=2, num_images=16, batch_size=8, pca_components=4), **k))
    namespace = {"model": model, "unlabeled_loader": list(images.split(8))}
    try:
        exec(compile(code, "docs/python.md", "exec"), namespace)
        spec = namespace["OutputNorm"](p=1.0)
        assert SCORERS["output_norm"] is namespace["OutputNorm"]
        with pytest.raises(ScoringError, match="fixed once made"):
            spec.p = 2.0
        attn = model.blocks[1].attn
        by_hand = attn.proj.weight.abs().unflatten(1, (4, -1)).sum(dim=(0, 2))
        torch.testing.assert_close(namespace["local"].heads[1], by_hand.detach())
        assert namespace["scores"].settings["scorer"]["name"] == "output_norm"
    finally:
        SCORERS.pop("output_norm", None)
