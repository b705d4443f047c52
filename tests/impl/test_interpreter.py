"""`impl.kernels.interpreter`: nested jit calls under the Triton interpreter skip re-patching the
language only when the running launch has already patched every language module they see."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl

from impl.device import triton_interpreted
from impl.kernels.interpreter import NestedPatchCache, speed_up_nested_calls

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

    assert speed_up_nested_calls() is True and speed_up_nested_calls() is True  # idempotent
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


def _fn(*modules) -> SimpleNamespace:
    return SimpleNamespace(__globals__={f"m{i}": m for i, m in enumerate(modules)} | {"torch": torch})


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
