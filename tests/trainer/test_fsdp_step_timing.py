"""Per-phase step timings wait for the GPU: CUDA kernels run asynchronously, so without a
synchronize a phase's time lands in whichever later phase first waits (a .item(), a copy to the
host). No GPU here: the synchronize function is injected and only the device string says cuda."""

from rollhub.trainer.update import PhaseClock


def test_phase_clock_synchronizes_a_cuda_device_at_every_lap():
    calls = []
    clock = PhaseClock("cuda:1", synchronize=calls.append)
    split: dict[str, float] = {}
    clock.lap(split, "split/forward_s")
    clock.lap(split, "split/backward_s")
    clock.lap(split, "split/forward_s")
    assert [str(device) for device in calls] == ["cuda:1"] * 4  # the start and each lap
    assert set(split) == {"split/forward_s", "split/backward_s"} and all(v >= 0 for v in split.values())


def test_phase_clock_does_not_synchronize_the_cpu():
    calls = []
    clock = PhaseClock("cpu", synchronize=calls.append)
    split: dict[str, float] = {}
    clock.lap(split, "split/loss_s")
    clock.restart()
    clock.lap(split, "split/loss_s")
    assert calls == [] and split["split/loss_s"] >= 0
