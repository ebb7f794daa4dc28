"""Canary for DeepSpeed's private API (launch/pipeswift_launch/ds_compat.py): every access pswift
makes, exercised in seconds on CPU without Slurm, so a DeepSpeed upgrade that breaks one fails
here with its name rather than deep in an end-to-end run."""

from __future__ import annotations

import pytest
from helpers import run_dist_child

pytestmark = [pytest.mark.deepspeed]

CANARY = r'''
import os, socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                  MASTER_PORT=str(port), DS_ACCELERATOR="cpu")
import torch, deepspeed
from deepspeed.pipe import LayerSpec
from pipeswift_launch import ds_compat
print("version", ds_compat.check_version())
ds_compat.skip_shm_build()
deepspeed.init_distributed(dist_backend="gloo")
layers = [LayerSpec(torch.nn.Linear, 4, 4) for _ in range(3)]
model = ds_compat.ExplicitPipe(layers, parts=[0, 3], num_stages=1, loss_fn=torch.nn.functional.mse_loss)
assert model.parts == [0, 3], model.parts
ds_compat.mark_model_parallel(model.parameters())
assert all(p.model_parallel for p in model.parameters())
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config={
    "train_batch_size": 2, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}, "steps_per_print": 10**9,
    "zero_optimization": {"stage": 0}})
table = ds_compat.instruction_table(engine)
assert table and all(callable(f) for f in table.values())
seen = []
ds_compat.set_instruction_table(engine, {k: (lambda f, n: lambda *a, **kw: (seen.append(n), f(*a, **kw))[1])(f, k.__name__)
                                         for k, f in table.items()})
batches = [(torch.randn(1, 4), torch.randn(1, 4)) for _ in range(2)]
engine.train_batch(data_iter=iter(batches))
assert "ForwardPass" in seen and "BackwardPass" in seen and "OptimizerStep" in seen, seen
ds_compat.set_instruction_table(engine, None)
assert "_INSTRUCTION_MAP" not in engine.__dict__
ds_compat.set_progress(engine, 7, 14, 2)
assert (engine.global_steps, engine.global_samples, engine.module.micro_offset) == (7, 14, 14)
engine.train_batch(data_iter=iter(batches))
assert engine.global_steps == 8 and engine.module.micro_offset == 16
assert ds_compat.master_groups(engine) is None  # fp32, ZeRO-0: a plain torch optimizer

def fenced(engine, watched):
    """Train one step with the optimizer-step fence on: was every watched tensor unchanged
    whenever the fence ran, and did the step change them?"""
    before = [t.detach().clone() for t in watched()]
    at_fence = []
    handle = ds_compat.before_optimizer_step(
        engine, lambda: at_fence.append(all(torch.equal(a, t) for a, t in zip(before, watched()))))
    engine.train_batch(data_iter=iter(batches))
    handle.remove()
    changed = not all(torch.equal(a, t) for a, t in zip(before, watched()))
    return at_fence, changed

at_fence, changed = fenced(engine, lambda: [*engine.module.parameters(), *(
    v for st in engine.optimizer.state.values() for v in st.values() if torch.is_tensor(v))])
assert at_fence and all(at_fence) and changed, (at_fence, changed)

# bf16 + ZeRO-1: flat fp32 partitions, state created before the first step and set per parameter
from deepspeed.utils import safe_get_full_optimizer_state, safe_set_full_optimizer_state
model = ds_compat.ExplicitPipe([LayerSpec(torch.nn.Linear, 4, 4) for _ in range(3)], parts=[0, 3],
                               num_stages=1, loss_fn=torch.nn.functional.mse_loss)
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config={
    "train_batch_size": 2, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}, "steps_per_print": 10**9,
    "bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}, "zero_optimization": {"stage": 1}})
groups = ds_compat.master_groups(engine)
assert groups and all(flat.dtype == torch.float32 for _, flat in groups), groups
ds_compat.create_master_state(engine, ["exp_avg", "exp_avg_sq"], {"step": torch.tensor(3.0)})
p0 = next(engine.module.parameters())
safe_set_full_optimizer_state(p0, torch.full(p0.shape, 0.5), "exp_avg")
assert torch.equal(safe_get_full_optimizer_state(p0, "exp_avg"), torch.full(p0.shape, 0.5))
flat_state = ds_compat.master_state(engine)[groups[0][1]]
assert float(flat_state["step"]) == 3.0 and (flat_state["exp_avg"] == 0.5).sum() == p0.numel()
batches = [(torch.randn(1, 4).bfloat16(), torch.randn(1, 4).bfloat16()) for _ in range(2)]
engine.train_batch(data_iter=iter(batches))
assert float(ds_compat.master_state(engine)[groups[0][1]]["step"]) == 4.0
assert ds_compat.loss_scale_state(engine) is None   # the bf16 optimizer scales nothing
from deepspeed.utils import safe_get_full_fp32_param
import tempfile
from pathlib import Path
from pipeswift_launch import stagefile
parts = ds_compat.master_parts(engine)   # this rank's partition, written and put together again
shard = Path(tempfile.mkdtemp()) / "stage_000.zero_000.safetensors"
stagefile.write_shard(shard, parts, 0)
master, moments = stagefile.read_shards([shard])
named = dict(engine.module.named_parameters())
assert sorted(master) == sorted(named) and float(parts[0][2]["step"]) == 4.0
for n, p in named.items():
    assert torch.equal(master[n], safe_get_full_fp32_param(p)), n
    assert torch.equal(moments[n]["exp_avg"], safe_get_full_optimizer_state(p, "exp_avg")), n
at_fence, changed = fenced(engine, lambda: [*engine.module.parameters(), *(flat for _, flat in groups), *(
    v for st in ds_compat.master_state(engine).values() for v in st.values() if torch.is_tensor(v))])
assert at_fence and all(at_fence) and changed, (at_fence, changed)

# ZB-H1's accesses (pipeswift_launch.zerobubble): a TrainSchedule subclass where DeepSpeed builds
# its own, and gradients added outside a backward reaching the bf16 optimizer's fp32 accumulators
from deepspeed.runtime.pipe.schedule import TrainSchedule
from deepspeed.utils import safe_get_full_grad
built = []
class Counted(TrainSchedule):
    def steps(self):
        built.append((self.micro_batches, self.stages, self.stage_id))
        return super().steps()
ds_compat.use_train_schedule(engine, Counted)
engine.train_batch(data_iter=iter(batches))
assert built == [(2, 1, 0)], built
assert ds_compat.received_gradients(engine) == []   # one stage: no gradient received
assert [i for i, _ in ds_compat.stage_layers(engine.module)] == [0, 1, 2]   # the three Linears
assert hasattr(engine.optimizer, "immediate_grad_update") and ds_compat.hooks_gradients(engine) is False
# an activation sent early: the fields it reads (one stage sends nothing; its first send is DeepSpeed's)
assert all(hasattr(engine, a) for a in ("first_output_send", "dynamic_shape", "has_attention_mask",
                                        "has_bool_tensors", "pipe_buffers"))
assert engine.first_output_send and ds_compat.post_activation_send(engine, 0) is None
p0.grad = torch.full_like(p0, 7.0)   # cleared by the bracket, as DeepSpeed's backward clears it
with ds_compat.gradients_added(engine):
    assert not p0.grad.any()
    p0.grad.add_(torch.full_like(p0, 0.5))         # as zerobubble.WeightGrads adds a W
assert torch.equal(safe_get_full_grad(p0).float(), torch.full(p0.shape, 0.5)), safe_get_full_grad(p0)
# ZB-H1's early gradient receive: the fields it reads exist (one stage receives nothing: None);
# the receive itself runs between two real stages in test_zerobubble
assert ds_compat.post_gradient_receive(engine) is None
assert all(hasattr(engine, a) for a in ("next_stage", "dynamic_shape", "is_pipe_partitioned", "is_grad_partitioned"))
# and its early activation receive (the last stage's): one stage receives no activation (None)
assert ds_compat.post_activation_receive(engine) is None
assert all(hasattr(engine, a) for a in ("pipe_recv_buf", "prev_stage"))
# a middle stage's activations get a buffer of their own: DeepSpeed allocates its activation and
# gradient receives from one list, the same storage when the shapes match
assert isinstance(engine._grad_layer_buf, list)
shared = engine._allocate_or_extend_buffers(0, [2, 3], torch.float32)
assert shared.untyped_storage().data_ptr() == engine._allocate_or_extend_buffers(0, [2, 3], torch.float32
                                                                                  ).untyped_storage().data_ptr()
engine._grad_layer_buf = []
import deepspeed.runtime.pipe.p2p as p2p
plain_recv = p2p.recv
engine.grad_layer = torch.zeros(2)
class Done:
    def wait(self): return None
with ds_compat.posted_receive((engine.grad_layer, Done())):
    assert p2p.recv is not plain_recv and p2p.recv(engine.grad_layer, 1) is None
assert p2p.recv is plain_recv
engine.grad_layer = None

# fp32 + ZeRO-1: DeepSpeed's ZeRO optimizer with its (static) loss scaler, whose fields an fp16
# job's dynamic scaler shares; no fp16 on CPU, so the dynamic one is only reachable on a GPU
model = ds_compat.ExplicitPipe([LayerSpec(torch.nn.Linear, 4, 4) for _ in range(3)], parts=[0, 3],
                               num_stages=1, loss_fn=torch.nn.functional.mse_loss)
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config={
    "train_batch_size": 2, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}, "steps_per_print": 10**9,
    "zero_optimization": {"stage": 1}})
assert ds_compat.master_groups(engine)
assert ds_compat.loss_scale_state(engine) == {"cur_scale": 1.0}
ds_compat.set_loss_scale_state(engine, {"cur_scale": 2.0, "cur_iter": 41})  # a field it lacks: ignored
assert ds_compat.loss_scale_state(engine) == {"cur_scale": 2.0}
print("canary ok")
'''


def test_every_private_deepspeed_access_still_works():
    proc = run_dist_child(CANARY)
    assert proc.returncode == 0 and "canary ok" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]


@pytest.mark.parametrize("version", ["0.18.9", "0.19.7", "0.20.0", "1.0.0"])
def test_a_deepspeed_outside_the_range_is_one_line_with_the_fix(version):
    from pipeswift_launch.ds_compat import DeepSpeedVersionError, check_version
    with pytest.raises(DeepSpeedVersionError) as e:
        check_version(version)
    msg = str(e.value)
    assert "\n" not in msg and f"DeepSpeed {version} is outside the range" in msg
    assert "pip install 'deepspeed>=0.19.8,<0.20'" in msg


def test_the_supported_versions_pass():
    from pipeswift_launch.ds_compat import check_version
    assert check_version("0.19.8") == "0.19.8" and check_version("0.19.12+abc") == "0.19.12+abc"


#: a few steps of every torch optimizer DeepSpeed hands a CPU job, with a closure, grad modes,
#: state_dict and load_state_dict: the weights (hex) and whether torch._dynamo was imported
OPTIMIZER_STEPS = r'''
import sys, torch
if sys.argv[1] == "eager":
    from pipeswift_launch import ds_compat
    assert ds_compat.eager_optimizers() > 0
torch.manual_seed(0)
out = []
for cls, kw in ((torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}), (torch.optim.Adam, {"lr": 1e-2}),
                (torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9})):
    w = torch.nn.Parameter(torch.randn(8, 8))
    opt = cls([w], **kw)
    for i in range(3):
        opt.zero_grad()
        loss = (w @ torch.randn(8, 8)).square().sum()
        loss.backward()
        opt.step(lambda: loss) if i == 1 else opt.step()
        assert torch.is_grad_enabled()
    again = cls([w], **kw)
    again.load_state_dict(opt.state_dict())
    again.step()
    with torch.no_grad():
        opt.step()
        assert not torch.is_grad_enabled()
    out.append(w.detach().flatten().tolist())
print([float(x).hex() for row in out for x in row])
print("torch._dynamo" in sys.modules)
'''


def test_eager_optimizers_step_as_torch_does_without_importing_dynamo():
    """The fence's eager_optimizers: torch's Adam, AdamW and SGD give the same weights bit for
    bit as unchanged torch, and torch._dynamo is never imported (it is, unchanged)."""
    import subprocess
    import sys
    got = subprocess.run([sys.executable, "-c", OPTIMIZER_STEPS, "eager"], capture_output=True, text=True, timeout=120)
    want = subprocess.run([sys.executable, "-c", OPTIMIZER_STEPS, "torch"], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0 and want.returncode == 0, got.stderr[-2000:] + want.stderr[-2000:]
    (got_weights, got_dynamo), (want_weights, want_dynamo) = got.stdout.splitlines()[-2:], want.stdout.splitlines()[-2:]
    assert got_weights == want_weights
    assert (got_dynamo, want_dynamo) == ("False", "True")


def test_eager_optimizers_change_nothing_on_a_torch_it_was_not_verified_on():
    from pipeswift_launch import ds_compat
    assert ds_compat.eager_optimizers("2.12.1") == 0 and ds_compat.eager_optimizers("2.14.0") == 0


#: on every rank's path (sitecustomize): importing torch._dynamo fails the rank
NO_DYNAMO = '''
import importlib.abc, sys
class _NoDynamo(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch._dynamo":
            raise ImportError("torch._dynamo imported")
sys.meta_path.insert(0, _NoDynamo())
'''


def test_a_real_fp32_job_runs_and_checkpoints_without_torch_dynamo(tmp_path):
    """`pswift run` of the example on 2 stages with clipping and a checkpoint each step, every
    rank unable to import torch._dynamo: it completes (a launch no longer spends ~1.5 s of CPU a
    rank on it; ZeRO and activation recompute still import it, through DeepSpeed and torch)."""
    import os
    from helpers import copy_example, pswift
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(NO_DYNAMO)
    toml = copy_example(tmp_path / "ex", {"steps": "3", "checkpoint_interval": "1", "nodes": "2"})
    toml.write_text(toml.read_text().replace("seed = 1\n", "seed = 1\ngradient_clipping = 1.0\n"))
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")])}
    proc = pswift("run", "--run-dir", str(tmp_path / "run"), str(toml), env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "attempt 0 ended: completed at step 3" in proc.stdout + proc.stderr
