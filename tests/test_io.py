"""The one writer (atomic_path) never removes what it did not write, maps a full disk to one line, and the one
checksum (content_digest) reads the same from JSON and from torch."""
import errno
import json
import os

import pytest
import torch

from families import FAMILIES, random_elastic_scores, random_subnet
from snapvit_pl.errors import CheckpointError, ConfigError, StorageError
from snapvit_pl.io import (
    atomic_path, content_digest, verify_checksum, with_checksum, write_json_atomic, write_text_atomic,
)
from snapvit_pl.models import load_backbone, load_pruned, prune_, save_pruned


def _victim(tmp_path):
    """A directory of someone's work: what no writer may remove."""
    victim = tmp_path / "victim"
    (victim / "run1").mkdir(parents=True)
    (victim / "run1" / "report.json").write_text("{}")
    (victim / "notes.txt").write_text("mine")
    return victim


def _tree(path):
    return sorted((p.relative_to(path).as_posix(), p.read_bytes() if p.is_file() else None) for p in path.rglob("*"))


def test_a_file_writer_refuses_a_directory_and_leaves_it_intact(tmp_path):
    victim = _victim(tmp_path)
    before = _tree(victim)
    for write in (lambda: write_text_atomic(victim, "x"), lambda: write_json_atomic(victim, {})):
        with pytest.raises(ConfigError, match="is a directory; nothing was written there"):
            write()
    assert _tree(victim) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim"]  # no temporary left either


def test_scores_saved_onto_a_directory_are_refused(tmp_path):
    victim = _victim(tmp_path)
    before = _tree(victim)
    scores = random_elastic_scores(load_backbone(FAMILIES["dino_vit"]))
    with pytest.raises(ConfigError, match="is a directory"):
        scores.save(victim)
    link = tmp_path / "link"
    link.symlink_to(victim, target_is_directory=True)
    with pytest.raises(ConfigError, match="is a link to a directory"):
        scores.save(link)
    assert _tree(victim) == before and link.is_symlink()


def test_a_checkpoint_replaces_only_an_earlier_checkpoint(tmp_path):
    spec = FAMILIES["dino_vit"]
    model = load_backbone(spec)
    subnet = random_subnet(model, 0)
    pruned = prune_(load_backbone(spec), subnet)
    victim = _victim(tmp_path)
    before = _tree(victim)
    with pytest.raises(ConfigError, match="it is not one this writer made"):
        save_pruned(pruned, victim, spec, subnet)
    assert _tree(victim) == before
    save_pruned(pruned, tmp_path / "ckpt", spec, subnet)
    save_pruned(pruned, tmp_path / "ckpt", spec, subnet)  # an earlier checkpoint: replaced
    (tmp_path / "empty").mkdir()
    save_pruned(pruned, tmp_path / "empty", spec, subnet)  # an empty directory holds nothing to lose
    assert load_pruned(tmp_path / "empty")[1]["heads"] == subnet.head_counts


def test_a_full_disk_is_one_error_naming_the_path_and_the_space(tmp_path):
    target = tmp_path / "out" / "big.bin"
    with pytest.raises(StorageError) as caught:
        with atomic_path(target, size=5_000_000) as tmp:
            tmp.write_bytes(b"x" * 1000)
            raise OSError(errno.ENOSPC, "No space left on device")
    message = str(caught.value)
    assert str(target) in message and "about 5.0 MB" in message and "free in" in message and "\n" not in message
    assert not (tmp_path / "out").exists()  # no half-written file, no temporary, not the folder made for it
    with pytest.raises(StorageError, match="file-size limit") as caught:
        with atomic_path(target) as tmp:  # no size given: what was written is the lower bound
            tmp.write_bytes(b"x" * 1000)
            raise OSError(errno.EFBIG, "File too large")
    assert "more than the 1.0 KB written" in str(caught.value) and not target.exists()


def test_the_checksum_reads_the_same_from_json_and_from_torch(tmp_path):
    data = {"shapes": [{"heads_ms": {1: 0.5, 2: 0.75}}], "name": "cpu", "n": 3, "none": None, "t": (1, 2)}
    assert content_digest(data) == content_digest(json.loads(json.dumps(data)))
    state = {"local": {"heads": [torch.arange(4.0)], "neurons": torch.ones(2, dtype=torch.bfloat16)}, "x": 0.1}
    torch.save(with_checksum(state), tmp_path / "state.pt")
    assert verify_checksum(torch.load(tmp_path / "state.pt", weights_only=True), "state.pt", "").keys() == state.keys()
    changed = with_checksum(state)
    changed["local"]["heads"][0][2] = 7.0
    with pytest.raises(CheckpointError, match="does not match its checksum"):
        verify_checksum(changed, "state.pt", "start again")
    assert content_digest({"a": torch.zeros(2)}) != content_digest({"a": torch.zeros(2, dtype=torch.float64)})


def test_permissions_follow_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        write_text_atomic(tmp_path / "f.txt", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "f.txt").stat().st_mode & 0o777 == 0o640


def test_an_io_failure_of_any_library_names_the_file_and_its_devices_space(tmp_path):
    """safetensors raises its own SafetensorError (the OS error only in its message); a writer maps it as any OSError:
    the file, the free space of the folder it was written in (not of the working directory), the way out."""
    from safetensors import SafetensorError

    target = tmp_path / "deep" / "model.safetensors"
    with pytest.raises(StorageError) as caught:
        with atomic_path(target):
            raise SafetensorError("Error while serializing: I/O error: File too large (os error 27)")
    message = str(caught.value)
    assert message.startswith(f"cannot write {target}: File too large") and "ulimit -f" in message
    assert f"free in {tmp_path}" in message and not target.exists()
    with pytest.raises(StorageError, match=f"{tmp_path / 'ro.json'}: Permission denied; check its permissions"):
        with atomic_path(tmp_path / "ro.json"):
            raise PermissionError(errno.EACCES, "Permission denied")


def test_a_named_pipe_is_told_apart_from_a_file(tmp_path):
    from snapvit_pl.io import special_file, weights_file

    os.mkfifo(tmp_path / "pipe")
    assert special_file(tmp_path / "pipe") == "a named pipe (FIFO)"
    assert special_file(tmp_path) is None and special_file(tmp_path / "missing") is None
    with pytest.raises(CheckpointError, match="is a named pipe"):
        weights_file(tmp_path / "pipe")
