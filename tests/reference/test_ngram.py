"""The oracle's n-gram proposer (`runnercheck.reference.ngram`) on hand-worked cases of docs/SAMPLING.md's rule."""
from __future__ import annotations

import pytest

from runnercheck.impl.interface import NgramConfig
from runnercheck.reference.ngram import propose_ngram


@pytest.mark.parametrize("tokens, config, drafts", [
    # n=3 finds nothing; n=2 suffix [1, 2] occurs at 0: continue 3, 1, 2 (period 5 - 2 - 0 = 3).
    ([1, 2, 3, 1, 2], NgramConfig(3, 1, 3), (3, 1, 2)),
    # The longest n wins even when a shorter one matches later: n=2 [4, 5] at 0 beats n=1 [5] at 3.
    ([4, 5, 6, 5, 9, 4, 5], NgramConfig(2, 1, 2), (6, 5)),
    # The most recent occurrence: [1] at 3 (not at 1), continuing 9, 1, 9 (period 2).
    ([7, 1, 8, 1, 9, 1], NgramConfig(3, 1, 1), (9, 1, 9)),
    # A run of one token: period 1.
    ([5, 5, 5], NgramConfig(4, 1, 3), (5, 5, 5, 5)),
    # No match (min_n 2): the last token repeated.
    ([7, 1, 8, 1], NgramConfig(3, 2, 3), (1, 1, 1)),
    ([3], NgramConfig(2, 1, 3), (3, 3)),
    # The suffix itself is never its own match: [2, 3] ends the sequence and occurs only there.
    ([1, 2, 3], NgramConfig(2, 2, 2), (3, 3)),
])
def test_the_rule_on_hand_worked_cases(tokens: list[int], config: NgramConfig, drafts: tuple[int, ...]) -> None:
    assert propose_ngram(tokens, config) == drafts


@pytest.mark.parametrize("kw", [dict(num_spec_tokens=0), dict(min_n=0), dict(min_n=3, max_n=2), dict(max_n=True)])
def test_bad_configs_are_typed_errors(kw: dict) -> None:
    with pytest.raises(ValueError):
        NgramConfig(**kw)
