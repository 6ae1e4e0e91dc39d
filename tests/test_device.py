"""HostSyncs: what it counts as a wait for the device."""
import torch

from snapvit_pl.device import HostSyncs


def test_host_syncs_counts_reads_back_and_with_a_device_the_blocking_copies_to_it():
    x = torch.ones(3)
    with HostSyncs() as plain:
        x.to("cpu")
        x.tolist()
    assert plain.operators == {"Tensor.tolist": 1}
    with HostSyncs(device="cpu") as syncs:
        x.to("cpu")                                  # blocking: counted
        x.to(device=torch.device("cpu"), dtype=torch.float64)
        x.to("cpu", non_blocking=True)               # not a wait
        x.to(torch.float64)                          # a cast, no device named
        torch.tensor(3, device="cpu")
        torch.as_tensor([1, 2])                      # no device named
        x.sum().item()
    assert syncs.operators == {"Tensor.to (to the device)": 2, "torch.tensor (on the device)": 1,
                               "_local_scalar_dense": 1}
    assert torch.tensor is not None and torch.Tensor.to.__name__ == "to"  # restored on exit
