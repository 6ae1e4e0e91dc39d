"""The package's import graph: no cycle, and every import points down the layers (function-level imports included).

    errors       errors
    ranges       ranges
    foundations  seeding, io, device, progress
    config_files config_files (the YAML config files: presets, reading, base layering, --config actions)
    models       models, data
    algorithms   elastic, scoring, correction, eval
    search       search
    run          run (its folder, lock, resume, the images a run read)
    pipeline     pipeline, deploy
    lightning    lightning
    callbacks    callbacks (installed as snapvit_pl.callbacks)
    commands     cli
    entry        api, extract, evaluate, hub, deploy.__main__, the package's lazy exports
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = [
    ("errors", "version"),
    ("ranges",),
    ("seeding", "io", "device", "progress"),
    ("config_files",),
    ("models", "data"),
    ("elastic", "scoring", "correction", "eval"),
    ("search",),
    ("run",),
    ("pipeline", "deploy"),
    ("lightning",),
    ("callbacks",),
    ("cli",),
    ("api", "extract", "evaluate", "hub", "deploy.__main__", ""),
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def _modules() -> dict[str, Path]:
    """``snapvit_pl.x.y`` -> file, the callbacks folder included as ``snapvit_pl.callbacks``."""
    modules = {}
    for base, folder in (("snapvit_pl", ROOT / "snapvit_pl"), ("snapvit_pl.callbacks", ROOT / "callbacks")):
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join([base, *parts])] = path
    return modules


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports anywhere in its file (module level or inside functions; not the
    annotation-only imports under ``if TYPE_CHECKING:``)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    tree = ast.parse(path.read_text())
    # an `if TYPE_CHECKING:` import names a type for annotations and runs never: no edge of the import graph
    typing_only = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and getattr(node.test, "id", None) == "TYPE_CHECKING" for inner in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in modules and target != name:
                found.add(target)
    return found


def _layer(module: str) -> str:
    """The layer key of a module: its subpackage (``pipeline``), or ``deploy.__main__``, or ``""`` for the root."""
    parts = module.split(".")[1:]
    if parts[:2] == ["deploy", "__main__"]:
        return "deploy.__main__"
    return parts[0] if parts else ""


def test_no_import_cycle():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            assert state.get(nxt) != 1, "import cycle: " + " -> ".join(path[path.index(nxt):] + [node, nxt]) \
                if nxt in path else f"import cycle through {node} -> {nxt}"
            if nxt not in state:
                visit(nxt, path + [node])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])


def test_every_import_points_down_the_layers():
    modules = _modules()
    assert set(map(_layer, modules)) <= set(RANK), f"modules outside the layers: {set(map(_layer, modules)) - set(RANK)}"
    upward = []
    for name, path in modules.items():
        layer = _layer(name)
        for target in _imports(name, path, modules):
            other = _layer(target)
            if other != layer and RANK[other] >= RANK[layer]:
                upward.append(f"{name} ({layer}) imports {target} ({other})")
    assert upward == []
