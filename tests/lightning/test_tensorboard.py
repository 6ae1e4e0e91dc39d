import time

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter

from snapvit_pl.lightning.tensorboard import merge_event_files


def test_a_resumed_runs_event_files_become_one_with_every_scalar(tmp_path):
    for start, stop in ((0, 3), (3, 6)):  # the interrupted process, then the resumed one
        writer = SummaryWriter(str(tmp_path))
        for step in range(start, stop):
            writer.add_scalar("search/fitness", 0.1 * step, step)
        writer.close()
        time.sleep(1.1)  # event file names carry a timestamp in seconds
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2
    merged = merge_event_files(tmp_path)
    assert list(tmp_path.glob("events.out.tfevents.*")) == [merged]
    events = EventAccumulator(str(merged))
    events.Reload()
    assert [e.step for e in events.Scalars("search/fitness")] == list(range(6))
