"""`runnercheck.impl.kernels.interpreter`: nested jit calls under the Triton interpreter skip re-patching the
language only when the running launch has already patched every language module they see."""
from __future__ import annotations

from types import FunctionType, SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl

from runnercheck.impl.device import triton_interpreted
from runnercheck.impl.kernels.interpreter import NestedPatchCache, _memoised, layout_known, speed_up_interpreter

interpreted = pytest.mark.skipif(not triton_interpreted(), reason="kernels run on a GPU, not in the interpreter")


@triton.jit
def _doubled(x):
    return x * 2.0


@triton.jit
def _nested_calls_kernel(src, dst, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    value = tl.load(src + offsets, mask=mask)
    for _ in range(3):
        value = _doubled(value)
    tl.store(dst + offsets, tl.multiple_of(value, 1), mask=mask)


def _launch(n: int = 30, block: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.arange(n, dtype=torch.float32)
    dst = torch.zeros_like(src)
    _nested_calls_kernel[(triton.cdiv(n, block),)](src, dst, n, BLOCK=block)
    return src, dst


@interpreted
def test_the_test_process_has_it_installed():
    from triton.runtime import interpreter

    assert speed_up_interpreter() is True and speed_up_interpreter() is True  # idempotent
    assert isinstance(getattr(interpreter._patch_lang, "__self__", None), NestedPatchCache)


@interpreted
def test_a_launch_patches_the_language_once_and_computes_the_same(monkeypatch):
    from triton.runtime import interpreter

    full_patches = []
    original_core_patch = interpreter._patch_lang_core
    monkeypatch.setattr(interpreter, "_patch_lang_core",
                        lambda lang, scope: (full_patches.append(lang), original_core_patch(lang, scope))[1])
    src, dst = _launch()  # 4 programs x 3 nested calls: Triton alone would patch 13 times
    assert full_patches == [tl]
    assert torch.equal(dst, src * 8)


@interpreted
def test_the_language_is_restored_after_a_launch():
    before = {name: getattr(tl, name) for name in ("load", "store", "multiple_of", "range", "reduce")}
    _launch()
    assert {name: getattr(tl, name) for name in before} == before


def _fn(*modules) -> FunctionType:
    return FunctionType((lambda: None).__code__, {f"m{i}": m for i, m in enumerate(modules)} | {"torch": torch})


def test_the_cache_skips_only_languages_the_launch_already_patched():
    calls = []
    cache = NestedPatchCache(lambda fn: calls.append(fn) or f"scope{len(calls)}", (tl, tl.core))
    sees_tl, sees_core, sees_both = _fn(tl), _fn(tl.core), _fn(tl, tl.core)

    assert cache.patch_lang(sees_tl) == "scope1" and cache.patch_lang(sees_tl) == "scope2"  # outside a launch: always
    with cache.launch():
        assert cache.patch_lang(sees_tl) == "scope3"  # the launch's own patch
        cache.patch_lang(sees_tl).restore()  # a nested call seeing only tl: skipped
        assert len(calls) == 3
        assert cache.patch_lang(sees_core) == "scope4"  # tl.core not patched yet: patched
        cache.patch_lang(sees_both)
        with cache.launch():  # a launch inside a launch records its own patch
            assert cache.patch_lang(sees_tl) == "scope5"
            cache.patch_lang(sees_tl)
        cache.patch_lang(sees_core)
    assert len(calls) == 5
    with pytest.raises(RuntimeError), cache.launch():
        cache.patch_lang(sees_tl)
        raise RuntimeError("a kernel failed")
    assert cache.patch_lang(sees_tl) == "scope7"  # the failed launch left nothing behind


def test_a_function_whose_module_imports_a_language_later_is_patched_again():
    calls = []
    cache = NestedPatchCache(lambda fn: calls.append(fn), (tl, tl.core))
    fn = _fn(tl)
    with cache.launch():
        cache.patch_lang(fn)
        cache.patch_lang(fn)
        fn.__globals__["core"] = tl.core  # the module grew a language: looked up again, patched
        cache.patch_lang(fn)
    assert len(calls) == 2


@interpreted
def test_the_dtype_memo_answers_what_triton_does_for_every_kind_of_type():
    from triton.runtime import interpreter

    plain = interpreter._get_np_dtype.__wrapped__  # Triton's own
    memoised = _memoised(plain)
    types = [tl.float32, tl.int32, tl.block_type(tl.float32, [4]), tl.block_type(tl.int64, [4]), tl.block_type(tl.int64, [8]),
             tl.pointer_type(tl.float16), tl.block_type(tl.pointer_type(tl.int8), [2]), tl.int1, tl.bfloat16]
    for _ in range(2):  # the second round answers from the memo
        assert [memoised(t) for t in types] == [plain(t) for t in types]


def _patch_lang(fn):
    return None


class _Launch:
    def __call__(self):
        return _patch_lang(None)  # looked up by name, as Triton's launch does


class _NestedThatDoesNotPatch:
    def __call__(self):
        return None


def test_an_interpreter_laid_out_otherwise_is_left_alone():
    known = SimpleNamespace(_patch_lang=_patch_lang, _get_np_dtype=str, GridExecutor=_Launch, InterpretedFunction=_Launch)
    assert layout_known(known)
    assert not layout_known(SimpleNamespace(**{**vars(known), "InterpretedFunction": _NestedThatDoesNotPatch}))
    assert not layout_known(SimpleNamespace(**{k: v for k, v in vars(known).items() if k != "_get_np_dtype"}))
    assert not layout_known(SimpleNamespace(**{k: v for k, v in vars(known).items() if k != "GridExecutor"}))
