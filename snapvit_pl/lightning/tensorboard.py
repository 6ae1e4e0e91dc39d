"""One TensorBoard event file per run: a resumed run's new event file is appended to the first one.

An event file is a sequence of TFRecord records (``uint64 length, uint32 crc, data, uint32 crc``);
records are self-contained, so the records of a later file can follow those of an earlier one.
Every file starts with a ``file_version`` record; the later ones' are dropped.
"""
from __future__ import annotations

import struct
from pathlib import Path

from ..io import atomic_path

PATTERN = "events.out.tfevents.*"


def _records(data: bytes) -> list[bytes]:
    """The raw records of an event file (a truncated last record, from a killed process, is dropped)."""
    records, offset = [], 0
    while offset + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[offset : offset + 8])
        end = offset + 12 + length + 4
        if end > len(data):
            break
        records.append(data[offset:end])
        offset = end
    return records


def merge_event_files(directory: str | Path) -> Path | None:
    """Merge every event file in ``directory`` into the oldest one (written atomically); returns it.

    Files are ordered by the timestamp in their names. Nothing happens with fewer than two files.
    """
    files = sorted(Path(directory).glob(PATTERN), key=lambda p: (int(p.name.split(".")[3]), p.name))
    if len(files) < 2:
        return files[0] if files else None
    merged = _records(files[0].read_bytes())
    for later in files[1:]:
        merged += _records(later.read_bytes())[1:]  # without its file_version record
    with atomic_path(files[0]) as tmp:
        tmp.write_bytes(b"".join(merged))
    for later in files[1:]:
        later.unlink()
    return files[0]
