"""Elastic runs under the real torchrun: a crashed worker group restarts, resumes and ends bit-for-bit the same.

The repeated crash-restart test is the proof behind ddpkit.torchrun's restart fix
(TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, see ddpkit/_torchrun.py): with torchrun's
defaults on a 2-core laptop, 2 of 4 such runs failed at the first restart and one hung.
"""

from __future__ import annotations

import contextlib
import io
import os
import pathlib

import pytest
import torch

import ddpkit

pytestmark = pytest.mark.usefixtures("no_leaks")

# The same script as notebooks/06_elastic.ipynb: rank 0 checkpoints atomically every 3 steps,
# rank 1 crashes at step 7 on the first attempt, every attempt resumes from the last checkpoint.
TRAIN = '''
import itertools, os, signal, sys
import torch, torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
import ddpkit

ckpt_dir, crash = sys.argv[1], sys.argv[2]       # crash: none | raise | exit | kill
EPOCHS, SAVE_EVERY, CRASH_AT = 3, 3, 7

env = ddpkit.setup_distributed()
torch.manual_seed(0)
X = torch.randn(128, 8)
Y = X @ torch.randn(8, 1) + 0.1 * torch.randn(128, 1)
data = TensorDataset(X, Y)
sampler = DistributedSampler(data, shuffle=True, seed=0)
loader = DataLoader(data, batch_size=16, sampler=sampler)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

path = os.path.join(ckpt_dir, "checkpoint.pt")
epoch, batch, step = 0, 0, 0
if os.path.exists(path):
    ckpt = torch.load(path)
    model.module.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    epoch, batch, step = ckpt["epoch"], ckpt["batch"], ckpt["step"]
if env.is_main:
    print(f"attempt {env.restart_count}: world size {env.world_size}, starting at step {step} (epoch {epoch}, batch {batch})")

def save_checkpoint():
    if env.is_main:
        state = {"model": model.module.state_dict(), "optimizer": opt.state_dict(),
                 "epoch": epoch, "batch": batch, "step": step}
        torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)
    dist.barrier()

while epoch < EPOCHS:
    sampler.set_epoch(epoch)
    for x, y in itertools.islice(loader, batch, None):
        if step == CRASH_AT and env.restart_count == 0 and env.rank == 1:
            if crash == "raise":
                raise RuntimeError(f"simulated crash at step {step}")
            if crash == "exit":
                os._exit(3)
            if crash == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step, batch = step + 1, batch + 1
        if step % SAVE_EVERY == 0:
            save_checkpoint()
    epoch, batch = epoch + 1, 0

if env.is_main:
    torch.save(model.module.state_dict(), os.path.join(ckpt_dir, "final.pt"))
    print(f"finished {step} steps, loss {loss.item():.2f}")
dist.destroy_process_group()
'''

RUNS = 10


def _train(workdir: pathlib.Path, crash: str, *extra: str) -> tuple[int, str, dict]:
    for name in ("checkpoint.pt", "final.pt"):
        with contextlib.suppress(FileNotFoundError):
            (workdir / name).unlink()
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = ddpkit.torchrun(TRAIN, "--standalone", "--nproc_per_node=2", *extra,
                                 script_args=[workdir, crash], timeout=150, agent_log="hide",
                                 # DDP makes torch create a compiler cache dir in TMPDIR: keep it in ours
                                 env={"TORCHINDUCTOR_CACHE_DIR": str(workdir / "inductor")})
    final = torch.load(workdir / "final.pt") if status == 0 else {}
    return status, out.getvalue(), final


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("reference")
    status, out, final = _train(workdir, "none")
    assert status == 0, out
    assert out.splitlines() == [
        "[rank0]: attempt 0: world size 2, starting at step 0 (epoch 0, batch 0)",
        f"[rank0]: finished 12 steps, loss {out.split('loss ')[-1].strip()}",
    ]
    return final


@pytest.mark.parametrize("run", range(RUNS))
def test_crash_restart_resume_is_reliable_and_bit_exact(run, reference, tmp_path):
    crash = ("raise", "exit", "kill")[run % 3]
    status, out, final = _train(tmp_path, crash, "--max-restarts=2")
    assert status == 0, f"run {run} ({crash}) failed:\n{out}"
    lines = out.splitlines()
    assert lines[:2] == [
        "[rank0]: attempt 0: world size 2, starting at step 0 (epoch 0, batch 0)",
        "[rank0]: attempt 1: world size 2, starting at step 6 (epoch 1, batch 2)",
    ], out
    assert final.keys() == reference.keys()
    for name, tensor in final.items():
        assert torch.equal(tensor, reference[name]), name  # bit for bit, not approximately


def test_without_restarts_the_crash_ends_the_run(tmp_path):
    status, out, _ = _train(tmp_path, "raise")  # --max-restarts defaults to 0
    assert status == 1
    assert out.splitlines() == ["[rank0]: attempt 0: world size 2, starting at step 0 (epoch 0, batch 0)"]
    assert torch.load(tmp_path / "checkpoint.pt")["step"] == 6  # the last checkpoint survives for the next run


STORE_PROBE = '''
import os, sys, time, datetime, torch.distributed as dist
attempt, rank = int(os.environ["TORCHELASTIC_RESTART_COUNT"]), int(os.environ["RANK"])
ports = os.path.join(sys.argv[1], "ports")
if rank == 0:
    with open(ports, "a") as f:
        print(os.environ["MASTER_PORT"], file=f)
if attempt == 1 and rank == 0 and os.environ["TORCHELASTIC_USE_AGENT_STORE"] == "True":
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=10))
    # rank 0 of the default group's gloo context publishes its address under this key
    print("before init, rank 0's gloo address is already in the store:", store.check(["default_pg/0//cpu//0/0"]))
if attempt == 1:
    sys.exit(0)  # the evidence is in; stop before the stale keys can break anything
dist.init_process_group("gloo")
dist.barrier()
if rank == 1:
    os._exit(3)
time.sleep(60)  # rank 0 waits until the agent stops it
'''


@pytest.mark.parametrize("share", ["0", "1"])
def test_the_root_cause_one_store_for_every_attempt(share, tmp_path, capfd):
    """Stock torchrun (share=0 here means sharing on) keeps the agent's store across restarts."""
    env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": share}
    status = ddpkit.torchrun(STORE_PROBE, "--standalone", "--nproc_per_node=2", "--max-restarts=1",
                             script_args=[tmp_path], env=env, timeout=120, agent_log="hide")
    assert status == 0
    out, _ = capfd.readouterr()
    first, second = (tmp_path / "ports").read_text().split()
    if share == "0":  # stock: the same store, still holding the dead attempt's gloo addresses
        assert first == second
        assert "[rank0]: before init, rank 0's gloo address is already in the store: True" in out
    else:  # ddpkit's default: a fresh store on a fresh port for every attempt
        assert first != second
        assert "already in the store" not in out
