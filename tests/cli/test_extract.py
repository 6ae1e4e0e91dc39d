"""``snapvit-pl extract`` takes the images of the run that wrote the scores (issue 55): a budget the run did not
record is raced on them as asking prune.py for it would have, without ``--config``; only when they are the files the
run read, and the command says why it interpolates when they are not."""
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from safetensors.torch import load_file

from snapvit_pl.cli.extract import main as extract_main
from snapvit_pl.cli.prune import prune_main
from snapvit_pl.models import load_pruned


def _extract(run: Path, out: Path, *more: str) -> int:
    return extract_main(["--scores", str(run / "elastic_scores.safetensors"), "--out_dir", str(out), "--progress=off",
                         "--export.budgets=[{sparsity: 0.45}]", *more])


def _weights(folder: Path) -> dict:
    return load_file(folder / "model.safetensors")


def test_a_later_budget_is_raced_on_the_runs_own_images_and_only_on_those(folder_run, tmp_path, capsys):
    run, data, args = folder_run
    assert prune_main([*args, "--out_dir", str(tmp_path / "asked"), "--export.budgets=[{sparsity: 0.45}]"]) == 0
    asked = _weights(tmp_path / "asked" / "models" / "sparsity0.45")
    capsys.readouterr()
    # no --config: the run's config.yaml beside the scores names its images, the files it read: the model prune.py
    # cuts when asked for the budget, to the bit
    assert _extract(run, tmp_path / "cut") == 0
    assert f"using the run's images ({run / 'config.yaml'}): racing the head/MLP split of sparsity0.45" in \
        capsys.readouterr().out
    cut = _weights(tmp_path / "cut" / "sparsity0.45")
    assert cut.keys() == asked.keys() and all(np.array_equal(cut[k].numpy(), asked[k].numpy()) for k in asked)

    def interpolated(out: str, *more: str) -> tuple[str, float]:
        assert _extract(run, tmp_path / out, *more) == 0
        (note,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
        assert note.startswith("note: the run did not choose the head/MLP split of sparsity0.45: interpolated")
        return note, load_pruned(tmp_path / out / "sparsity0.45")[1]["extra"]["requested_head_ratio"]

    note, ratio = interpolated("plain", "--run_data=false")
    assert "because --run_data false;" in note
    raced = load_pruned(tmp_path / "cut" / "sparsity0.45")[1]["extra"]["requested_head_ratio"]
    assert ratio != pytest.approx(raced)  # (the interpolation misses the raced split here: the race is what matters)
    # every training image the run read replaced: refused as the race's images, interpolated as without them
    noise = np.random.default_rng(1)
    for path in sorted((data / "train").rglob("*.png")):
        Image.fromarray(noise.integers(0, 255, (28, 28), dtype=np.uint8)).save(path)
    note, changed = interpolated("changed")
    assert f"because the images {run / 'config.yaml'} names are not those the run read (32 of 32 files differ, " \
           f"e.g. {data / 'train'}" in note and changed == pytest.approx(ratio)
    (run / "resume_state.pt").unlink()  # what the run read is no longer recorded: nothing to compare with
    note, _ = interpolated("unrecorded")
    assert f"because there is no resume_state.pt (what the run read) in {run};" in note


def test_images_given_by_config_are_raced_on_only_when_they_are_the_runs(folder_run, tmp_path, capsys):
    """Issue 77: ``extract --config <run>/config.yaml`` raced silently on whatever the config named (the run's images
    replaced under the same names, or the config edited to other images). Images given are checked as the run's own
    are: raced on when they are the files the run read (wherever they lie now), else interpolated, and it says so."""
    import shutil

    run, data, args = folder_run
    assert prune_main([*args, "--out_dir", str(tmp_path / "asked"), "--export.budgets=[{sparsity: 0.45}]"]) == 0
    asked = _weights(tmp_path / "asked" / "models" / "sparsity0.45")
    moved = shutil.copytree(data, tmp_path / "moved")  # the same files, under another root
    capsys.readouterr()
    assert _extract(run, tmp_path / "given", "--config", str(run / "config.yaml"),
                    f"--data.init_args.root={moved}") == 0
    assert "using the images given, the files the run read: racing the head/MLP split of sparsity0.45" in \
        capsys.readouterr().out
    cut = _weights(tmp_path / "given" / "sparsity0.45")
    assert all(np.array_equal(cut[k].numpy(), asked[k].numpy()) for k in asked)
    noise = np.random.default_rng(2)
    for path in sorted((moved / "train").rglob("*.png"))[:3]:  # three of the images replaced under their names
        Image.fromarray(noise.integers(0, 255, (28, 28), dtype=np.uint8)).save(path)
    assert _extract(run, tmp_path / "other", "--config", str(run / "config.yaml"),
                    f"--data.init_args.root={moved}") == 0
    out = capsys.readouterr().out
    assert "racing" not in out
    (note,) = [line for line in out.splitlines() if line.startswith("note:")]
    assert note.startswith("note: the run did not choose the head/MLP split of sparsity0.45: interpolated")
    assert f"because the images --config/--data name are not those the run read (3 of 32 files differ, e.g. " \
           f"{moved / 'train'}" in note


def test_the_correction_calibrates_on_the_runs_images_or_says_why_it_cannot(folder_run, tmp_path, capsys):
    run, data, _ = folder_run
    assert _extract(run, tmp_path / "cut", "--correction.enabled=true", "--correction.num_samples=16") == 0
    assert "racing the head/MLP split of sparsity0.45, calibrating the correction" in capsys.readouterr().out
    assert _extract(run, tmp_path / "plain") == 0  # the same split, raced on the same images, not corrected
    corrected, plain = _weights(tmp_path / "cut" / "sparsity0.45"), _weights(tmp_path / "plain" / "sparsity0.45")
    assert {k: v.shape for k, v in corrected.items()} == {k: v.shape for k, v in plain.items()}
    assert not np.array_equal(corrected["blocks.0.attn.proj.weight"].numpy(), plain["blocks.0.attn.proj.weight"].numpy())
    data.rename(tmp_path / "moved")
    capsys.readouterr()
    assert _extract(run, tmp_path / "nowhere", "--correction.enabled=true") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --correction.enabled true needs calibration images, and the run's could not be "
                          f"taken (the data of {run / 'config.yaml'} cannot be read here (") and err.count("\n") == 1
    assert not (tmp_path / "nowhere").exists()


def test_a_folder_another_extract_is_writing_is_refused_as_in_use(tmp_path, capsys):
    """Issue 77: of two extracts into one new folder, the loser read 'Directory not empty; check the path and the
    disk'. The folder is held while an extract writes there; a second one is refused at once, and a refused
    extract leaves no folder of its own behind."""
    from snapvit_pl.cli.extract import main
    from snapvit_pl.run.lock import DirectoryLock

    out = tmp_path / "pruned"
    out.mkdir()
    with DirectoryLock(out):  # the other extract, mid-way
        code = main(["--scores", str(tmp_path / "missing.safetensors"), "--out_dir", str(out),
                     "--export.budgets=[{flops: 0.5}]"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: {out} is in use by another run (pid ") and \
        "choose another --out_dir" in err
    fresh = tmp_path / "fresh"
    assert main(["--scores", str(tmp_path / "missing.safetensors"), "--out_dir", str(fresh),
                 "--export.budgets=[{flops: 0.5}]"]) == 2
    assert not fresh.exists()  # refused (the scores file is missing): the folder it made is gone
