"""An object as deep as the API server takes (issue 21: a ScheduledPublish whose payload nests
thousands of levels, stored while the webhook is down) is read by the operator and refused by
the one payload check, in one line; kopf's json.loads raised RecursionError on it before.

What kopf does with an object on its way (the webhook's and the watch's json.loads, its deep
copies and diffs, the last-handled annotation's json.dumps), run here on such an object after
the operator's configure(), in the event loop's thread and in a handler's worker thread."""

from __future__ import annotations

import copy
import json
import platform
import sys
import threading
from collections.abc import Iterator

import kopf
import pytest
from kopf._cogs.structs import diffs

from schedlock.core.logs import Event
from schedlock.operator import handlers, mapping

DEEP = handlers.API_MAX_DEPTH


@pytest.fixture
def configured() -> Iterator[None]:
    before = sys.getrecursionlimit()
    handlers.configure(kopf.OperatorSettings())
    try:
        yield
    finally:
        sys.setrecursionlimit(before)


def deep_object() -> str:
    payload = '{"a": ' * DEEP + "1" + "}" * DEEP
    return '{"metadata": {"name": "deep"}, "spec": {"target": "app", "payload": ' + payload + "}}"


def read_as_kopf_does(text: str) -> list[str]:
    obj = json.loads(text)
    copied = copy.deepcopy(obj)
    list(diffs.diff({"spec": {}}, obj))
    list(diffs.diff(obj, copied))
    json.dumps(copied["spec"])
    return mapping.spec_problems(obj["spec"])


def test_at_the_default_limit_kopf_could_not_read_it() -> None:
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(1_000)  # Python's default
    try:
        with pytest.raises(RecursionError):
            json.loads(deep_object())
    finally:
        sys.setrecursionlimit(before)


def test_the_operator_reads_it_and_refuses_it_in_one_line(configured: None) -> None:
    assert read_as_kopf_does(deep_object()) == ["spec.payload nests deeper than 32 levels"]
    found: list[list[str]] = []
    worker = threading.Thread(target=lambda: found.append(read_as_kopf_does(deep_object())))
    worker.start()
    worker.join()
    assert found == [["spec.payload nests deeper than 32 levels"]]


def test_the_operators_own_listing_reads_it_too(configured: None) -> None:
    """The listing that completes the operator's index parses its pages in a worker thread
    (the Kubernetes client's json.loads, ``Kube.list_page``) and keeps a plain copy of each
    object on the loop (``ObjectIndex.listed``): a page holding such an object is read whole."""
    page = '{"items": [' + deep_object().replace('"name": "deep"', '"uid": "u-deep"') + "]}"
    parsed: list[dict[str, object]] = []
    worker = threading.Thread(target=lambda: parsed.append(json.loads(page)))
    worker.start()
    worker.join()
    index = handlers.ObjectIndex()
    [listing] = parsed
    items = listing["items"]
    assert isinstance(items, list)
    index.listed(items)
    [kept] = index.objects()
    assert kept["metadata"]["uid"] == "u-deep"
    assert mapping.spec_problems(kept["spec"]) == ["spec.payload nests deeper than 32 levels"]


def test_an_interpreter_that_cannot_read_them_is_said_at_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """configure() checks what it relies on: here (3.11, the image's) it holds and nothing is
    said; an interpreter whose limit stops short (simulated by a depth beyond the raised limit)
    is named in a warning with its version, at start rather than at the first deep object."""
    before = sys.getrecursionlimit()
    try:
        with caplog.at_level("WARNING", logger="schedlock.operator.inject"):
            handlers.configure(kopf.OperatorSettings())
        assert [
            r for r in caplog.records if getattr(r, "event", "") == Event.DEEP_OBJECTS_UNREADABLE
        ] == []
        assert handlers.deep_objects_problem() is None
        problem = handlers.deep_objects_problem(depth=sys.getrecursionlimit() * 2)
        assert problem is not None and problem.startswith(f"Python {platform.python_version()} ")
        assert "cannot read JSON nested" in problem and "Python 3.11" in problem
    finally:
        sys.setrecursionlimit(before)
