"""`runnercheck.impl.exact_ints`: one-pass checks that a sequence holds exact ints equal to expected values.

The steady-step reader relies on them for the scheduled and computed counts, so every kind of
element the boundary rejects by type (``type(x) is int`` fails) must make them False, on the
marshal path and on the fallback alike -- including the ones that compare equal to the expected
int (``True == 1``, ``5.0 == 5``, ``np.int64(5) == 5``), which a value comparison would accept.
"""
from __future__ import annotations

import enum

import numpy as np
import pytest

from runnercheck.impl import exact_ints
from runnercheck.impl.exact_ints import RepeatedInt, equal_exact_ints


class _Sub(int):
    pass


class _Enum(enum.IntEnum):
    FIVE = 5


EXPECTED = np.array([5, 70000, -3, 0, 2**31 - 1], np.int64)
GOOD = (5, 70000, -3, 0, 2**31 - 1)
# Each replaces the first element (5) by something equal to it, or not an int at all.
LOOKALIKES = [5.0, np.int64(5), np.int32(5), _Sub(5), _Enum.FIVE, "5", None, (5,)]


@pytest.fixture(params=["marshal", "fallback"])
def path(request, monkeypatch):
    if request.param == "marshal" and not exact_ints.FAST:
        pytest.skip("this interpreter's marshal does not write the expected layout")
    monkeypatch.setattr(exact_ints, "FAST", request.param == "marshal")
    return request.param


def test_exact_ints_equal_to_the_expected_values_pass(path):
    assert equal_exact_ints(GOOD, EXPECTED)
    assert equal_exact_ints(list(GOOD), EXPECTED)
    assert equal_exact_ints((), np.zeros(0, np.int64))


@pytest.mark.parametrize("lookalike", LOOKALIKES, ids=lambda v: type(v).__name__)
def test_an_element_of_another_type_fails_even_when_it_compares_equal(path, lookalike):
    values = (lookalike,) + GOOD[1:]
    assert not equal_exact_ints(values, EXPECTED)
    if lookalike == 5:  # the planted bug: a value comparison alone accepts it
        assert list(values) == EXPECTED.tolist()


def test_a_bool_fails_where_the_expected_value_is_one(path):
    assert equal_exact_ints((1, 0), np.array([1, 0]))
    assert not equal_exact_ints((True, 0), np.array([1, 0]))
    assert not equal_exact_ints((1, False), np.array([1, 0]))


@pytest.mark.parametrize("values", [GOOD[:-1], GOOD + (1,), (6,) + GOOD[1:], GOOD[:-1] + (2**31,), GOOD[:-1] + (-(2**40),)],
                         ids=["short", "long", "value", "past int32", "far negative"])
def test_a_wrong_length_or_value_fails(path, values):
    assert not equal_exact_ints(values, EXPECTED)


def test_repeated_int_matches_only_copies_of_the_exact_int(path):
    ones = RepeatedInt(1)
    assert ones.matches([1] * 300) and ones.matches([1] * 7) and ones.matches([])
    assert not ones.matches([1] * 6 + [2])
    for lookalike in (True, 1.0, np.int64(1), _Sub(1)):
        assert not ones.matches([1] * 3 + [lookalike] + [1] * 3), lookalike
    with pytest.raises(ValueError):
        RepeatedInt(2**31)
