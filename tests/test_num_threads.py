"""``set_num_threads``/``get_num_threads``: NumPy's BLAS threads, with PyTorch's errors."""
import pytest

import distgrad

pytestmark = pytest.mark.timeout(60)


def test_the_number_is_set_and_read_back():
    before = distgrad.get_num_threads()
    try:
        distgrad.set_num_threads(1)
        assert distgrad.get_num_threads() == 1
        distgrad.set_num_threads(2)
        assert distgrad.get_num_threads() == 2
    finally:
        distgrad.set_num_threads(before)


@pytest.mark.parametrize("value", [0, -1, 1.5, "2", True])
def test_bad_numbers_raise_as_in_torch(value):
    with pytest.raises(RuntimeError) as ours:
        distgrad.set_num_threads(value)
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError) as theirs:
        torch.set_num_threads(value)
    assert str(ours.value) == str(theirs.value)
