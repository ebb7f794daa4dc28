"""ZB-H1 run by DeepSpeed's pipeline engine (pipeswift_launch.zerobubble): the schedule's weight
passes, the deferred weight gradients against autograd's, and real 2-stage training through
`pswift run` with the losses of 1F1B."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from helpers import BF16, PSWIFT, copy_example, run_events, step_losses  # noqa: E402

pytestmark = [pytest.mark.deepspeed]


def _schedule(stages: int, micro_batches: int, stage: int) -> list[list[str]]:
    from pipeswift_launch.zerobubble import ZeroBubbleH1
    sched = ZeroBubbleH1(micro_batches=micro_batches, stages=stages, stage_id=stage)
    return [[type(c).__name__ + (f"{c.kwargs['buffer_id']}" if "buffer_id" in c.kwargs else "") for c in step]
            for step in sched.steps()]


@pytest.mark.parametrize("stages,micro_batches", [(2, 4), (4, 8), (4, 2), (1, 3)])
def test_every_backward_has_one_weight_pass_after_it_and_before_the_reduction(stages, micro_batches):
    from deepspeed.runtime.pipe.schedule import TrainSchedule
    for stage in range(stages):
        steps = _schedule(stages, micro_batches, stage)
        flat = [c for s in steps for c in s]
        # DeepSpeed's own instructions, in DeepSpeed's order: only weight passes were added
        ds = [[type(c).__name__ + (f"{c.kwargs['buffer_id']}" if "buffer_id" in c.kwargs else "") for c in s]
              for s in TrainSchedule(micro_batches=micro_batches, stages=stages, stage_id=stage).steps()]
        assert [c for c in flat if c not in ("WeightPass", "PostRecvGrad", "PostRecvActivation")
                and not c.startswith("PostSend")] == [
            c for s in ds for c in s]
        backwards = [i for i, c in enumerate(flat) if c.startswith("BackwardPass")]
        weights = [i for i, c in enumerate(flat) if c == "WeightPass"]
        assert len(backwards) == len(weights) == micro_batches
        assert all(b < w for b, w in zip(backwards, weights))        # W of micro-batch k after its B
        assert max(weights) < flat.index("ReduceTiedGrads")
        # ZB-H1's memory: no stage holds more micro-batches (forward done, weight pass not) than
        # the planner's memory check counts for it
        from pipeswift_slurm.planning.costmodel import held_micro_batches
        forwards = [i for i, c in enumerate(flat) if c.startswith("ForwardPass")]
        held = max(sum(f < i for f in forwards) - sum(w < i for w in weights) for i in range(len(flat) + 1))
        assert held <= held_micro_batches("zb-h1", stages, micro_batches, stage, min(stages - stage, micro_batches))


@pytest.mark.parametrize("stages,micro_batches", [(2, 4), (4, 8), (4, 2), (3, 5), (1, 3)])
def test_the_planner_simulates_the_order_the_engine_runs(stages, micro_batches):
    """The step model's ZB-H1 (simulate(..., as_run=True)) runs each stage's forwards, backwards
    and weight passes in the order the engine's instruction stream has them."""
    from pipeswift_slurm.planning.simulate import _order_zb_h1_as_run
    kind = {"ForwardPass": "F", "BackwardPass": "B", "WeightPass": "W"}
    for stage in range(stages):
        ran = [kind[k] for c in (c for s in _schedule(stages, micro_batches, stage) for c in s)
               if (k := c.rstrip("0123456789")) in kind]
        assert ran == [op for op, _, _ in _order_zb_h1_as_run(stage, stages, micro_batches)], stage


def test_a_weight_pass_never_delays_a_send_the_next_stage_waits_for():
    """Stage 0 of 2 runs its weight passes where it waits for stage 1's gradient (before RecvGrad)
    and sends each activation as soon as its forward is done; the last stage (which every other
    waits for) holds its weight passes back until ZB-H1's memory bound, then runs one right
    before a forward pass's input is received (filling that wait, after the previous gradient
    went), and the rest at the end. Every receive a send could find unposted is posted early,
    on every stage that receives it: each gradient's as soon as the backward that used the last
    one ran, each activation's as soon as the last one was received."""
    first = [c for s in _schedule(2, 4, 0) for c in s]
    last = [c for s in _schedule(2, 4, 1) for c in s]
    for stages, micro_batches in ((2, 4), (4, 8), (3, 5)):
        for stage in range(stages):
            flat = " ".join(c for s in _schedule(stages, micro_batches, stage) for c in s)
            grads = re.findall(r"(BackwardPass\d+) PostRecvGrad", flat)
            assert grads == (re.findall(r"BackwardPass\d+", flat)[:-1] if stage < stages - 1 else []), flat
            assert flat.count("PostRecvGrad") == len(grads)
            acts = re.findall(r"(RecvActivation\d+) PostRecvActivation", flat)
            assert acts == re.findall(r"RecvActivation\d+", flat)[:-1] and (stage == 0) == (not acts), flat
            assert flat.count("PostRecvActivation") == len(acts)
    first = [c for c in first if c != "PostRecvGrad"]
    last = [c for c in last if c != "PostRecvActivation"]
    assert all(first[i + 1].startswith("RecvGrad") or first[i + 1] == "WeightPass" or first[i + 1] == "ReduceTiedGrads"
               for i, c in enumerate(first) if c == "WeightPass")
    assert all(last[i + 1].startswith("RecvActivation") or last[i + 1] in ("WeightPass", "ReduceTiedGrads")
               for i, c in enumerate(last) if c == "WeightPass")
    assert all(last[i - 1].startswith("SendGrad") or last[i - 1] == "WeightPass"
               for i, c in enumerate(last) if c == "WeightPass")
    assert " ".join(last).endswith("BackwardPass1 SendGrad1 WeightPass WeightPass ReduceTiedGrads ReduceGrads OptimizerStep")
    assert "".join(last).count("ForwardPass") == 4 and not any(c.startswith("PostSend") for c in last)
    for stages, micro_batches in ((2, 4), (4, 8)):
        for stage in range(stages - 1):
            flat = [c for s in _schedule(stages, micro_batches, stage) for c in s]
            posts = [i for i, c in enumerate(flat) if c.startswith("PostSendActivation")]
            assert len(posts) == micro_batches and all(
                flat[i - 1] == "ForwardPass" + flat[i][len("PostSendActivation"):] for i in posts)


def _grads(model: torch.nn.Module, x: torch.Tensor, split: bool, micro_batches: int = 3,
           hooks: bool = False, hooked: bool = False) -> dict[str, torch.Tensor]:
    from pipeswift_launch.zerobubble import WeightGrads, split_linears
    store = WeightGrads(hooked=hooked)
    if split:
        assert split_linears(model, store) == sum(type(m) is torch.nn.Linear for m in model.modules())
    model.zero_grad(set_to_none=True)
    for k in range(micro_batches):
        def b(k: int = k) -> None:
            if hooks:   # saved-tensor hooks in the forward, as pswift's layer profiler has
                with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
                    out = model(x[k])
            else:
                out = model(x[k])
            out.float().pow(2).sum().backward()
        store.backward(b) if split else b()
        if split and k:
            store.weight()                         # W one micro-batch behind B, as on stage 0
    while store:
        store.weight()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("hooked", [False, True], ids=["added", "through-autograd"])
@pytest.mark.parametrize("hooks", [False, True], ids=["plain", "saved-tensor-hooks"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 5, 16), (3, 2, 7, 16), (3, 16)], ids=["3d", "4d", "2d"])
def test_deferred_weight_gradients_equal_autograds(dtype, shape, hooks, hooked):
    torch.manual_seed(0)

    def model() -> torch.nn.Module:
        torch.manual_seed(1)
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                                   torch.nn.Linear(32, 16, bias=False)).to(dtype)
    x = torch.randn(*shape, dtype=dtype)
    want = _grads(model(), x, split=False, hooks=hooks)
    got = _grads(model(), x, split=True, hooks=hooks, hooked=hooked)
    assert want.keys() == got.keys()
    bad = {n: float((want[n].float() - got[n].float()).abs().max()) for n in want if not torch.equal(want[n], got[n])}
    if dtype == torch.float32 and len(shape) == 3:
        assert bad == {}                              # the products autograd computes, bit for bit
    else:
        assert all(v <= 1e-5 * float(want[n].float().abs().max()) + (1e-2 if dtype == torch.bfloat16 else 0)
                   for n, v in bad.items()), bad


@pytest.mark.parametrize("hooked", [False, True])
def test_gradient_hooks_see_the_deferred_gradients_only_when_the_store_is_hooked(hooked):
    """The bf16 optimizer's immediate_grad_update takes each gradient from a post-accumulate
    hook: such a store hands W's products to autograd; a plain one adds them (no engine run)."""
    from pipeswift_launch.zerobubble import WeightGrads, split_linears
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 2)
    seen: list[torch.Tensor] = []

    def hook(p: torch.Tensor) -> None:       # B's undefined weight gradient runs it too
        if p.grad is not None:
            seen.append(p.grad.clone())
    lin.weight.register_post_accumulate_grad_hook(hook)
    store = WeightGrads(hooked=hooked)
    split_linears(lin, store)
    for k in range(2):
        store.backward(lambda k=k: lin(torch.full((3, 4), float(k + 1))).sum().backward())
        store.weight()
    assert torch.equal(lin.weight.grad, torch.full((2, 4), 9.0))
    # the last W's sum reaches the hook only through autograd
    assert ([float(s[0, 0]) for s in seen][-1:] == [9.0]) == hooked, seen


def test_a_backward_outside_the_schedule_keeps_its_weight_gradients():
    from pipeswift_launch.zerobubble import WeightGrads, split_linears
    lin = torch.nn.Linear(4, 2)
    store = WeightGrads()
    split_linears(lin, store)
    lin(torch.ones(3, 4)).sum().backward()
    assert not store and torch.equal(lin.weight.grad, torch.full((2, 4), 3.0))


def test_zb_h1_with_bf16_zero1_recompute_clipping_and_tied_layers_trains_with_1f1bs_losses(tmp_path):
    """The same job, 2 stages x 4 micro-batches through `pswift run`, under 1F1B and ZB-H1; its
    model has an nn.Linear shared by both stages (DeepSpeed's TiedLayerSpec), whose weight
    gradient is deferred on each stage and reduced across them after every weight pass."""
    runs = {s: _launch(_tied(_toml(tmp_path / s, BF16, s)), 2) for s in ("1f1b", "zb-h1")}
    (start,) = [e for e in run_events(runs["zb-h1"]) if e["event"] == "start"]
    bounds = start["boundaries"]
    assert bounds[0] < 1 < bounds[1] <= 6 < bounds[2], bounds     # the two uses on different stages
    want, got = step_losses(runs["1f1b"]), step_losses(runs["zb-h1"])
    assert sorted(got) == sorted(want) == list(range(1, 9))
    a, b = ({s: float.fromhex(h) for s, h in d.items()} for d in (got, want))
    assert all(abs(a[s] - b[s]) <= 1e-5 * abs(b[s]) for s in b), (a, b)
    _weight_passes_profiled_per_layer(runs, tmp_path)


def _weight_passes_profiled_per_layer(runs: dict[str, Path], tmp_path: Path) -> None:
    """ZB-H1's profile times each layer's weight pass W apart (part of the layer's seconds, as
    1F1B's backward holds it); 1F1B's has none; the history keeps it per layer."""
    import sqlite3

    from pipeswift_slurm.history.store import History
    profiles = {s: next(e for e in run_events(r) if e["event"] == "layer_profile") for s, r in runs.items()}
    assert not profiles["1f1b"].get("weight_seconds")
    zb = profiles["zb-h1"]
    w, sec = zb["weight_seconds"], zb["seconds"]
    blocks = [str(i) for i in range(2, 6)]        # the example's blocks (layers 1 and 6: the tied Mix)
    assert set(blocks) <= set(w) and all(0 < w[k] < sec[k] for k in blocks), (w, sec)
    h = History(tmp_path / "h.db")
    try:
        assert h.ingest_run_dir(runs["zb-h1"])
    finally:
        h.close()
    rows = dict(sqlite3.connect(tmp_path / "h.db").execute("SELECT layer, weight_seconds FROM layer_profiles"))
    assert {str(k): v for k, v in rows.items() if v is not None} == w


def test_a_zb_h1_job_stopped_resumes_on_fewer_stages_under_1f1b_with_the_uninterrupted_losses(tmp_path):
    """fp32: ZB-H1 on 4 stages, SIGTERM after 3 steps (a checkpoint), resumed from it on 2 stages
    under 1F1B: every step's loss is the uninterrupted 2-stage 1F1B run's, bit for bit."""
    want = step_losses(_launch(_toml(tmp_path / "ref", "", "1f1b"), 2))
    ckpt = tmp_path / "ckpt"
    stopped = _launch(_toml(tmp_path / "zb", "", "zb-h1", stages=4, ckpt=ckpt), 4, stop_after=3)
    resumed = _launch(_toml(tmp_path / "then", "", "1f1b", ckpt=ckpt), 2)
    (start,) = [e for e in run_events(resumed) if e["event"] == "start"]
    assert start["resumed_from"] and 3 <= start["step"] < 8 and start["stages"] == 2
    got = {**step_losses(stopped), **step_losses(resumed)}
    assert got == want and len(got) == 8


TIED_MODEL = """

from deepspeed.pipe import TiedLayerSpec


class Mix(nn.Module):
    \"\"\"x + Linear(x): one nn.Linear whose weight and bias the first and the last stage share.\"\"\"

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.lin = nn.Linear(hidden, hidden)

    def forward(self, x):
        return x + self.lin(x)


def build_tied_layers(hidden: int = 128, **kw):
    layers = build_layers(hidden=hidden, **kw)
    mix = TiedLayerSpec("mix", Mix, hidden, tied_weight_attr=["lin.weight", "lin.bias"])
    return [layers[0], mix, *layers[1:-1], mix, layers[-1]]
"""


def _tied(toml: Path) -> Path:
    """The example with TIED_MODEL's layers: a Mix shared by layer 1 and layer 6 of 8."""
    (toml.parent / "model.py").write_text((toml.parent / "model.py").read_text() + TIED_MODEL)
    toml.write_text(toml.read_text().replace('entry = "model:build_layers"', 'entry = "model:build_tied_layers"')
                    .replace("num_layers = 6", "num_layers = 8").replace("layer_costs = [", "# layer_costs = ["))
    return toml


def _toml(dst: Path, training: str, schedule: str, stages: int = 2, ckpt: Path | None = None) -> Path:
    """The example, 8 steps, ``stages`` stages x 4 micro-batches on as many local slots."""
    toml = copy_example(dst, {"steps": "8", "checkpoint_interval": "0", "stages": str(stages),
                              "nodes": str(stages), "data_parallel": "1"})
    extra = training + (f'checkpoint_dir = "{ckpt}"\n' if ckpt else "")
    toml.write_text(toml.read_text().replace("seed = 1\n", f"seed = 1\n{extra}")
                    .replace("[pipeline]\n", f'[pipeline]\nschedule = "{schedule}"\n'))
    return toml


def _launch(toml: Path, nodes: int, stop_after: int | None = None) -> Path:
    """`pswift run` of ``toml``; with ``stop_after``, SIGTERM once that many steps ran. Its run dir."""
    run = toml.parent / "run"
    proc = subprocess.Popen([*PSWIFT, "run", "--nodes", str(nodes), "--run-dir", str(run), str(toml)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if stop_after:
        deadline = time.time() + 300
        while sum(e["event"] == "step" for e in run_events(run, torn_ok=True)) < stop_after:
            assert time.time() < deadline and proc.poll() is None, proc.communicate()[0][-3000:]
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    schedules = {e["schedule"] for e in run_events(run) if e["event"] == "start"}
    assert schedules == {"zb-h1" if "zb-h1" in toml.read_text() else "1f1b"}, schedules
    return run
