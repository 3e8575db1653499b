"""Turns at a local model between requests and shadow work (ragate.backends.turns): a request waits for one
background step at most, background work takes its share while requests keep coming and all of the model when
they do not, and a request given up stops at its next step. The steps advance a clock of the test's own, so the
shares are exact whatever else the machine does."""

from __future__ import annotations

import threading

import pytest

from ragate.backends.turns import GivenUp, ModelTurns, check_share
from ragate.errors import RagateError


class Clock:
    def __init__(self) -> None:
        self.t = 0.0
        self.lock = threading.Lock()

    def __call__(self) -> float:
        with self.lock:
            return self.t

    def advance(self, seconds: float) -> None:
        with self.lock:
            self.t += seconds


def _shadow_loop(turns: ModelTurns, clock: Clock, stop: threading.Event, seconds: float = 1.0) -> None:
    try:
        while True:
            with turns.shadow_step(stop):
                clock.advance(seconds)
    except GivenUp:
        return


@pytest.mark.parametrize("share", [0.1, 0.25])
def test_background_work_takes_its_share_while_requests_keep_coming(share: float) -> None:
    clock = Clock()
    turns = ModelTurns(share, clock=clock)
    stop = threading.Event()
    with turns.in_flight():  # a request always in flight, asking for step after step
        worker = threading.Thread(target=_shadow_loop, args=(turns, clock, stop))
        worker.start()
        for _ in range(400):
            with turns.request_step():
                clock.advance(1.0)
        stop.set()
        worker.join(10)
    assert not worker.is_alive()
    seen = turns.describe()
    assert seen["request_steps"] == 400
    assert share * 0.7 <= seen["share_taken"] <= share * 1.1, seen
    assert seen["max_shadow_steps_waited"] == 1, seen  # a request waited for one background step at a time
    assert seen["waits_on_shadow"] >= 10, seen


def test_background_work_takes_the_whole_model_when_no_request_is_in_flight() -> None:
    clock = Clock()
    turns = ModelTurns(0.1, clock=clock)
    stop = threading.Event()
    worker = threading.Thread(target=_shadow_loop, args=(turns, clock, stop))
    worker.start()
    while turns.describe()["shadow_steps"] < 50:
        stop.wait(0.01)
    stop.set()
    worker.join(10)
    assert turns.describe()["request_steps"] == 0
    assert turns.shadow_steps_contended == 0


def test_share_zero_waits_until_the_requests_are_done() -> None:
    clock = Clock()
    turns = ModelTurns(0.0, clock=clock)
    stop = threading.Event()
    worker = threading.Thread(target=_shadow_loop, args=(turns, clock, stop))
    with turns.in_flight():
        worker.start()
        for _ in range(100):
            with turns.request_step():
                clock.advance(1.0)
        assert turns.shadow_steps == 0
    while turns.shadow_steps == 0:  # the request is done: the model is background work's
        stop.wait(0.01)
    stop.set()
    worker.join(10)
    assert turns.shadow_steps_contended == 0


def test_a_request_given_up_stops_at_its_next_step() -> None:
    turns = ModelTurns(0.1)
    wanted = [True]
    done = 0
    with turns.in_flight(), turns.wanted(lambda: wanted[0]), pytest.raises(GivenUp, match="given up"):
        for i in range(10):
            with turns.request_step():
                done += 1
            if i == 2:
                wanted[0] = False
    assert done == 3
    with turns.request_step():  # the next request is not affected
        pass


def test_stopping_ends_background_work_that_waits() -> None:
    turns = ModelTurns(0.0)
    stop = threading.Event()
    errors: list[BaseException] = []

    def wait_for_a_step() -> None:
        try:
            with turns.shadow_step(stop):
                pass
        except GivenUp as err:
            errors.append(err)

    with turns.in_flight():  # share 0 and a request in flight: the background step waits
        worker = threading.Thread(target=wait_for_a_step)
        worker.start()
        stop.set()
        worker.join(10)
    assert len(errors) == 1 and "closes" in str(errors[0])


@pytest.mark.parametrize("bad", [-0.1, 1.0, 2, "0.1", True, float("nan")])
def test_the_share_is_checked(bad: object) -> None:
    with pytest.raises(RagateError, match="shadow share"):
        check_share(bad)
