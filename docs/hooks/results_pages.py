"""MkDocs hook: the measured results (``benchmarks/results/*.md``, written by the committed benchmark scripts) become
pages of the site under ``results/`` (with the figures they show), so that the documentation links them as it quotes them."""
from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel


def on_files(files, config):
    root = Path(config["config_file_path"]).parent
    results = root / "benchmarks" / "results"
    for page in sorted(p for p in results.rglob("*") if p.suffix in (".md", ".png")):
        file = File(page.relative_to(root / "benchmarks").as_posix(), src_dir=str(root / "benchmarks"), dest_dir=config["site_dir"],
                    use_directory_urls=config["use_directory_urls"])
        file.inclusion = InclusionLevel.NOT_IN_NAV  # linked from the pages that quote them, not listed
        files.append(file)
    return files
