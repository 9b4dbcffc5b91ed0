"""Checks for chapter 07's exercises (``notebooks/07_pipeline_parallel.ipynb``).

* 07.2 ``gpipe_idle(times, m)``: GPipe's idle fraction with free messages when stage ``i`` takes
  ``times[i]`` per microbatch, against :func:`ddpkit.replay_pipeline` of steps with those stage times
  (1 to 4 stages, equal and unequal, the slowest first, last or in the middle), and on the stage
  times measured in a real 2-rank GPipe step whose first stage is twice as deep;
* 07.3 ``peak_activation_bytes(schedule, p, m, batch, width)``: each rank's peak bytes of activations
  kept for backward, against the chapter's activation meter around real GPipe and 1F1B steps on 1, 2
  and 4 ranks (fewer microbatches than ranks included);
* 07.4 ``messages_per_step(schedule, p, m, v)``: the tensors one step sends between ranks, against the
  sends PyTorch's ``Schedule1F1B`` and ``ScheduleInterleaved1F1B`` make on 1, 2 and 3 ranks.

Exercise 1 asks for an explanation: the chapter offers a self-check (:func:`ddpkit.exercises.reveal`).
The workers below rebuild the chapter's stage (two linear layers with ``tanh``), its hand-written
pipeline step and its activation meter, at smaller sizes, so that a check takes seconds.
"""

from __future__ import annotations

from .. import _launch
from ._core import Wrong, exercise

CHAPTER = "07_pipeline_parallel"


# --------------------------------------------------------------------------- the chapter's pieces, on ranks


def _stage(i, width, blocks=1):
    import torch
    import torch.nn as nn

    layers = []
    for b in range(blocks):
        torch.manual_seed(100 * b + i)
        layers += [nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*layers)


def _order(schedule, rank, p, m):
    if schedule == "GPipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warmup = min(p - rank - 1, m)
    order = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", i) for i in range(m - warmup, m)]


def _pipeline_step(schedule, m, stage, x, target, timeline):
    """The chapter's hand-written step (section 2): isend, one unfinished send per direction."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    rank, p = dist.get_rank(), dist.get_world_size()
    xs, targets = x.chunk(m), target.chunk(m)
    inputs, outputs, in_flight = {}, {}, {}

    def send_to(tensor, dst):
        if dst in in_flight:
            in_flight[dst][0].wait()
        in_flight[dst] = (dist.isend(tensor, dst), tensor)

    for kind, i in _order(schedule, rank, p, m):
        if kind == "F":
            inp = xs[i]
            if rank > 0:
                inp = torch.empty_like(xs[i])
                dist.recv(inp, src=rank - 1)
                inp.requires_grad_()
            with timeline.span("F", i):
                out = stage(inp)
                if rank == p - 1:
                    out = F.mse_loss(out, targets[i]) / m
            if rank < p - 1:
                send_to(out.detach(), rank + 1)
            inputs[i], outputs[i] = inp, out
        else:
            inp, out, grad_out = inputs.pop(i), outputs.pop(i), None
            if rank < p - 1:
                grad_out = torch.empty_like(out)
                dist.recv(grad_out, src=rank + 1)
            with timeline.span("B", i):
                out.backward(grad_out)
            if rank > 0:
                send_to(inp.grad, rank - 1)
    for work, _ in in_flight.values():
        work.wait()


class _Meter:
    """The chapter's ActivationMeter (section 3): bytes autograd holds for backward, and their peak."""

    def __init__(self, module):
        self.weights = {q.untyped_storage().data_ptr() for q in module.parameters()}
        self.live, self.bytes, self.peak_bytes = {}, 0, 0

    def pack(self, t):
        if t.untyped_storage().data_ptr() in self.weights:
            return t
        key = (t.data_ptr(), tuple(t.shape))
        count, size = self.live.get(key, (0, t.numel() * t.element_size()))
        self.live[key] = (count + 1, size)
        if count == 0:
            self.bytes += size
            self.peak_bytes = max(self.peak_bytes, self.bytes)
        return _Held(t, self, key)

    def release(self, key):
        count, size = self.live.pop(key)
        if count > 1:
            self.live[key] = (count - 1, size)
        self.bytes -= size if count == 1 else 0

    def __call__(self):
        import torch

        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda h: h.tensor if isinstance(h, _Held) else h)


class _Held:
    def __init__(self, tensor, meter, key):
        self.tensor, self.meter, self.key = tensor, meter, key

    def __del__(self):
        self.meter.release(self.key)


def _batch(batch, width):
    import torch

    g = torch.Generator().manual_seed(1)
    return torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)


# --------------------------------------------------------------------------- 07.2 unequal stages


def _replayed_idle(times, m):
    """GPipe with stage ``i`` taking ``times[i]`` (a third forward, two thirds backward), replayed."""
    from .._timeline import Span, idle_fraction, replay_pipeline

    step = []
    for t in times:
        spans, clock = [], 0.0
        for kind, i in _order("GPipe", 0, len(times), m):
            length = t / 3 if kind == "F" else 2 * t / 3
            spans.append(Span(kind, str(i), clock, clock + length))
            clock += length
        step.append(spans)
    return idle_fraction(replay_pipeline(step))


def _unequal_gpipe(m, width, batch):
    """A GPipe step on 2 ranks whose rank 0 holds two blocks: each rank's F and B seconds."""
    import torch.distributed as dist

    import ddpkit

    rank = dist.get_rank()
    stage = _stage(rank, width, blocks=2 if rank == 0 else 1)
    x, target = _batch(batch, width)
    for _ in range(2):                                  # a warm-up step, then the recorded one
        stage.zero_grad(set_to_none=True)
        timeline = ddpkit.Timeline()
        _pipeline_step("GPipe", m, stage, x, target, timeline)
    return timeline.spans


def _as_float(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


@exercise("07.2", CHAPTER, "GPipe's idle fraction with unequal stages",
          "section 2 (the bubble formula) and exercise 2's hint")
def check_gpipe_idle(gpipe_idle) -> str:
    cases = [([1.0], 3), ([1.0, 1.0], 1), ([1.0, 1.0], 4), ([2.0, 1.0], 1), ([2.0, 1.0], 2), ([2.0, 1.0], 8),
             ([1.0, 2.0], 4), ([1.0, 3.0, 1.0], 4), ([1.0, 1.0, 1.0, 4.0], 5), ([0.5, 0.75, 0.5, 0.25], 16)]
    for times, m in cases:
        expected = _replayed_idle(times, m)
        raw = gpipe_idle(list(times), m)
        got = _as_float(raw)
        if got is None or abs(got - expected) > 1e-9:
            equal = max(times) == min(times)
            hint = ("with equal stages, count the slots a step lasts and the slots each rank computes" if equal else
                    "after the first microbatch has passed every stage once, the pipe delivers one microbatch "
                    "per time of its slowest stage, in the forwards and again in the backwards")
            raise Wrong(f"times={times}, m={m} ({len(times)} stage{'s' if len(times) > 1 else ''})",
                        round(expected, 6), raw if got is None else round(got, 6), hint)
    spans = _launch.launch(_unequal_gpipe, 2, args=(4, 256, 256), timeout=20)
    measured = [sum(s.seconds for s in rank) / 4 for rank in spans]
    reference = _replayed_idle(measured, 4)
    raw = gpipe_idle(list(measured), 4)
    got = _as_float(raw)
    if got is None or abs(got - reference) > 1e-6:
        raise Wrong(f"the stage times of a real 2-rank GPipe step, {[round(1e3 * t, 2) for t in measured]} ms, m=4",
                    round(reference, 6), raw, "the formula must hold for any positive times, not only whole numbers")
    return (f"your idle fraction equals the replayed pipeline's in all {len(cases)} cases (1 to 4 stages, 1 to 16 "
            "microbatches), and for the stage times measured in a real 2-rank GPipe step whose first stage is "
            "twice as deep.")


# --------------------------------------------------------------------------- 07.3 peak activations


def _peaks(cases, width, batch):
    import torch.distributed as dist

    import ddpkit

    rank = dist.get_rank()
    x, target = _batch(batch, width)
    out = []
    for schedule, m in cases:
        stage = _stage(rank, width)
        meter = _Meter(stage)
        with meter():
            _pipeline_step(schedule, m, stage, x, target, ddpkit.Timeline())
        out.append(meter.peak_bytes)
    return out


@exercise("07.3", CHAPTER, "each rank's peak activation bytes under GPipe and 1F1B",
          "section 3 (how many microbatches' activations each schedule keeps)")
def check_peak_activation_bytes(peak_activation_bytes) -> str:
    width, batch = 128, 64
    cases = {1: [("1F1B", 2), ("GPipe", 2)], 2: [("1F1B", 1), ("1F1B", 4), ("GPipe", 4)],
             4: [("1F1B", 2), ("GPipe", 2), ("1F1B", 8)]}
    checked = 0
    for p, per_world in cases.items():
        per_rank = _launch.launch(_peaks, p, args=(per_world, width, batch), timeout=20)
        for k, (schedule, m) in enumerate(per_world):
            expected = [rank[k] for rank in per_rank]
            got = peak_activation_bytes(schedule, p, m, batch, width)
            if not _numbers(got, p) or [int(b) for b in got] != expected:
                raise Wrong(f'schedule="{schedule}", p={p}, m={m}, batch={batch}, width={width}', expected,
                            got, _activation_hint(schedule, p, m, batch, width, got))
            checked += 1
    return (f"your peaks equal the bytes the activation meter counted on real ranks in all {checked} cases "
            f"(GPipe and 1F1B on 1, 2 and 4 ranks, 1 to 8 microbatches, batch {batch}, width {width}).")


def _numbers(got, p):
    try:
        return len(got) == p and all(float(b) == int(b) for b in got)
    except (TypeError, ValueError):
        return False


def _activation_hint(schedule, p, m, batch, width, got):
    tensor = batch // m * width * 4
    if not _numbers(got, p):
        return f"return a list of {p} byte counts, one per rank"
    held = [m if schedule == "GPipe" else min(m, p - r) for r in range(p)]
    without_target = [n * 3 * tensor for n in held]
    if [int(b) for b in got] == without_target:
        return "the last rank's loss saves a tensor of its own for backward"
    if schedule == "1F1B" and m < p and [int(b) for b in got] == [(p - r) * (3 + (r == p - 1)) * tensor
                                                                  for r in range(p)]:
        return "a rank cannot hold more microbatches than there are"
    return ("count the tensors one stage's layers save for a microbatch (a tensor saved by two layers once), "
            "then how many microbatches each rank holds at its peak under this schedule")


# --------------------------------------------------------------------------- 07.4 messages per step


def _sends(cases, width, batch):
    """Per case: the tensors PyTorch's schedule sends to other ranks in one step (after a first step)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B

    rank, p = dist.get_rank(), dist.get_world_size()
    x, target = _batch(batch, width)
    out = []
    for schedule, m, v in cases:
        indices = [rank] if schedule == "1F1B" else [rank + k * p for k in range(v)]   # loop placement
        n_stages = p * (1 if schedule == "1F1B" else v)
        stages = [PipelineStage(_stage(i, width), i, n_stages, torch.device("cpu")) for i in indices]
        runner = (Schedule1F1B(stages[0], m, loss_fn=F.mse_loss) if schedule == "1F1B"
                  else ScheduleInterleaved1F1B(stages, m, loss_fn=F.mse_loss))
        sent = [0]
        for stage in stages:
            for name in ("get_fwd_send_ops", "get_bwd_send_ops"):
                def counting(*args, _get=getattr(stage, name), **kwargs):
                    ops = _get(*args, **kwargs)
                    sent[-1] += len(ops)
                    return ops
                setattr(stage, name, counting)
        first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
        for _ in range(2):                              # the first step also exchanges shapes
            sent.append(0)
            runner.step(*([x] if first else []), target=target if last else None)
        out.append(sent[-1])
    return out


@exercise("07.4", CHAPTER, "the messages a 1F1B and an interleaved 1F1B step send",
          "section 4 and the deeper notebook's section 4 (interleaved 1F1B)")
def check_messages_per_step(messages_per_step) -> str:
    width, batch = 32, 24
    cases = {1: [("1F1B", 2, 1), ("Interleaved1F1B", 2, 2)],
             2: [("1F1B", 2, 1), ("1F1B", 4, 1), ("Interleaved1F1B", 4, 2)],
             3: [("1F1B", 3, 1), ("Interleaved1F1B", 3, 2), ("Interleaved1F1B", 6, 3)]}
    checked = 0
    for p, per_world in cases.items():
        per_rank = _launch.launch(_sends, p, args=(per_world, width, batch), timeout=20)
        for k, (schedule, m, v) in enumerate(per_world):
            expected = sum(rank[k] for rank in per_rank)
            got = messages_per_step(schedule, p, m, v)
            if got != expected:
                hint = ("stages that share a rank hand their tensors over without a message" if p == 1 else
                        "count both directions: activations forward and gradients back, at every stage boundary "
                        "that lies between two ranks")
                raise Wrong(f'schedule="{schedule}", p={p}, m={m}, v={v} ({p * v} stage{"s" if p * v > 1 else ""} '
                            f"on {p} rank{'s' if p > 1 else ''})", expected, got, hint)
            checked += 1
    return (f"your counts equal the sends of PyTorch's Schedule1F1B and ScheduleInterleaved1F1B on real ranks in "
            f"all {checked} cases (1, 2 and 3 ranks, 1 to 3 stages per rank).")
