"""The negative-id check the call graph runs on every turn's new tokens: on int32 arrays (the proxy's captures) it
reads sign bytes in C, and must answer as `min(ids) < 0` does on any ids."""

from __future__ import annotations

from array import array

from harnessrl.runtime.trajectory.models import has_negative
from hypothesis import given
from hypothesis import strategies as st

int32 = st.integers(-(2**31), 2**31 - 1)


@given(ids=st.lists(int32, max_size=50))
def test_array_and_list_answers_equal_min(ids: list[int]) -> None:
    expected = min(ids, default=0) < 0
    assert has_negative(ids) is expected
    assert has_negative(array("i", ids)) is expected
    assert has_negative(array("i", ids)[1:]) is (min(ids[1:], default=0) < 0)  # a slice, as linking passes


def test_extremes() -> None:
    assert not has_negative(array("i"))
    assert not has_negative(array("i", [0, 2**31 - 1, 255, 128, 2**24]))
    assert has_negative(array("i", [5, -1]))
    assert has_negative(array("i", [-(2**31)]))
    assert has_negative(array("q", [1, -1]))  # other arrays: the plain `min`
