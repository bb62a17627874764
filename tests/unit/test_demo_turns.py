"""The demo's launch turns: one part's drivers starting at a time, in LAUNCH_ORDER, a finished part passing its turn."""

from __future__ import annotations

import threading

from tandem.demo import LAUNCH_ORDER, LaunchTurns


def test_turns_go_in_order_one_at_a_time() -> None:
    turns = LaunchTurns(["temperatures", "hot_rooms", "pizza_shop"])
    assert not turns.take("pizza_shop", timeout_s=0.01)
    assert not turns.take("hot_rooms", timeout_s=0.01)
    assert turns.take("temperatures", timeout_s=0.01)
    assert not turns.take("hot_rooms", timeout_s=0.01), "temperatures still launching"
    turns.done("temperatures")
    assert turns.take("hot_rooms", timeout_s=0.01)
    turns.done("hot_rooms")
    assert turns.take("pizza_shop", timeout_s=0.01)


def test_a_part_that_ends_before_its_turn_passes_it_on() -> None:
    turns = LaunchTurns(["temperatures", "hot_rooms", "pizza_shop"])
    turns.done("temperatures")  # failed before it launched
    assert turns.take("hot_rooms", timeout_s=0.01)
    turns.done("pizza_shop")  # failed while hot_rooms launched: hot_rooms keeps its turn
    assert not turns.take("pizza_shop", timeout_s=0.01)
    turns.done("hot_rooms")
    turns.done("hot_rooms")  # a second done (the part's own, then the runner's) changes nothing


def test_a_waiting_part_goes_as_soon_as_the_turn_before_it_ends() -> None:
    turns = LaunchTurns(list(LAUNCH_ORDER))
    first, second = LAUNCH_ORDER[0], LAUNCH_ORDER[1]
    assert turns.take(first, timeout_s=0.01)
    took = threading.Event()
    waiter = threading.Thread(target=lambda: turns.take(second, timeout_s=5) and took.set())
    waiter.start()
    assert not took.wait(0.1)
    turns.done(first)
    waiter.join(5)
    assert took.is_set()
