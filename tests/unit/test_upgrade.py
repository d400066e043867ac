"""The swap behind ``--near-exact-check background`` (``ember.backends.upgrade``): a batch
runs wholly on the backend it began on, the reference closes after its last batch, and a
backend closed meanwhile never takes a late candidate. Fake backends, threads held by
events: no timing."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from ember.backends.base import BackendDefaults, BackendInfo
from ember.backends.upgrade import Upgradable


class Fake(BackendDefaults):
    """Answers its own name; ``hold`` keeps a forward running until released."""

    def __init__(self, name: str) -> None:
        self.info = BackendInfo(name=name, device="cpu", dtype="float32")
        self.parallel_forwards = 2
        self.closed = False
        self.hold: threading.Event | None = None
        self.entered = threading.Event()

    def forward(self, batch: object) -> str:
        assert not self.closed, f"{self.info.name} ran after its close"
        self.entered.set()
        if self.hold is not None:
            assert self.hold.wait(30)
        return self.info.name

    def close(self) -> None:
        self.closed = True


def test_a_running_batch_finishes_on_the_reference_which_closes_after_it() -> None:
    reference, better = Fake("fp32"), Fake("bf16")
    served = Upgradable(reference)  # type: ignore[arg-type]
    assert served.parallel_forwards == 2 and served.info.name == "fp32"
    reference.hold = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(served.forward, "batch")
        assert reference.entered.wait(30)
        assert served.upgrade(better)  # type: ignore[arg-type]
        assert served.checked.is_set() and served.info.name == "bf16"
        assert served.forward("next") == "bf16"  # the next batch: the new backend
        assert not reference.closed  # its batch is still running
        reference.hold.set()
        assert running.result(30) == "fp32"
    assert reference.closed and not better.closed
    served.close()
    assert better.closed


def test_an_idle_reference_closes_at_the_swap() -> None:
    reference, better = Fake("fp32"), Fake("bf16")
    served = Upgradable(reference)  # type: ignore[arg-type]
    assert served.forward("batch") == "fp32"
    assert served.upgrade(better)  # type: ignore[arg-type]
    assert reference.closed and served.forward("batch") == "bf16"


def test_a_candidate_after_the_close_is_closed_not_served() -> None:
    reference, late = Fake("fp32"), Fake("bf16")
    served = Upgradable(reference)  # type: ignore[arg-type]
    served.close()
    assert reference.closed and served.closed
    assert not served.upgrade(late)  # type: ignore[arg-type]
    assert late.closed and served.checked.is_set()


def test_a_kept_reference_settles_without_a_swap() -> None:
    reference = Fake("fp32")
    served = Upgradable(reference)  # type: ignore[arg-type]
    served.settled()
    assert served.checked.is_set() and served.forward("batch") == "fp32"
    assert not reference.closed
