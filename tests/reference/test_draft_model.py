"""The oracle's draft-model proposer (`runnercheck.reference.draft_model`): docs/SAMPLING.md "Draft-model proposer"."""
from __future__ import annotations

import pytest
import torch

from runnercheck.impl.interface import DraftModelConfig, SamplingParams
from runnercheck.impl.model.weights import DraftVocabMismatchError, preset
from runnercheck.reference.draft_model import ReferenceDraftModel
from runnercheck.reference.rng import DRAFT_STREAM
from runnercheck.reference.sampler import distribution, sample
from runnercheck.reference.spec_verify import resample

TOKENS = [3, 17, 3, 17, 5]


@pytest.fixture(scope="module")
def draft() -> ReferenceDraftModel:
    return ReferenceDraftModel(DraftModelConfig("micro-draft", 3, weights_seed=4), preset("micro"))


def test_greedy_drafts_are_the_draft_models_greedy_continuation(draft: ReferenceDraftModel) -> None:
    params = SamplingParams(temperature=0.0, repetition_penalty=1.3)
    prop = draft.propose(TOKENS, 3, params, seed=9, prompt=TOKENS[:3], outputs=TOKENS[3:])
    seq = list(TOKENS)
    for j, d in enumerate(prop.drafts):
        logits = draft.model.logits(seq)[-1]
        assert d == sample(logits, params, 9, len(seq), TOKENS[:3], TOKENS[3:] + list(prop.drafts[:j])).token
        assert prop.q[j, d] == 1.0 and prop.q[j].sum() == 1.0  # a point mass
        seq.append(d)


def test_random_drafts_are_gumbel_max_over_q_with_the_draft_stream(draft: ReferenceDraftModel) -> None:
    params = SamplingParams(temperature=1.5, top_k=30, frequency_penalty=0.4)
    prop = draft.propose(TOKENS, 3, params, seed=11, prompt=TOKENS[:3], outputs=TOKENS[3:])
    assert prop.q.shape == (3, 256) and len(prop.fragile) == 3
    seq = list(TOKENS)
    for j, d in enumerate(prop.drafts):
        q, _ = distribution(draft.model.logits(seq)[-1], params, TOKENS[:3], TOKENS[3:] + list(prop.drafts[:j]))
        torch.testing.assert_close(prop.q[j], q)
        assert int((q > 0).sum()) == 30  # top-k kept
        assert d == resample(q, 11, len(TOKENS) + j, stream=DRAFT_STREAM)[0]
        seq.append(d)
    other = draft.propose(TOKENS, 3, params, seed=12, prompt=TOKENS[:3], outputs=TOKENS[3:])
    assert other.drafts != prop.drafts  # the seed keys the noise (fixed seeds: deterministic)


def test_a_draft_preset_with_another_vocabulary_is_refused() -> None:
    with pytest.raises(DraftVocabMismatchError, match="vocabulary"):
        ReferenceDraftModel(DraftModelConfig("tiny-draft", 2), preset("micro"))
    with pytest.raises(DraftVocabMismatchError, match="max_model_len"):
        ReferenceDraftModel(DraftModelConfig("micro-draft", 2), preset("tiny").__class__(vocab_size=256, max_model_len=512))
