"""One table of sampling fields (`runnercheck.impl.interface.SAMPLING_FIELDS`): every place that needs the set of
sampling parameters derives it from the table, and none lists them by hand (docs/EXTENDING.md, "Adding a sampling
parameter").

The hand-list test reads the product sources for a line naming several sampling fields; the fake-field tests add a
field to the table in-process (a `SamplingParams` subclass carrying it) and show that validation, the per-row device
state, the sampler contract, the chi-square binding catalogue, churn and coverage pick it up.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from runnercheck.impl import interface
from runnercheck.impl.interface import (
    SAMPLING_FIELD_NAMES,
    SAMPLING_FIELDS,
    RunnerLimits,
    SamplingField,
    SamplingParams,
    SamplingParamsError,
)

ROOT = Path(__file__).resolve().parents[2]
LIMITS = RunnerLimits(vocab_size=50, max_num_reqs=4, max_model_len=64, max_num_batched_tokens=32, num_kv_blocks=32,
                      block_size=4)


# --------------------------------------------------------------------------- the table itself


def test_the_table_is_the_dataclass_s_sampling_fields_with_their_defaults_as_neutral_values():
    defaults = {f.name: f.default for f in dataclasses.fields(SamplingParams)}
    assert SAMPLING_FIELD_NAMES == ("temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                                    "frequency_penalty", "presence_penalty")
    for spec in SAMPLING_FIELDS:
        assert defaults[spec.name] == spec.neutral and type(defaults[spec.name]) is type(spec.neutral)
        assert spec.accepts(spec.neutral), spec.name
        low, high = spec.draw
        assert spec.accepts(low) and spec.accepts(high), spec.name  # random workloads draw valid values


def test_validation_messages_are_those_the_hand_written_rules_gave():
    assert {f.name: f.rule for f in SAMPLING_FIELDS} == {
        "temperature": "be a finite number >= 0",
        "top_k": "be -1 (off) or >= 1",
        "top_p": "lie in (0, 1]",
        "min_p": "lie in [0, 1]",
        "repetition_penalty": "be a finite number > 0",
        "frequency_penalty": "lie in [-2, 2]",
        "presence_penalty": "lie in [-2, 2]",
    }
    with pytest.raises(SamplingParamsError, match=r"top_p=0.0: must lie in \(0, 1\]") as err:
        SamplingParams(top_p=0.0).validate(10, 5, req_id="r")
    assert err.value.field == "top_p" and err.value.req_id == "r"


@pytest.mark.parametrize("name", ["temperature", "repetition_penalty", "frequency_penalty", "top_p"])
def test_an_int_too_large_for_a_float_is_a_typed_rejection_not_an_overflow(name):
    # The per-field rules before the table called math.isnan / math.isfinite on it and raised OverflowError.
    with pytest.raises(SamplingParamsError, match=name):
        SamplingParams(**{name: 10**400}).validate(10, 5)


def test_a_table_row_without_its_dataclass_field_fails_at_import(monkeypatch):
    extra = SamplingField("typical_p", "float32", 1.0, 0.0, 1.0, "filter", "typical-p", "typ", (0.3, 0.9), "A fake.",
                          low_open=True)
    monkeypatch.setattr(interface, "SAMPLING_FIELDS", SAMPLING_FIELDS + (extra,))
    with pytest.raises(TypeError, match="typical_p"):
        interface._check_sampling_table()


# --------------------------------------------------------------------------- no hand lists left

# A hand list: a line naming three or more sampling fields as strings ("top_k") or as attributes (``state.top_k``,
# ``params.top_k``).  What a parameter *does* -- kernel arguments, the oracle's filters, a case's keyword arguments --
# names them as plain identifiers and is not matched.  The exceptions say why they are not a list of the fields.
_PRODUCT = ("impl", "checks", "stress", "reference")
_ALLOWED = {
    ("checks/chisq/sampler_contract.py", '``{"temperature", "top_k", "top_p"}``'): "a docstring's example declaration",
    ("checks/chisq/samplers.py", "torch_multinomial_sampler.supported_params"): "what that sampler implements",
    ("checks/chisq/cases.py", "PENALTY_VALUES = "): "tuned binding-case values (a field without one has a default)",
    ("checks/chisq/cases.py", 'case(("min_p",), ("top_k",), 0.6)'): "two chosen cases of the catalogue",
}


def _hand_lists() -> list[str]:
    found = []
    for package in _PRODUCT:
        for path in sorted((ROOT / package).rglob("*")):
            if path.suffix not in (".py", ".c", ".h"):
                continue
            rel = path.relative_to(ROOT).as_posix()
            for number, line in enumerate(path.read_text().splitlines(), 1):
                named = {n for n in SAMPLING_FIELD_NAMES if re.search(rf"[\"']{n}[\"']|\.{n}\b", line)}
                if len(named) >= 3 and not any(rel == f and marker in line for f, marker in _ALLOWED):
                    found.append(f"{rel}:{number}: {line.strip()}")
    return found


def test_no_product_source_lists_the_sampling_fields_by_hand():
    assert _hand_lists() == []


def test_the_hand_list_scan_finds_a_hand_list(tmp_path, monkeypatch):
    (tmp_path / "impl").mkdir()
    (tmp_path / "impl" / "x.py").write_text('NAMES = ("temperature", "top_k", "top_p")\n')
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert _hand_lists() == ['impl/x.py:1: NAMES = ("temperature", "top_k", "top_p")']


# --------------------------------------------------------------------------- every reader's set is the table's


def test_every_reader_s_field_set_is_the_table_s():
    from runnercheck.checks.chisq import binding as chisq_binding
    from runnercheck.checks.chisq import sampler_contract
    from runnercheck.impl import admission
    from runnercheck.impl import step_reader
    from runnercheck.stress.sim import churn
    from runnercheck.stress.run import coverage

    names = set(SAMPLING_FIELD_NAMES)
    assert set(sampler_contract.PARAM_FIELDS) == names
    assert set(chisq_binding.FILTERS) | {"temperature"} == names
    assert {name for name, _ in admission.ADMISSION_FIELDS} == names
    assert {rule[0] for rule in step_reader.BOUNDARY_RULES} == names
    labels = {f.label for f in SAMPLING_FIELDS if f.stage != "temperature"}
    assert set(coverage._KNOBS) == labels and set(churn._KNOBS) == labels
    assert {f"params: {k}" for k in labels} <= set(coverage.FEATURES)


def test_the_state_has_one_tensor_per_field_with_its_dtype_and_neutral_value():
    from runnercheck.impl.device import Device
    from runnercheck.impl.sample.state import SamplingState

    state = SamplingState(Device("cpu"), 3, 40)
    assert [t.name for t in state.params] == list(SAMPLING_FIELD_NAMES)
    for spec, tensor in zip(SAMPLING_FIELDS, state.params):
        assert getattr(state, spec.name) is tensor
        assert tensor.base.dtype == {"float32": torch.float32, "int32": torch.int32}[spec.dtype]
        assert torch.equal(tensor.base, torch.full_like(tensor.base, spec.neutral))


# --------------------------------------------------------------------------- a fake field added to the table

# Run in a fresh interpreter: the table is extended before any reader is imported (as a new row in interface.py
# would be), so no module of this test session is reloaded.  It prints what each reader made of the fake field.
_FAKE_FIELD_SCRIPT = r"""
import dataclasses, json, math, sys
import torch
from runnercheck.impl import interface
from runnercheck.impl.interface import SAMPLING_FIELDS, RunnerLimits, SamplingField, SamplingParams, SamplingParamsError

FAKE = SamplingField("typical_p", "float32", 1.0, 0.0, 1.0, "filter", "typical-p", "typ", (0.3, 0.9),
                     "Keep the locally typical tokens (a fake field).", low_open=True)

@dataclasses.dataclass(frozen=True)
class FakeParams(SamplingParams):
    typical_p: float = 1.0

LIMITS = RunnerLimits(vocab_size=50, max_num_reqs=4, max_model_len=64, max_num_batched_tokens=32, num_kv_blocks=32,
                      block_size=4)
old_names = [f.name for f in SAMPLING_FIELDS]
table = SAMPLING_FIELDS + (FAKE,)
interface.SAMPLING_FIELDS = table
interface.SAMPLING_FIELD_NAMES = tuple(f.name for f in table)
interface.SAMPLING_FIELDS_BY_NAME = {f.name: f for f in table}
interface.SamplingParams = FakeParams

from runnercheck.checks.chisq import binding as chisq_binding
from runnercheck.checks.chisq import sampler_contract
from runnercheck.impl.device import Device
from runnercheck.impl.sample.state import SamplingState
from runnercheck.impl import admission, step_reader
from runnercheck.stress.sim import churn
from runnercheck.stress.run import coverage

out = {}
FakeParams(typical_p=0.5).validate(10, 5)
try:
    FakeParams(typical_p=0.0).validate(10, 5)
except SamplingParamsError as err:
    out["rejected"] = str(err)
state = SamplingState(Device("cpu"), 3, 40)
out["tensor"] = [str(state.typical_p.base.dtype), state.typical_p.base.tolist(), state.params[-1] is state.typical_p]
staged = []
state._stage_admission = lambda row, values, prompt: staged.append(values)
state.add_request(1, FakeParams(typical_p=0.25, top_k=4), 3, [1, 2])
out["admission"] = list(staged[0])
out["kernel_params"] = [len(group) for group in state.kernel_params()]
out["admission_fields"] = [name for name, _ in admission.ADMISSION_FIELDS]
out["boundary_rules"] = [rule[0] for rule in step_reader.BOUNDARY_RULES]
out["in_use"] = sorted(sampler_contract.params_in_use(FakeParams(typical_p=0.5, top_k=3)))
def sampler(*args, **kwargs):
    raise AssertionError("not called")
sampler.supported_params = {"temperature", "top_k"}
out["unsupported"] = sampler_contract.declared_unsupported(sampler, FakeParams(typical_p=0.5))
out["binding_filters"] = list(chisq_binding.THRESHOLD_FILTERS)
out["active"] = list(chisq_binding.active_filters(FakeParams(typical_p=0.5)))
case = type("Case", (), {"params": FakeParams(typical_p=0.5)})()
out["moves"] = [[label, p.typical_p] for label, p in chisq_binding.filter_moves(case, "typical_p")]
out["rate"] = churn.field_rate(churn.ChurnConfig(), FAKE)
after = [churn.Churn(LIMITS, seed)._params(4) for seed in range(30)]
out["drawn_types"] = sorted({type(p).__name__ for p in after})
out["drawn_on"] = [p.typical_p for p in after if p.typical_p != 1.0]
out["old_fields_after"] = [[getattr(p, n) for n in old_names] for p in after]
out["plan"] = [list(plan) for plan in churn.PARAM_PLAN]
out["features"] = list(coverage.FEATURES)
out["param_features"] = coverage.param_features(FakeParams(typical_p=0.5, top_k=3))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def fake_field() -> dict:
    """What every reader made of a fake field appended to the table (in a fresh interpreter)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               CUDA_VISIBLE_DEVICES="", TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", _FAKE_FIELD_SCRIPT], check=False, capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_fake_field_is_validated_by_the_table_s_rule(fake_field):
    assert fake_field["rejected"] == "[field 'typical_p'] typical_p=0.0: must lie in (0, 1]"


def test_a_fake_field_gets_its_per_row_tensor_its_admission_value_and_its_c_layout(fake_field):
    assert fake_field["tensor"] == ["torch.float32", [1.0, 1.0, 1.0], True]
    assert fake_field["admission"] == [1.0, 4, 1.0, 0.0, 1.0, 0.0, 0.0, 0.25, 3]  # the table's order, then the seed
    assert fake_field["kernel_params"] == [5, 3]  # temperature and four filters; three penalties
    assert fake_field["admission_fields"][-1] == fake_field["boundary_rules"][-1] == "typical_p"


def test_a_fake_field_is_named_by_the_sampler_contract(fake_field):
    assert fake_field["in_use"] == ["top_k", "typical_p"]
    assert "typical_p" in fake_field["unsupported"]


def test_a_fake_field_is_a_filter_of_the_chi_square_binding_check(fake_field):
    assert fake_field["binding_filters"][-1] == "typical_p" and fake_field["active"] == ["typical_p"]
    assert fake_field["moves"] == [["typ 0.375", 0.375], ["typ 0.625", 0.625]]  # the generic step, both valid


def test_a_fake_field_is_drawn_by_churn_and_counted_by_coverage(fake_field):
    assert fake_field["rate"] == 0.3  # ChurnConfig.filter_prob: no typical_p_prob of its own
    assert fake_field["drawn_types"] == ["FakeParams"]
    assert fake_field["drawn_on"] and all(0.3 <= v <= 0.9 for v in fake_field["drawn_on"])
    assert ["top-k", "typical-p"] in fake_field["plan"] and "typical-p" in fake_field["plan"][-3]  # pairs, all filters
    assert {"params: typical-p", "combo: top-k + typical-p"} <= set(fake_field["features"])
    assert {"params: typical-p", "combo: top-k + typical-p"} <= set(fake_field["param_features"])


def test_existing_fields_draw_as_before_with_a_fake_field_appended(fake_field):
    """A new field goes last in the table, so a churn seed's first request draws the existing fields as it did (what
    follows its coin -- seed, logprobs, stop tokens, later requests -- moves on: repro files keep traces, not seeds)."""
    from runnercheck.stress.sim.churn import Churn

    before = [Churn(LIMITS, seed)._params(4) for seed in range(30)]  # this process: the table as it is
    assert fake_field["old_fields_after"] == [[getattr(p, n) for n in SAMPLING_FIELD_NAMES] for p in before]
