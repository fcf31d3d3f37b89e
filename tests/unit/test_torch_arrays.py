"""The torch array operations of the gradient formulas give what the NumPy ones give: the shifts
along time (written into one new tensor) and the product with a shifted array (computed where
the array is)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from explorer.gradients import NUMPY  # noqa: E402
from explorer.torch_arrays import TorchOps, sum_to  # noqa: E402

OPS = TorchOps()
RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 4, 7))          # batch (2, 3), N = 4, L = 7
INIT = RNG.standard_normal((2, 3, 4, 1))


@pytest.mark.parametrize("k", [1, 2, 7, 9])
@pytest.mark.parametrize("init", [None, INIT])
def test_shift_matches_numpy(k: int, init):
    want = NUMPY.shift(X, k, init, 7)
    got = OPS.shift(torch.tensor(X), k, None if init is None else torch.tensor(init), 7)
    np.testing.assert_array_equal(got.numpy(), want)


def test_next_matches_numpy():
    np.testing.assert_array_equal(OPS.next(torch.tensor(X)).numpy(), NUMPY.next(X))
    one = X[..., :1]
    np.testing.assert_array_equal(OPS.next(torch.tensor(one)).numpy(), one)


@pytest.mark.parametrize("k", [1, 2, 9])
@pytest.mark.parametrize("init", [None, INIT])
@pytest.mark.parametrize("r_shape", [(2, 3, 4, 7), (2, 3, 1, 7), (1, 3, 4, 1), (2, 3, 4, 1)])
def test_product_with_a_shifted_array_matches_numpy(k: int, init, r_shape):
    r = RNG.standard_normal(r_shape)
    want = NUMPY.mul_shifted(r, X, k, init, 7)
    got = OPS.mul_shifted(torch.tensor(r), torch.tensor(X), k,
                          None if init is None else torch.tensor(init), 7)
    assert tuple(got.shape) == want.shape
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-15, atol=0)


def test_dense_returns_a_tensor_of_its_own():
    like = torch.zeros(())
    x = torch.tensor(X)
    assert OPS.dense(x, tuple(X.shape), like.double()) is x          # already its own
    b = torch.tensor(X[:, :, :1]).expand(X.shape)                     # a broadcast view
    d = OPS.dense(b, tuple(X.shape), like.double())
    assert d.is_contiguous() and 0 not in d.stride()
    np.testing.assert_array_equal(d.numpy(), np.broadcast_to(X[:, :, :1], X.shape))
    small = OPS.dense(torch.tensor(X[:, :, :1]), tuple(X.shape), like.double())
    np.testing.assert_array_equal(small.numpy(), np.broadcast_to(X[:, :, :1], X.shape))


def test_sum_to_sums_what_the_kernels_did_not_and_leaves_the_rest():
    """A lane readout summed to a batch shape: over the axes that shape holds as 1; one the
    kernels summed already (ones there) comes back as it is, the same tensor."""
    x = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)
    torch.testing.assert_close(sum_to(x, (2, 1)), x.sum(1, keepdim=True))
    torch.testing.assert_close(sum_to(x, (1, 3)), x.sum(0, keepdim=True))
    torch.testing.assert_close(sum_to(x, (1, 1)), x.sum((0, 1), keepdim=True))
    summed = x.sum(1, keepdim=True)
    assert sum_to(summed, (2, 1)) is summed
    assert sum_to(x, (2, 3)) is x
