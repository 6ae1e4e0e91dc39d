"""Several processes on CPU (gloo), launched as users launch them: ``--trainer.devices 2`` (with or without a
strategy), two nodes through torchrun, two nodes under SLURM's environment. Pruning gives the single-process
result with the search's population split across every rank; training saves a checkpoint."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from run_helpers import digests
from snapvit_pl.elastic import ElasticScores
from snapvit_pl.models import load_pruned

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").exists(), reason="apt-get install dataset-fashion-mnist"),
]
EVALUATIONS = 6
IMAGES = 49  # neither 2 nor 3 divides it: the shards differ in size (25 + 24; 17 + 16 + 16)

# Loaded by a run through PYTHONPATH when SNAPVIT_TEST_COUNT_DIR is set: each rank writes which images of the pruning
# subset its importance pass read and how many images its scorer counted, before and after the sum over ranks.
COUNT_IMAGES = '''
import os
if os.environ.get("SNAPVIT_TEST_COUNT_DIR"):
    import json
    from pathlib import Path

    import torch.distributed as dist

    import snapvit_pl.data.base as base
    import snapvit_pl.scoring.base as scoring

    seen = {}
    loader, reduce = base.VisionDataModule.train_dataloader, scoring.SummedStatistics.reduce

    def recording_loader(self):
        result = loader(self)
        seen["indices"] = [int(i) for i in getattr(result.dataset, "indices", range(len(result.dataset)))]
        seen["batches"] = len(result)
        return result

    def recording_reduce(self, all_reduce_sum):
        own = self._samples
        reduce(self, all_reduce_sum)
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        record = {**seen, "samples": own, "total": self._samples}
        (Path(os.environ["SNAPVIT_TEST_COUNT_DIR"]) / f"rank{rank}.json").write_text(json.dumps(record))

    base.VisionDataModule.train_dataloader = recording_loader
    scoring.SummedStatistics.reduce = recording_reduce
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


def _run(command: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, cwd=cwd, timeout=600, env=env or _env())
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _together(commands: list[tuple[list[str], dict]], cwd: Path) -> None:
    """Start the processes of one multi-node run at once and wait for all of them."""
    processes = [subprocess.Popen(c, cwd=cwd, env=e, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for c, e in commands]
    for process in processes:
        _, err = process.communicate(timeout=600)
        assert process.returncode == 0, err[-3000:]


@pytest.fixture(scope="module")
def prune_args():
    return ["--model.checkpoint_path=null", "--model.model_kwargs.embed_dim=32", "--model.model_kwargs.depth=2",
            "--model.model_kwargs.num_heads=4", f"--data.init_args.max_samples={IMAGES}",
            "--data.init_args.batch_size=16", "--data.init_args.n_local_views=2",
            f"--search.max_evaluations={EVALUATIONS}", f"--search.num_images={IMAGES}",
            "--search.batch_size=32", "--search.pca_components=8", "--export.budgets=[{flops: 0.6}]",
            "--export.split_grid=0", "--evaluation.metrics=[]", "--report.print_table=false", "--progress=off",
            "--trainer.accelerator=cpu"]


@pytest.fixture(scope="module")
def counting(tmp_path_factory):
    """``counting(name)``: the environment of a run whose ranks record the images they scored (:data:`COUNT_IMAGES`),
    and the directory they record them in."""
    hooks = tmp_path_factory.mktemp("hooks")
    (hooks / "sitecustomize.py").write_text(COUNT_IMAGES)

    def counting(name: str) -> tuple[dict, Path]:
        records = tmp_path_factory.mktemp(name)
        return _env(SNAPVIT_TEST_COUNT_DIR=str(records), PYTHONPATH=os.pathsep.join(
            filter(None, [str(hooks), os.environ.get("PYTHONPATH")]))), records

    return counting


def _scored_once(records: Path, ranks: int) -> None:
    """Every image of the pruning subset scored by exactly one rank; every rank as many batches; the summed count
    the number of images."""
    counts = [json.loads((records / f"rank{r}.json").read_text()) for r in range(ranks)]
    indices = sorted(i for c in counts for i in c["indices"])
    assert indices == list(range(IMAGES))
    assert [c["samples"] for c in counts] == [len(c["indices"]) for c in counts]
    assert all(c["total"] == IMAGES for c in counts) and len({c["batches"] for c in counts}) == 1


@pytest.fixture(scope="module")
def single_run(prune_args, counting, tmp_path_factory) -> Path:
    """The single-process run everything is compared with."""
    out = tmp_path_factory.mktemp("single")
    env, records = counting("single_counts")
    _run([sys.executable, str(ROOT / "prune.py"), "--out_dir", str(out), *prune_args], out, env)
    assert json.loads((out / "report.json").read_text())["search"]["evaluations_per_rank"] == [EVALUATIONS]
    _scored_once(records, 1)
    return out


@pytest.fixture(scope="module")
def single(single_run):
    return ElasticScores.load(single_run / "elastic_scores.safetensors")


def test_uneven_shards_on_three_processes_write_the_single_process_files(prune_args, single_run, counting, tmp_path):
    """49 images on 3 processes (shards of 17, 16 and 16; on 2, 25 and 24: the ddp strategy's test below): the scores
    file and the model files byte for byte those of one process, every image scored once, the search's candidates
    shared out. (3 processes used to hang: the 17-image shard had one batch more than the others, and Lightning's
    per-batch broadcast waited for them for gloo's 30 minutes.) The run is ``--trainer.devices 3`` alone, without
    --out_dir: the default runs/prune/<time>, chosen once by the first process, holds the whole run."""
    env, records = counting("counts3")
    _run([sys.executable, str(ROOT / "prune.py"), *prune_args, "--trainer.devices=3"], tmp_path, env)
    (out,) = (tmp_path / "runs" / "prune").iterdir()  # one folder, not one per process
    assert digests(out) == digests(single_run)
    _scored_once(records, 3)
    per_rank = json.loads((out / "report.json").read_text())["search"]["evaluations_per_rank"]
    assert len(per_rank) == 3 and sum(per_rank) == EVALUATIONS and max(per_rank) - min(per_rank) <= 1


def _same_as_single(out: Path, single: ElasticScores, ranks: int = 2) -> ElasticScores:
    scores = ElasticScores.load(out / "elastic_scores.safetensors")
    for a, b in zip(single.neuron_scores + single.head_scores, scores.neuron_scores + scores.head_scores):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5 * float(a.abs().max()))
    torch.testing.assert_close(scores.coefficients, single.coefficients, rtol=1e-5, atol=1e-6)
    report = json.loads((out / "report.json").read_text())
    assert report["search"]["evaluations_per_rank"] == [EVALUATIONS // ranks] * ranks  # each candidate once
    return scores


def test_two_devices_with_the_ddp_strategy_named_choose_the_pruning_ddp(prune_args, single_run, single, counting,
                                                                        tmp_path):
    """``--trainer.strategy ddp`` on 49 images (shards of 25 and 24) writes the files of one process, byte for byte,
    every image scored once, each candidate evaluated once."""
    env, records = counting("counts2")
    _run([sys.executable, str(ROOT / "prune.py"), "--out_dir", str(tmp_path / "ddp"), *prune_args,
          "--trainer.devices=2", "--trainer.strategy=ddp"], tmp_path, env)
    _scored_once(records, 2)
    report = json.loads((tmp_path / "ddp" / "report.json").read_text())
    assert [p["checkpoint"] for p in report["pruned"]] == ["models/flops0.6"]
    assert sorted(p.name for p in (tmp_path / "ddp" / "models").iterdir()) == ["flops0.6"]
    assert digests(tmp_path / "ddp") == digests(single_run)
    _same_as_single(tmp_path / "ddp", single)


def test_two_nodes_through_torchrun(prune_args, single, tmp_path):
    port = str(_free_port())
    commands = [([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1", f"--node-rank={r}",
                  "--master-addr=127.0.0.1", f"--master-port={port}", str(ROOT / "prune.py"), "--out_dir",
                  str(tmp_path / "run"), *prune_args, "--trainer.num_nodes=2", "--trainer.devices=1"], _env())
                for r in (0, 1)]
    _together(commands, tmp_path)
    _same_as_single(tmp_path / "run", single)


def test_two_nodes_under_slurm(prune_args, single, tmp_path):
    """What srun sets for a 2-node job with one task per node (Lightning reads it: no launcher needed)."""
    port = str(_free_port())
    commands = [([sys.executable, str(ROOT / "prune.py"), "--out_dir", str(tmp_path / "run"), *prune_args,
                  "--trainer.num_nodes=2", "--trainer.devices=1"],
                 _env(SLURM_NTASKS="2", SLURM_NTASKS_PER_NODE="1", SLURM_PROCID=str(r), SLURM_LOCALID="0",
                      SLURM_NODEID=str(r), SLURM_JOB_ID="4242", SLURM_JOB_NAME="prune", SLURM_NODELIST="localhost",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=port))
                for r in (0, 1)]
    _together(commands, tmp_path)
    _same_as_single(tmp_path / "run", single)


def _train_args(run: Path) -> list[str]:
    return ["fit", "--config", str(ROOT / "configs" / "train" / "reference_fmnist.yaml"),
            "--model.model_kwargs.embed_dim=32", "--model.model_kwargs.depth=2", "--model.model_kwargs.num_heads=4",
            f"--trainer.default_root_dir={run}", f"--trainer.logger.init_args.save_dir={run}", "--trainer.max_epochs=1",
            "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=2", "--trainer.enable_progress_bar=false",
            "--data.init_args.batch_size=16", "--data.init_args.num_workers=0", "--trainer.accelerator=cpu"]


def test_train_two_processes_saves_loadable_checkpoint(tmp_path):
    run = tmp_path / "run"
    _run([sys.executable, str(ROOT / "train.py"), *_train_args(run), "--trainer.strategy=ddp", "--trainer.devices=2"],
         tmp_path)
    model, record = load_pruned(run / "model")
    assert record["heads"] == [4, 4]
    assert torch.isfinite(model(torch.zeros(1, 1, 28, 28))).all()


def test_train_two_nodes_through_torchrun(tmp_path):
    run, port = tmp_path / "run", str(_free_port())
    commands = [([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1", f"--node-rank={r}",
                  "--master-addr=127.0.0.1", f"--master-port={port}", str(ROOT / "train.py"), *_train_args(run),
                  "--trainer.num_nodes=2", "--trainer.devices=1", "--trainer.strategy=ddp"], _env()) for r in (0, 1)]
    _together(commands, tmp_path)
    _, record = load_pruned(run / "model")
    assert record["heads"] == [4, 4]


def _hashes(out: Path) -> dict[str, str]:
    import hashlib

    files = [out / "elastic_scores.safetensors", *sorted(f for f in (out / "models").rglob("*") if f.is_file())]
    return {str(f.relative_to(out)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def test_two_processes_share_the_splits_and_the_export_and_write_the_same_files(prune_args, tmp_path):
    """The split choice (raced candidates) and the export (each rank its share of the models and of the evaluation,
    the correction with its reconstruction steps and held-out checks included) on two processes: the same scores file
    and model files, byte for byte (one process's weights), and the same metrics, as cut and corrected, as one
    process."""
    args = [a for a in prune_args if not a.startswith(("--search.max_evaluations", "--export.", "--evaluation.metrics",
                                                       "--correction."))]
    args += ["--correction.enabled=true", "--correction.num_samples=40", "--correction.held_out=0.2",
             "--correction.batch_size=8", "--correction.reconstruct_steps=30", "--correction.reconstruct_patience=10"]
    args += ["--search.max_evaluations=0", "--export.budgets=[{sparsity: 0.3}, {flops: 0.6}, {sparsity: 0.5}]",
             "--export.split_grid=0.25", "--export.split_images=16", "--evaluation.metrics=[knn, head, throughput]",
             "--evaluation.train_samples=64", "--evaluation.val_samples=32", "--evaluation.throughput_batch_size=4",
             "--evaluation.throughput_repeats=2", "--progress=lines"]
    runs, logs = {}, {}
    for name, extra in (("one", []), ("two", ["--trainer.devices=2"])):
        logs[name] = _run([sys.executable, str(ROOT / "prune.py"), "--out_dir", str(tmp_path / name), *args, *extra],
                          tmp_path).stderr
        runs[name] = json.loads((tmp_path / name / "report.json").read_text())
    # issue 48: the first process counts every process's models, and times each one alone once the others are done
    assert "[snapvit] export: 3/3 models (100%)" in logs["two"], logs["two"][-2000:]
    assert all(entry["metrics"]["throughput_images_per_s"] > 0 for entry in [runs["two"]["dense"], *runs["two"]["pruned"]])
    assert _hashes(tmp_path / "one") == _hashes(tmp_path / "two") and len(_hashes(tmp_path / "one")) > 3
    one, two = runs["one"], runs["two"]
    assert [c["head_ratio"] for c in one["splits"]] == [c["head_ratio"] for c in two["splits"]]
    assert one["dense"]["metrics"]["knn_top1"] == two["dense"]["metrics"]["knn_top1"]
    for a, b in zip(one["pruned"], two["pruned"]):
        assert a["label"] == b["label"] and a["metrics"]["knn_top1"] == b["metrics"]["knn_top1"]
        assert a["metrics"]["head_top1"] == b["metrics"]["head_top1"]
        assert a["metrics_as_cut"]["knn_top1"] == b["metrics_as_cut"]["knn_top1"]
        assert {k: v for k, v in a["correction"].items() if k != "seconds"} == \
            {k: v for k, v in b["correction"].items() if k != "seconds"}
        assert a["correction"]["held_out_images"] == 8 and a["correction"]["reconstruction"]["blocks"]
