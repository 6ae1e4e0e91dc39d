"""Every launch a user types ends cleanly: each bad or unusual invocation below exits with status 2, prints one
``error:`` line (no traceback) naming the problem, and leaves nothing behind. In-process, through the
``snapvit-pl`` dispatcher (the same functions as ``python prune.py`` and ``python -m snapvit_pl.X``)."""
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from families import FAMILIES, random_subnet, saved_scores
from snapvit_pl.cli import main
from snapvit_pl.data import find_fashion_mnist
from snapvit_pl.models import load_backbone, prune_, save_pruned

ROOT = Path(__file__).resolve().parents[2]
FINETUNE = ROOT / "configs" / "train" / "finetune_pruned.yaml"
pytestmark = pytest.mark.skipif(find_fashion_mnist(None) is None, reason="apt-get install dataset-fashion-mnist")

#: prune: (overrides, what the error line says). TMP is the test's directory; OUT the run directory.
PRUNE = [
    (["--export.budgets=[{mlp_ratio: 1.5, head_ratio: 0.1}]"], "mlp_ratio=1.5 is outside [0, 1)"),
    (["--export.budgets=[{params: 0.01}]"], "unreachable"),
    (["--export.budgets=[{flop: 0.5}]"], "unknown budget key 'flop' (did you mean 'flops'?)"),
    (["--export.budgets=[{sparsity:0.3}]"], "YAML needs a space after the colon, write {sparsity: 0.3}"),
    (["--export.budgets=[{flops: half}]"], "budget flops='half' is not a number"),
    (["--export.budgets=[{flops: 0.5, params: 0.5}]"], "a budget takes exactly one of"),
    (["--export.split=best"], "export.split must be one of fitness, schedule, got 'best'"),
    (["--export.mlp_multiple=0"], "export.mlp_multiple must be an integer > 0, got 0"),
    (["--model.model_name=vit_not_a_model"], "unknown timm model"),
    (["--model.model_kwargs={num_classes: 0}", "--model.model_name=resnet18"], "unsupported architecture ResNet"),
    (["--model.checkpoint_path=/nonexistent/weights.safetensors"], "checkpoint file not found"),
    (["--model.checkpoint_path=TMP/random.safetensors"], "could not load"),
    (["--model.checkpoint_path=TMP/truncated.safetensors"], "could not load"),
    (["--model.model_kwargs={no_such_argument: 1}"], "does not accept these model_kwargs"),
    (["--data.init_args.source=folder", "--data.init_args.root=TMP/empty"], "is not an image folder this module reads"),
    (["--data.init_args.source=folder", "--data.init_args.root=TMP/nowhere"], "does not exist; expected one of"),
    (["--data.init_args.source=imagenet_xyz"], "unknown data source 'imagenet_xyz'"),
    (["--data.init_args.max_samples=0"], "data.init_args.max_samples must be an integer > 0, got 0"),
    (["--data.init_args.batch_size=64"], "is larger than the 48 pruning images"),
    (["--data.init_args.batch_size=0"], "data.init_args.batch_size must be an integer > 0, got 0"),
    (["--data.init_args.source=folder", "--data.init_args.root=TMP/unlabeled", "--data.init_args.batch_size=2"],
     "is a folder of unlabeled images"),
    (["--search.max_evaluations=-5"], "search.max_evaluations must be an integer >= 0, got -5"),
    (["--search.max_evaluations=abc"], "--search.max_evaluations"),
    (["--search.max_evaluationz=3"], "search.max_evaluationz"),
    (["--search.sigma=0"], "search.sigma must be a number > 0, got 0.0"),
    (["--search.optimizer=adam"], "search.optimizer must be one of snes, xnes, got 'adam'"),
    (["--search.pca_components=1000", "--search.num_images=16"], "pca_components 1000 exceeds num_images 16"),
    (["--importance.min_head_keep=1.5"], "importance.min_head_keep must be a number >= 0 and <= 1, got 1.5"),
    (["--importance.scorer.class_path=snapvit_pl.scoring.NoSuchScorer"], "--importance.scorer"),
    (["--model.model_kwargs.num_classes=0", "--importance.scorer.class_path=snapvit_pl.scoring.LabelFisher"],
     "label_fisher needs a classifier head"),
    (["--correction.num_samples=0"], "correction.num_samples must be an integer > 0, got 0"),
    (["--correction.reconstruct_steps=many"], "--correction.reconstruct_steps: expected an integer or auto, got 'many'"),
    (["--correction.reconstruct_steps=-3"], "correction.reconstruct_steps must be an integer >= 0 or auto, got -3"),
    (["--evaluation.metrics=[knn, speed]"], "unknown metric(s) speed"),
    (["--evaluation.metrics=[seg]"], "'seg' needs segmentation data"),
    (["--trainer.accelerator=gpu"], "the accelerator asked for is not on this machine"),
    (["--trainer.strategy=fsdp", "--trainer.devices=2"], "--trainer.strategy fsdp"),
    (["--trainer.strategy=deepspeed"], "--trainer.strategy deepspeed"),
    (["--progress=loud"], "--progress must be one of"),
    (["--verbose=maybe"], "--verbose takes true or false"),
    (["--config=TMP/nowhere.yaml"], "--config TMP/nowhere.yaml: no such file"),
    ([f"--config={ROOT / 'configs' / 'prune' / 'demo.yaml'}", "--config=TMP/bad.yaml"], "max_evaluationz"),
    (["--out_dir=TMP/a_file"], "is a file, not a directory"),
    (["--out_dir=TMP/a_file/run"], "lies under the file"),
    (["--out_dir=/sys/snapvit_run"], "cannot be created"),
    (["--out_dir=TMP/finished"], "already holds results"),
    (["--resume=TMP/empty"], "has no config.yaml"),
    (["--config=TMP/twice.yaml"], "the key 'search' is given twice in one mapping"),
    (["--export.budgets=[{flops: true}]"], "budget flops=True is not a number"),
]

#: the other commands: (command, arguments, what the error line says, paths that must not exist afterwards)
OTHERS = [
    ("extract", ["--scores=TMP/nowhere.safetensors", "--out_dir=TMP/cut"], "elastic scores file not found", ["cut"]),
    ("extract", ["--scores=TMP/scores.safetensors", "--out_dir=TMP/cut", "--export.budgets=[{flops: 0.5}, {flop: 0.4}]"],
     "unknown budget key 'flop'", ["cut"]),
    ("extract", ["--scores=TMP/scores.safetensors", "--out_dir=TMP/cut",
                 "--export.budgets=[{flops: 0.5}, {sparsity: 0.99}]"], "unreachable", ["cut"]),  # all or nothing
    ("extract", ["--scores=TMP/scores.safetensors", "--out_dir=TMP/a_file", "--export.budgets=[{flops: 0.5}]"],
     "is a file, not a directory", []),
    ("extract", ["--scores=TMP/scores.safetensors", "--out_dir=TMP/taken", "--export.budgets=[{flops: 0.5}]"],
     "already holds flops0.5; pass --overwrite true", []),
    ("extract", ["--scores=TMP/scores.safetensors", "--out_dir=TMP/cut", "--export.budgets=[{latency: 5}]",
                 "--export.latency_device=cuda"], "device cuda is not available on this machine", ["cut"]),
    ("evaluate", ["--checkpoint=TMP/pruned", "--device=cuda:1"], "device cuda:1 is not available", []),
    ("extract", ["--scores=TMP/scores.safetensors", "--out_dir=TMP/cut", "--correction.enabled=true"],
     "needs calibration images", ["cut"]),
    ("evaluate", ["--checkpoint=TMP/nowhere"], "architecture.json not found", []),
    ("evaluate", ["--checkpoint=TMP/pruned", "--evaluation.metrics=[speed]"], "unknown metric(s) speed", []),
    ("evaluate", ["--checkpoint=TMP/pruned", "--out=TMP/a_file/report.json"], "lies under the file", []),
    ("evaluate", ["--evaluation.metrics=[knn]"], "give the model", []),
    ("deploy", ["--checkpoint=TMP/nowhere", "--out=TMP/m.onnx"], "architecture.json not found", ["m.onnx"]),
    ("deploy", ["--checkpoint=TMP/pruned", "--out=TMP"], "is a directory; give a file path", []),
    ("hub", ["push", "--checkpoint=TMP/pruned", "--repo=no-slash"], "must be org/name", []),
    ("hub", ["card", "--checkpoint=TMP/nowhere", "--repo=org/name"], "architecture.json not found", []),
    ("train", ["fit", f"--config={FINETUNE}"], "give model.checkpoint", []),
    ("train", ["fit", f"--config={FINETUNE}", "--model.checkpoint=TMP/headless", "--trainer.default_root_dir=TMP/ft"],
     "loss 'ce' needs a classifier head", ["ft"]),
    ("train", ["fit", f"--config={FINETUNE}", "--model.checkpoint=TMP/classifier", "--model.loss=ce",
               "--trainer.accelerator=gpu", "--trainer.default_root_dir=TMP/ft"],
     "the accelerator asked for is not on this machine", ["ft"]),
    ("prunne", [], "unknown command 'prunne'", []),
    ("extract", ["--config=TMP/laughs.yaml", "--scores=TMP/scores.safetensors", "--out_dir=TMP/cut"],
     "expands to more than 100,000 values through its YAML aliases", ["cut"]),
    *[("hub", ["card", "--checkpoint=TMP/pruned", f"--repo={repo}"], "is not a Hub repository id", [])
      for repo in ("../../etc", "a/b/c", "org/")],
]


@pytest.fixture
def files(tmp_path):
    """What the cases point at: bad weights, folders, a finished run, elastic scores and pruned checkpoints."""
    (tmp_path / "random.safetensors").write_bytes(torch.randint(0, 256, (4096,), dtype=torch.uint8).numpy().tobytes())
    weights = (ROOT / "assets" / "reference_vit_fmnist" / "model.safetensors").read_bytes()
    (tmp_path / "truncated.safetensors").write_bytes(weights[: len(weights) // 3])
    (tmp_path / "empty").mkdir()
    (tmp_path / "unlabeled").mkdir()
    for i in range(4):
        Image.fromarray(np.full((28, 28), 60 * i, np.uint8)).save(tmp_path / "unlabeled" / f"{i}.png")
    (tmp_path / "a_file").write_text("")
    (tmp_path / "bad.yaml").write_text("search:\n  max_evaluationz: 3\n")
    (tmp_path / "twice.yaml").write_text("search:\n  num_images: 32\nsearch:\n  num_images: 64\n")
    laughs = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']  # 9^9 values once expanded
    for previous, name in zip("abcdefgh", "bcdefghi"):
        laughs.append(f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]")
    (tmp_path / "laughs.yaml").write_text("\n".join([*laughs, "export: {budgets: *i}"]) + "\n")
    (tmp_path / "finished").mkdir()
    (tmp_path / "finished" / "report.json").write_text("{}")
    spec = FAMILIES["dino_vit"]
    _, model = saved_scores(tmp_path)
    (tmp_path / "taken" / "flops0.5").mkdir(parents=True)
    subnet = random_subnet(model, 0)
    save_pruned(prune_(load_backbone(spec), subnet), tmp_path / "pruned", spec, subnet)
    save_pruned(prune_(load_backbone(spec), subnet), tmp_path / "headless", spec, subnet)
    classifier = FAMILIES["augreg_vit"]
    subnet = random_subnet(load_backbone(classifier), 0)
    save_pruned(prune_(load_backbone(classifier), subnet), tmp_path / "classifier", classifier, subnet)
    return tmp_path


def _one_clean_error(capsys, code: int, message: str) -> None:
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and message in errors[0], err[-2000:]
    assert "Traceback" not in err


@pytest.mark.parametrize("overrides, message", PRUNE, ids=[m for _, m in PRUNE])
def test_prune(tiny_prune_args, files, capsys, overrides, message):
    message = message.replace("TMP", str(files))
    args = [a for a in tiny_prune_args if not any(a.startswith(o.split("=")[0] + "=") for o in overrides)]
    if any(o.startswith(("--out_dir", "--resume")) for o in overrides):
        i = args.index("--out_dir")
        args = args[:i] + args[i + 2:]
    before = sorted(p.relative_to(files) for p in files.rglob("*"))
    overrides = [o.replace("TMP", str(files)) for o in overrides]
    configs = [o for o in overrides if o.startswith("--config")]  # config files first, as a user writes them
    code = main(["prune", *configs, *args, *(o for o in overrides if o not in configs)])
    _one_clean_error(capsys, code, message)
    assert sorted(p.relative_to(files) for p in files.rglob("*")) == before, "a refused run leaves nothing behind"


@pytest.mark.parametrize("command, arguments, message, absent", OTHERS, ids=[f"{c}: {m}" for c, _, m, _ in OTHERS])
def test_other_commands(files, capsys, command, arguments, message, absent):
    code = main([command, *(a.replace("TMP", str(files)) for a in arguments)])
    _one_clean_error(capsys, code, message)
    assert not [name for name in absent if (files / name).exists()]


def test_the_matrix_is_large():
    assert len(PRUNE) + len(OTHERS) >= 60
