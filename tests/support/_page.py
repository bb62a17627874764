"""Helpers of the Tandem page's browser checks (``tests/e2e/test_presenter_api.py``, ``test_presenter_page.py``)."""

from __future__ import annotations


def assert_shown_whole(scope, instance: str, nodes: tuple[str, ...], left: float, right: float) -> None:
    """Each node's pid and drain / restart buttons lie inside the instance card of ``instance`` and the span
    ``left``..``right`` (page coordinates: the window, or the Airflow iframe inside it).

    ``scope`` is the page or a frame locator. An element pushed out of its card (or scrolled away in it)
    by a table wider than the card fails, which Playwright's ``to_be_visible`` would not notice.
    """
    card = scope.get_by_test_id(f"instance-{instance}").bounding_box()
    left, right = max(left, card["x"]), min(right, card["x"] + card["width"])
    for node in nodes:
        for what in ("pid", "drain", "restart"):
            box = scope.get_by_test_id(f"{what}-{instance}-{node}").bounding_box()
            assert box and box["width"] > 0 and left - 1 <= box["x"] and box["x"] + box["width"] <= right + 1, (
                f"{what} of {instance}/{node} spans x {box and round(box['x'])}..{box and round(box['x'] + box['width'])}, "
                f"outside its card and the visible span {round(left)}..{round(right)}")
