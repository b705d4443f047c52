"""The fixed-tile kernels give a row the same bits whatever shares its launch, and the forward built
with ``batch_invariant=True`` computes the same model as the default one."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from runnercheck.impl.kernels import batch_invariant as bi


def test_linear_rows_are_bitwise_independent_of_the_batch():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(37, 48, generator=g)
    w = torch.randn(80, 48, generator=g)
    bias = torch.randn(80, generator=g)
    res = torch.randn(37, 80, generator=g)
    full = bi.linear(x, w, bias, residual=res)
    for rows in (slice(0, 1), slice(5, 8), slice(30, 37)):
        part = bi.linear(x[rows].contiguous(), w, bias, residual=res[rows].contiguous())
        assert torch.equal(part, full[rows]), rows
    torch.testing.assert_close(full, res + x @ w.T + bias, rtol=1e-5, atol=1e-5)


def test_rms_norm_rows_are_bitwise_independent_of_the_batch():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(9, 40, generator=g)
    w = torch.randn(40, generator=g)
    full = bi.rms_norm(x, w, 1e-6)
    assert torch.equal(bi.rms_norm(x[3:4].contiguous(), w, 1e-6), full[3:4])
    torch.testing.assert_close(full, F.rms_norm(x, (40,), w, 1e-6), rtol=1e-5, atol=1e-5)


def test_bad_operands_are_typed_errors():
    with pytest.raises(bi.BatchInvariantInputError, match="do not fit"):
        bi.linear(torch.zeros(2, 3), torch.zeros(4, 5))
    with pytest.raises(bi.BatchInvariantInputError, match="rms_norm"):
        bi.rms_norm(torch.zeros(2, 3), torch.zeros(4), 1e-6)


def test_batch_invariant_forward_matches_the_default_forward():
    from runnercheck.impl.device import Device
    from runnercheck.impl.model.forward import PagedDecoder
    from runnercheck.impl.model.weights import preset, random_weights

    weights = random_weights(preset("micro"), seed=0)
    outs = []
    for invariant in (False, True):
        dev = Device("cpu")
        model = PagedDecoder(weights, dev, dtype=torch.float32, num_kv_blocks=4, block_size=8, batch_invariant=invariant)
        n = 5
        logits = model.forward(
            torch.arange(n, dtype=torch.int64) + 3, torch.arange(n, dtype=torch.int64), torch.arange(n, dtype=torch.int64),
            torch.tensor([0, n], dtype=torch.int32), torch.tensor([n], dtype=torch.int32),
            torch.tensor([[0, 1]], dtype=torch.int32), torch.arange(n, dtype=torch.int64),
            num_reqs=1, num_tokens=n, max_query_len=n, max_seq_len=n)
        outs.append(logits)
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_and_norm_rows_do_not_depend_on_the_batch_on_cuda(dtype):
    """On a GPU the library kernels change tiling with M; the fixed tiles must not."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(300, 1024, device="cuda", generator=g).to(dtype)
    w = torch.randn(3072, 1024, device="cuda", generator=g).to(dtype)
    full = bi.linear(x, w)
    for rows in (slice(0, 1), slice(7, 10), slice(100, 229)):
        assert torch.equal(bi.linear(x[rows].contiguous(), w), full[rows]), rows
    norm_w = torch.randn(1024, device="cuda", generator=g).to(dtype)
    normed = bi.rms_norm(x, norm_w, 1e-6)
    assert torch.equal(bi.rms_norm(x[5:6].contiguous(), norm_w, 1e-6), normed[5:6])
    torch.testing.assert_close(full.float(), x.float() @ w.float().T, rtol=2e-2, atol=2e-1)
