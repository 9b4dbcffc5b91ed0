"""The shipped dataset and the small helpers around it: what chapters 04 and 05 rely on."""

from __future__ import annotations

import hashlib
import importlib.util
import shutil

import pytest
import torch

import ddpkit
from ddpkit import _data


def _make_digits_module():
    spec = importlib.util.spec_from_file_location("make_digits", _data.DATA_DIR / "make_digits.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_shipped_file_is_the_published_one():
    data = (_data.DATA_DIR / "digits.csv.gz").read_bytes()
    assert hashlib.sha256(data).hexdigest() == _make_digits_module().SHA256


def test_fixed_split_shapes_types_and_ranges():
    d = ddpkit.load_digits()
    assert d.x_train.shape == (1440, 64) and d.x_test.shape == (357, 64)
    assert d.y_train.shape == (1440,) and d.y_test.shape == (357,)
    assert d.x_train.dtype == torch.float32 and d.y_train.dtype == torch.int64
    assert float(d.x_train.min()) == 0.0 and float(d.x_train.max()) == 1.0
    # pixels are counts 0..16 scaled by 1/16: every value is a multiple of 1/16
    assert torch.equal(d.x_train * 16, (d.x_train * 16).round())
    assert set(d.y_train.tolist()) == set(range(10)) == set(d.y_test.tolist())


def test_split_is_by_position_and_balanced():
    d = ddpkit.load_digits()
    assert d.y_train[:10].tolist() == list(range(10))
    assert d.y_train.bincount().tolist() == [143, 146, 143, 147, 145, 145, 144, 143, 141, 143]
    assert d.y_test.bincount().tolist() == [35, 36, 34, 36, 36, 37, 37, 36, 33, 37]
    # train and test are disjoint parts of one file of 1,797 samples
    x = torch.cat([d.x_train, d.x_test])
    assert len(x) == 1797


def test_each_call_returns_fresh_tensors():
    a = ddpkit.load_digits()
    a.x_train.zero_()
    a.y_test.fill_(-1)
    b = ddpkit.load_digits()
    assert float(b.x_train.sum()) > 0 and int(b.y_test.min()) == 0


def test_data_dir_override_and_a_helpful_error(tmp_path):
    shutil.copy(_data.DATA_DIR / "digits.csv.gz", tmp_path / "digits.csv.gz")
    assert torch.equal(ddpkit.load_digits(tmp_path).x_test, ddpkit.load_digits().x_test)
    with pytest.raises(FileNotFoundError, match="pip install -e"):
        ddpkit.load_digits(tmp_path / "missing")


def test_digits_mlp_is_seeded_and_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a, b = ddpkit.digits_mlp(seed=7), ddpkit.digits_mlp(seed=7)
    assert torch.rand(3).equal(expected)  # building seeded models drew nothing from the global RNG
    assert ddpkit.max_abs_diff(a, b) == 0.0
    assert ddpkit.max_abs_diff(a, ddpkit.digits_mlp(seed=8)) > 0.0
    # seed=None draws from the global RNG, as nn.Linear does
    assert ddpkit.max_abs_diff(ddpkit.digits_mlp(seed=None), ddpkit.digits_mlp(seed=None)) > 0.0


def test_digits_mlp_shapes():
    model = ddpkit.digits_mlp(hidden=32, depth=3)
    assert model(torch.zeros(5, 64)).shape == (5, 10)
    assert sum(isinstance(m, torch.nn.Linear) for m in model) == 4


def test_max_abs_diff_ignores_the_ddp_prefix_and_checks_keys():
    m = torch.nn.Linear(2, 3)
    prefixed = {"module." + k: v.clone() for k, v in m.state_dict().items()}
    assert ddpkit.max_abs_diff(m, prefixed) == 0.0
    prefixed["module.bias"] += 0.5
    assert ddpkit.max_abs_diff(prefixed, m) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="only in a"):
        ddpkit.max_abs_diff(m, {"weight": m.weight})
    with pytest.raises(ValueError, match="shape"):
        ddpkit.max_abs_diff(m, torch.nn.Linear(3, 3))


def test_score():
    assert ddpkit.Score(3, 4).accuracy == 0.75
    assert ddpkit.Score(3, 4) == ddpkit.Score(3, 4) != ddpkit.Score(3, 5)


def test_pid_tagged_counts_the_processes_that_load_batches():
    import os

    from torch.utils.data import DataLoader, TensorDataset

    from ddpkit import PidTagged  # public: chapter 05 imports it the same way

    tagged = PidTagged(TensorDataset(torch.arange(8.0), torch.arange(8)))
    assert len(tagged) == 8 and tagged[3][:2] == (torch.tensor(3.0), torch.tensor(3)) and tagged[3][2] == os.getpid()
    assert PidTagged(list("abc"))[1] == ("b", os.getpid())
    loader = DataLoader(tagged, batch_size=4, num_workers=1, multiprocessing_context="fork")
    pids = {int(p) for _, _, batch_pids in loader for p in batch_pids}
    assert len(pids) == 1 and os.getpid() not in pids  # one worker process loaded everything
    with pytest.raises(TypeError, match="TensorDataset"):
        PidTagged(5)


def test_relative_gaps_scale_each_entry_by_its_layer():
    reference = {"output": torch.tensor([10.0, -20.0]), "mlp.w1.weight": torch.tensor([[1.0, -2.0]]),
                 "mlp.w1.bias": torch.tensor([1e-9]), "norm.weight": torch.zeros(2)}
    found = {"output": torch.tensor([10.0, -18.0]), "mlp.w1.weight": torch.tensor([[1.0, -2.0]]),
             "mlp.w1.bias": torch.tensor([2e-9]), "norm.weight": torch.zeros(2)}
    gaps = ddpkit.relative_gaps(found, reference)
    assert gaps == pytest.approx({"output": 0.1, "mlp.w1.weight": 0.0, "mlp.w1.bias": 5e-10, "norm.weight": 0.0})
    found["norm.weight"] = torch.tensor([0.0, 1e-3])
    assert ddpkit.relative_gaps(found, reference)["norm.weight"] == float("inf")  # all-zero layer, a difference
    with pytest.raises(ValueError, match="only in found"):
        ddpkit.relative_gaps({**found, "extra": torch.zeros(1)}, reference)
    with pytest.raises(ValueError, match="shape"):
        ddpkit.relative_gaps({**found, "output": torch.zeros(3)}, reference)
