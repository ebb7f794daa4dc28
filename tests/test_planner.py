"""The JCT planner: pure decisions on synthetic cluster states, and live ones on the real Slurm."""

from __future__ import annotations

import json
import math
import subprocess

import pytest

from helpers import copy_example, pswift
from pipeswift_slurm.config import load_config
from pipeswift_slurm.planning.costmodel import Hardware, Profile, calibrate, estimate_step, overheads_from_instructions
from pipeswift_slurm.planning.planner import PastRuns, explain, plan
from pipeswift_slurm.slurm import client as slurm
from pipeswift_slurm.slurm.cluster import ClusterState, NodeState, PendingJob, RunningJob, estimate_wait

HOUR = 3600.0
#: 8 layers of 1 s (fwd+bwd per micro-batch), m = 32: ~1 h on one node, ~16 min on four
BIG = {"nodes": "[1, 4]", "steps": "14", "global_batch_size": "32", "micro_batch_size": "1",
       "checkpoint_interval": "0", "num_layers": "8",
       "layer_costs": "[1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]",
       "kwargs": "{ vocab = 96, hidden = 128, heads = 4, blocks = 6, seq_len = 32 }"}


def big_toml(tmp_path):
    return copy_example(tmp_path / "big", BIG)


def cluster(busy_until: float | None, now: float = 1000.0) -> ClusterState:
    nodes = [NodeState(f"node{i}", "idle" if i == 4 or busy_until is None else "allocated", 8,
                       8 if i == 4 or busy_until is None else 0, ("low", "high")) for i in range(1, 5)]
    running = [] if busy_until is None else [RunningJob("9", ("node1", "node2", "node3"), now + busy_until)]
    return ClusterState(now=now, nodes=nodes, running=running)


def run_plan(tmp_path, state):
    cfg = load_config(big_toml(tmp_path))
    prof = Profile(cfg.model.layer_costs, None, None, 1, "toml")
    return plan(cfg, prof, Hardware(host_cores=8), state)


def test_training_takes_about_an_hour_on_one_node_and_a_quarter_on_four(tmp_path):
    res = run_plan(tmp_path, cluster(None))
    best = res.best_per_nodes()
    assert 0.9 * HOUR < best[1].estimate.train_s < 1.1 * HOUR
    assert best[4].estimate.train_s < 0.3 * HOUR
    assert res.chosen.nodes == 4  # all free: the biggest wins


def test_long_running_neighbours_start_now_on_the_free_node(tmp_path):
    res = run_plan(tmp_path, cluster(busy_until=5 * HOUR))
    assert res.chosen.nodes == 1 and res.chosen.estimate.queue_s == 0
    best = res.best_per_nodes()
    assert best[4].estimate.queue_s == pytest.approx(5 * HOUR)
    why = explain(res)
    assert "chosen: 1 node(s)" in why and "vs 4 node(s)" in why and "queue 5.00 h" in why


def test_neighbours_ending_soon_wait_for_all_four(tmp_path):
    res = run_plan(tmp_path, cluster(busy_until=180))
    assert res.chosen.nodes == 4 and res.chosen.estimate.queue_s == pytest.approx(180)
    assert "chosen: 4 node(s)" in explain(res)


def test_rejections_say_why(tmp_path):
    p = copy_example(tmp_path / "ex", {"nodes": "[1, 8]"})
    p.write_text("\n".join(x for x in p.read_text().splitlines() if not x.startswith("data_parallel")))
    cfg = load_config(p)
    prof = Profile(cfg.model.layer_costs, (4 * 10**8,) * 6, None, 8, "toml")
    res = plan(cfg, prof, Hardware(device_memory=5e9, host_cores=8), cluster(None))
    reasons = {c.rejected for c in res.candidates if c.rejected}
    assert any("7 stages > 6 layers" in r for r in reasons)
    assert any("not divisible" in r for r in reasons)           # 32 / (8 x dp 8)
    assert any("does not fit" in r and "memory cap" in r for r in reasons)  # 0.4 GB layers x 4 (Adam) > 5 GB on 1 stage
    assert any("never starts" in r and "only 4 usable" in r for r in reasons)
    assert res.chosen is not None and res.chosen.rejected is None


def test_measured_step_time_replaces_and_calibrates_the_model(tmp_path):
    cfg = load_config(big_toml(tmp_path))
    prof = Profile(cfg.model.layer_costs, None, None, 1, "toml")
    key = lambda c: f"{c.nodes}/{c.stages}"  # noqa: E731
    hw = Hardware(host_cores=8)
    base = plan(cfg, prof, hw, cluster(None))
    one = base.best_per_nodes()[1].estimate.step_s
    res = plan(cfg, prof, hw, cluster(None), PastRuns(step_times={"1/1": one * 1.5}), key)
    best = res.best_per_nodes()
    assert best[1].estimate.step_source == "measured" and best[1].estimate.step_s == pytest.approx(1.5 * one)
    # the calibration factor reproduces the measurement and raises the others
    assert res.calibration.scale == pytest.approx(1.5, rel=1e-3) and res.calibration.shared_efficiency == 1.0
    c1 = best[1]
    again = estimate_step(prof.scaled(res.calibration.scale), c1.boundaries, c1.micro_batches,
                          c1.micro_batch_size, c1.data_parallel, c1.tasks_per_node, hw).step_s
    assert again == pytest.approx(1.5 * one, rel=1e-6)
    assert best[4].estimate.step_source == "calibrated"
    assert best[4].estimate.step_s > base.best_per_nodes()[4].estimate.step_s


def test_a_measured_step_is_shown_beside_what_the_model_predicts_without_it(tmp_path):
    """The model's step of a measured layout is predicted without that measurement: the profile
    as it is when no other config was measured, calibrated on the others when some were (a
    calibration on the measurement itself would always reproduce it)."""
    cfg = load_config(big_toml(tmp_path))
    prof = Profile(cfg.model.layer_costs, None, None, 1, "toml")
    key = lambda c: f"{c.nodes}/{c.stages}"  # noqa: E731
    hw = Hardware(host_cores=8)
    model = {n: c.estimate.step_s for n, c in plan(cfg, prof, hw, cluster(None)).best_per_nodes().items()}
    res = plan(cfg, prof, hw, cluster(None), PastRuns(step_times={"1/1": model[1] * 1.5}), key)
    e = res.best_per_nodes()[1].estimate
    assert e.step_s == pytest.approx(1.5 * model[1]) and e.model_step_s == pytest.approx(model[1])
    assert res.best_per_nodes()[4].estimate.model_step_s == res.best_per_nodes()[4].estimate.step_s
    # two measured: each one's model step is calibrated by the other (1.2x), not by itself (1.5x)
    seen = {"1/1": model[1] * 1.5, "4/4": model[4] * 1.2}
    res = plan(cfg, prof, hw, cluster(None), PastRuns(step_times=seen), key)
    best = res.best_per_nodes()
    def row(c):
        return c.boundaries, c.micro_batches, c.micro_batch_size, c.data_parallel, c.tasks_per_node
    for n, other in ((1, 4), (4, 1)):
        c, o = best[n], best[other]
        assert c.estimate.step_source == "measured" and c.estimate.step_s == pytest.approx(seen[f"{n}/{n}"])
        by_other = calibrate(prof, [(*row(o), seen[f"{other}/{other}"])], hw).scale
        assert by_other == pytest.approx(seen[f"{other}/{other}"] / model[other], rel=1e-3)
        assert c.estimate.model_step_s == pytest.approx(estimate_step(prof.scaled(by_other), *row(c), hw).step_s)
    assert res.chosen.nodes == 4
    assert (f"({best[4].estimate.step_s:.4g} s/step, measured; the model predicts "
            f"{best[4].estimate.model_step_s:.4g} s (+25.0%))") in explain(res)


def test_overheads_from_instruction_times():
    """2 stages, m = 4, layers 10 ms + 10 ms | 15 ms per micro-batch (the launcher's record)."""
    layers = {"0": 0.010, "1": 0.010, "2": 0.015}
    ins = {"0": {"ForwardPass": 0.030, "BackwardPass": 0.060, "LoadMicroBatch": 0.002,
                 "SendActivation": 0.004, "RecvGrad": 0.050, "OptimizerStep": 0.003,
                 "ReduceGrads": 0.001, "step": 0.160},
           "1": {"ForwardPass": 0.028, "BackwardPass": 0.056, "LoadMicroBatch": 0.000,
                 "SendGrad": 0.008, "RecvActivation": 0.020, "OptimizerStep": 0.040, "step": 0.160}}
    o = overheads_from_instructions(ins, layers, [0, 2, 3], 4)
    assert o["overhead_s"] == pytest.approx(0.092 / 4 - 0.020)                 # 3 ms per micro-batch
    assert o["last_stage_overhead_s"] == pytest.approx(0.084 / 4 - 0.015 - 0.003)  # the loss: 3 ms
    # one send: the cheaper direction per micro-batch (stage 1's grads waited for stage 0)
    assert o["send_s"] == pytest.approx(0.004 / 4)
    # the first stage's optimizer + reduction + time outside any instruction (the last stage's
    # optimizer step includes waiting for the first stage's last backward: not used)
    assert o["step_overhead_s"] == pytest.approx(0.003 + 0.001 + (0.160 - 0.150))
    single = overheads_from_instructions({"0": {"ForwardPass": 0.05, "BackwardPass": 0.1, "step": 0.2}},
                                         {"0": 0.03}, [0, 1], 4)
    assert single["send_s"] == 0 and single["last_stage_overhead_s"] == 0
    assert single["overhead_s"] == pytest.approx(0.15 / 4 - 0.03)
    # under ZB-H1 the layers' timed backward leaves the weight gradients to WeightPass: counted
    zb = overheads_from_instructions({"0": {"ForwardPass": 0.05, "BackwardPass": 0.06, "WeightPass": 0.04,
                                            "step": 0.2}}, {"0": 0.03}, [0, 1], 4)
    assert zb["overhead_s"] == pytest.approx(single["overhead_s"])


def test_sends_and_the_loss_are_paid_where_they_happen():
    base = Profile((0.01,) * 4, None, None, 1, step_overhead_s=0.005)
    costly = Profile((0.01,) * 4, None, None, 1, send_s=0.004, last_stage_overhead_s=0.002,
                     step_overhead_s=0.005)
    hw = Hardware(host_cores=8)
    one = [estimate_step(p, [0, 4], 8, 1, 1, 1, hw).step_s for p in (base, costly)]
    two = [estimate_step(p, [0, 2, 4], 8, 1, 1, 1, hw).step_s for p in (base, costly)]
    assert one[1] - one[0] == pytest.approx(8 * 0.002)    # one stage: the loss, no sends
    assert two[1] - two[0] > 8 * (0.002 + 0.004)          # two: the loss and a send per micro-batch
    assert one[0] == pytest.approx(8 * 0.04 + 0.005)      # layers x m + the per-step work


def test_calibration_learns_the_scale_and_what_an_oversubscribed_host_delivers():
    prof = Profile((0.01, 0.02, 0.02, 0.01), None, None, 1, overhead_s=0.002, send_s=0.0005,
                   step_overhead_s=0.004)
    hw = Hardware(host_cores=2, ranks_per_host=4)
    truth_prof, truth_hw = prof.scaled(1.2), Hardware(host_cores=2, ranks_per_host=4, shared_efficiency=0.8)
    layouts = [([0, 2, 4], 4), ([0, 1, 2, 3, 4], 4), ([0, 1, 2, 3, 4], 16)]   # 2 stages fit 2 cores, 4 do not
    measured = [(b, m, 1, 1, 1, estimate_step(truth_prof, b, m, 1, 1, 1, truth_hw).step_s) for b, m in layouts]
    cal = calibrate(prof, measured[:2], hw)
    assert cal.scale == pytest.approx(1.2, rel=1e-3) and cal.shared_efficiency == pytest.approx(0.8, rel=1e-3)
    assert (cal.measured, cal.oversubscribed) == (2, 1)
    # the fitted pair predicts the layout it has not seen
    tuned_hw = Hardware(host_cores=2, ranks_per_host=4, shared_efficiency=cal.shared_efficiency)
    got = estimate_step(prof.scaled(cal.scale), [0, 1, 2, 3, 4], 16, 1, 1, 1, tuned_hw).step_s
    assert got == pytest.approx(measured[2][5], rel=1e-3)
    # ideal sharing would have been too optimistic for it
    assert estimate_step(prof.scaled(cal.scale), [0, 1, 2, 3, 4], 16, 1, 1, 1, hw).step_s < 0.9 * measured[2][5]


def test_queue_estimate_with_jobs_ahead():
    st = cluster(busy_until=600)
    st.pending.append(PendingJob("10", "low", 1, 1200))
    w = estimate_wait(st, 1, 1, "low")  # the pending job takes the free node for 20 min
    assert w.seconds == pytest.approx(600) and "1 pending job(s) ahead" in w.why
    assert math.isinf(estimate_wait(st, 5, 1, "low").seconds)


def test_cpu_contention_when_ranks_outnumber_cores():
    prof = Profile((1.0,) * 4, None, None, 1)
    alone = estimate_step(prof, [0, 1, 2, 3, 4], 16, 1, 1, 1, Hardware(host_cores=8))
    shared = estimate_step(prof, [0, 1, 2, 3, 4], 16, 1, 1, 1, Hardware(host_cores=2, ranks_per_host=4))
    assert shared.contention > 1.5 and shared.step_s > 1.5 * alone.step_s


@pytest.mark.slurm
@pytest.mark.every_version
@pytest.mark.parametrize("limit,nodes,hedged", [("5:00:00", 1, False), ("3:00", 4, False), ("30:00", 4, True)])
def test_contention_decided_from_live_cluster_state(cluster, tmp_path, limit, nodes, hedged):
    """3 of 4 nodes held by a job: hours left -> start now on 1 node; minutes left -> wait for 4.
    Half an hour left: still wait for 4 (JCT ~46 min against ~1 h on 1 node), but where Slurm
    requeues a preempted job with its submitted request (24.05 on) ask for 1-4: after a
    preemption, waiting for 4 again would finish later than 1 node (issue 58)."""
    toml = big_toml(tmp_path)
    blocker = subprocess.run(["sbatch", "--parsable", "-p", "low", "-N3", "--exclusive", f"--time={limit}",
                              "-o", "/dev/null", "--wrap", "sleep 600"],
                             capture_output=True, text=True, check=True).stdout.strip()
    try:
        for _ in range(50):
            st = subprocess.run(["squeue", "-h", "-j", blocker, "-o", "%T"], capture_output=True, text=True)
            if st.stdout.strip() == "RUNNING":
                break
            subprocess.run(["sleep", "0.2"])
        proc = pswift("plan", str(toml), "--json")
        assert proc.returncode == 0, proc.stderr
        d = json.loads(proc.stdout)
        assert d["chosen"]["nodes"] == nodes, proc.stdout
        assert d["chosen"]["stages"] == nodes and d["chosen"]["data_parallel"] == 1
        e = d["chosen"]["estimate"]
        assert set(e) >= {"queue_s", "setup_s", "step_s", "train_s", "checkpoint_s", "interruption_s", "jct_s"}
        for c in d["candidates"]:
            assert set(c) >= {"nodes", "tasks_per_node", "stages", "data_parallel", "micro_batches",
                              "micro_batch_size", "boundaries", "partition", "estimate"}
        text = pswift("plan", str(toml)).stdout
        assert f"chosen: {nodes} node(s)" in text and "vs " in text
        dry = pswift("sbatch", "--dry-run", str(toml)).stdout
        # a ranged TOML asks in range form (CPUs per node), so a requeue can change the count
        bottom = 1 if hedged and slurm.requeues_as_submitted("low") else nodes
        assert f"#SBATCH --nodes={bottom}-{nodes}\n" in dry and "#SBATCH --mincpus=1\n" in dry
        assert ("asks for 1-4 node(s), not exactly 4" in text) == (bottom < nodes), text
        # Slurm's own estimate agrees with the backfill estimate here
        slurm_says = json.loads(pswift("plan", str(toml), "--json", "--test-only").stdout)
        assert slurm_says["chosen"]["nodes"] == nodes
        assert "sbatch --test-only" in slurm_says["chosen"]["estimate"]["queue_why"]
    finally:
        subprocess.run(["scancel", blocker])


def test_partition_preemption_rate_adds_expected_loss(tmp_path):
    cfg = load_config(big_toml(tmp_path))
    prof = Profile(cfg.model.layer_costs, None, None, 1, "toml")
    from pipeswift_slurm.planning.interval import Interruptions
    quiet = PastRuns(interruptions=Interruptions(failures_per_node_hour=0.0))
    calm = plan(cfg, prof, Hardware(host_cores=8), cluster(None), quiet).chosen.estimate
    stormy = plan(cfg, prof, Hardware(host_cores=8), cluster(None),
                  PastRuns(interruptions=Interruptions(preemptions_per_hour=2.0, failures_per_node_hour=0.0))).chosen.estimate
    assert calm.interruption_s == 0 and stormy.interruption_s > 0 and stormy.interruptions > 0
    # the TOML's checkpoint_interval = 0 stays: only signals save (tests/test_interval.py: "auto")
    assert stormy.checkpoint_every_s == calm.checkpoint_every_s == math.inf
    assert stormy.jct_s == pytest.approx(stormy.queue_s + stormy.setup_s + stormy.train_s + stormy.checkpoint_s
                                         + stormy.interruption_s)
    assert stormy.jct_s > calm.jct_s


# ----------------------------------------------------------------------------- memory by training
def test_training_state_per_parameter_follows_precision_and_zero_sharding():
    from pipeswift_slurm.planning.costmodel import state_factor
    base = Profile((1.0,), (4,), None, 1, "toml")
    f = lambda precision, zero, dp: state_factor(base._replace(precision=precision, zero_stage=zero), dp)  # noqa: E731
    assert f("fp32", 0, 4) == 4.0                       # weights, grads, Adam: 16 bytes a parameter
    assert f("fp32", 1, 1) == 5.0 and f("fp32", 1, 4) == 2.75   # + a master copy, sharded
    assert f("bf16", 1, 2) == 3.5 and f("bf16", 1, 8) < f("bf16", 1, 2)   # + the bf16 grads the pipeline keeps
    assert f("fp16", 0, 8) == 4.0                       # a full fp32 copy without ZeRO


def test_optimizers_buckets_and_temporaries_count_in_a_stages_memory():
    """DeepSpeed's ZeRO optimizer (fp16, fp32) holds two gradient buckets of up to 5e8 elements
    (2 GB in fp16 on a 1M-parameter stage, gpu-check on an H200); pswift asks for buckets no
    larger than the stage, and the memory model counts them; bf16's optimizer has none. On CUDA
    torch's foreach AdamW adds one fp32 temporary per parameter of the rank's share."""
    from pipeswift_slurm.planning.costmodel import ZERO_BUCKET_ELEMENTS, optimizer_extra_bytes, state_factor
    small, big = 4e6, 4 * 2e9   # fp32 bytes: 1M and 2G parameters
    prof = Profile((1.0,), (small,), None, 1, "toml")
    at = lambda precision, zero, b=small, dp=1, dev="cpu": optimizer_extra_bytes(  # noqa: E731
        prof._replace(precision=precision, zero_stage=zero), b, dp, dev)
    assert at("fp16", 1) == 2 * 1e6 * 2 and at("fp32", 1) == 2 * 1e6 * 4
    assert at("fp16", 1, big) == 2 * ZERO_BUCKET_ELEMENTS * 2      # DeepSpeed's default caps it
    assert at("bf16", 1) == at("fp16", 0) == at("fp32", 0) == 0
    assert at("bf16", 1, dev="cuda") == small and at("bf16", 1, dp=4, dev="cuda") == small / 4
    assert at("fp32", 0, dp=4, dev="cuda") == small                 # unsharded without ZeRO
    one = estimate_step(prof._replace(precision="fp16", zero_stage=1), [0, 1], 1, 1, 1, 1, Hardware())
    none = estimate_step(prof._replace(precision="fp16", zero_stage=0), [0, 1], 1, 1, 1, 1, Hardware())
    assert one.stage_memory[0] - none.stage_memory[0] == pytest.approx(
        at("fp16", 1) + (state_factor(prof._replace(precision="fp16", zero_stage=1), 1)
                         - state_factor(prof._replace(precision="fp16", zero_stage=0), 1)) * small)


def test_recompute_trades_a_forward_for_activation_memory():
    from pipeswift_slurm.planning.costmodel import activation_memory
    prof = Profile((1.0,) * 8, (1e9,) * 8, (1e8,) * 8, 1, "toml")
    keep = estimate_step(prof, [0, 4, 8], 8, 1, 1, 1, Hardware())
    again = estimate_step(prof._replace(recompute_interval=2), [0, 4, 8], 8, 1, 1, 1, Hardware())
    assert again.step_s > keep.step_s * 1.2                     # the forward (1/3 of 1 s) runs twice
    assert max(again.stage_memory) < max(keep.stage_memory)
    assert activation_memory(1.0, 4, 2, 0) == 8.0 and activation_memory(1.0, 4, 2, 2) == 2 * 2 + 2


def test_zb_h1_memory_counts_the_micro_batches_its_weight_passes_hold():
    """pswift's ZB-H1 holds up to the first stage's 1F1B count on every stage (the last stage's
    deferred weight passes), one more where a W waits for the next RecvGrad: the memory check
    counts them, so a layout that fits 1F1B only is refused under ZB-H1, its stage named."""
    from pipeswift_slurm.planning.costmodel import held_micro_batches
    assert [held_micro_batches("1f1b", 4, 8, s, 4 - s) for s in range(4)] == [4, 3, 2, 1]
    assert [held_micro_batches("zb-h1", 4, 8, s, 4 - s) for s in range(4)] == [5, 5, 5, 4]
    assert [held_micro_batches("zb-h1", 4, 2, s, min(4 - s, 2)) for s in range(4)] == [3, 3, 3, 2]
    prof = Profile((1.0,) * 8, (1e8,) * 8, (1e9,) * 8, 1, "toml")
    one = estimate_step(prof, [0, 2, 4, 6, 8], 8, 1, 1, 1, Hardware())
    zb = estimate_step(prof, [0, 2, 4, 6, 8], 8, 1, 1, 1, Hardware(), "zb-h1")
    assert zb.stage_memory[3] - one.stage_memory[3] == pytest.approx(3 * 2 * 1e9)   # 3 more of 2 layers
    assert zb.stage_memory[0] - one.stage_memory[0] == pytest.approx(1 * 2 * 1e9)
    hw = Hardware(device_memory=(one.stage_memory[0] + zb.stage_memory[0]) / 2)
    assert estimate_step(prof, [0, 2, 4, 6, 8], 8, 1, 1, 1, hw).fits
    assert not estimate_step(prof, [0, 2, 4, 6, 8], 8, 1, 1, 1, hw, "zb-h1").fits


def test_zb_h1_step_model_fills_the_bubble_with_the_weight_passes_measured_or_assumed():
    """Under ZB-H1 the step model simulates the order pswift's engine runs on the stage times,
    each stage's W its layers' measured share: with F = B = W on 2 stages it is the paper's
    m(F+B+W) + (p-1)(F+B-W) against 1F1B's (m+p-1)(F+B+W), on 4 the engine's own order; no
    splittable weight gradient, no gain; unmeasured, the assumed share. On CPU each split stage's
    passes take ZB_SPLIT_COST_CPU longer (measured), on a GPU not."""
    from pipeswift_slurm.planning.costmodel import WEIGHT_FRACTION_ASSUMED, ZB_SPLIT_COST_CPU, model_passes
    from pipeswift_slurm.planning.simulate import simulate
    paper = Profile((1.0,) * 8, weight_fraction=(1 / 3,) * 8)          # F = B = W = 4/3 a stage of 4 layers
    gpu = estimate_step(paper, [0, 4, 8], 8, 1, 1, 1, Hardware(device="cuda"), "zb-h1")
    assert gpu.compute_s == pytest.approx(8 * 4.0 + 1 * 4 / 3, rel=1e-3)
    two = estimate_step(paper, [0, 4, 8], 8, 1, 1, 1, Hardware(), "zb-h1")
    c = ZB_SPLIT_COST_CPU
    assert 0 < c and two.compute_s == pytest.approx(
        simulate([4 / 3 * (1 + c)] * 2, [8 / 3 * (1 + c)] * 2, 8, "zb-h1", wgrad=[4 / 3 * (1 + c)] * 2,
                 as_run=True).step_time, rel=1e-9)
    assert two.compute_s == pytest.approx(gpu.compute_s * (1 + c), rel=1e-6)
    cut, m = [0, 2, 4, 6, 8], 8
    one = estimate_step(paper, cut, m, 1, 1, 1, Hardware())
    zb = estimate_step(paper, cut, m, 1, 1, 1, Hardware(), "zb-h1")
    assert one.compute_s == pytest.approx(11 * 2.0, rel=1e-3)
    as_run = simulate([2 / 3] * 4, [4 / 3] * 4, m, "zb-h1", wgrad=[2 / 3] * 4, as_run=True).step_time
    with_costs = simulate([2 / 3 * (1 + c)] * 4, [4 / 3 * (1 + c)] * 4, m, "zb-h1", wgrad=[2 / 3 * (1 + c)] * 4,
                          as_run=True).step_time
    assert zb.compute_s == pytest.approx(with_costs, rel=1e-9) and 8 * 2.0 + 3 * 2 / 3 < as_run < 22
    assert with_costs > as_run * (1 + c)
    assert zb.step_s - zb.compute_s == pytest.approx(one.step_s - one.compute_s)   # the rest unchanged
    assert zb.bubble_ratio < one.bubble_ratio
    # `pswift simulate TOML` runs the step model's passes: the same makespan (the engine's
    # overheads in them, the weight passes' measured shares; on a GPU ZB-H1 costs nothing more)
    engine = paper._replace(overhead_s=0.3, last_stage_overhead_s=0.2, send_s=0.05,
                            weight_fraction=(0.2, 0.4) * 4, micro_batch_size=2)
    gpu = Hardware(device="cuda", p2p_latency=0.0)
    f, b, w = model_passes(engine, cut, 4)
    assert f[0] == pytest.approx(2 * 2 * 1 / 3 + 0.1 + 0.05) and w[0] == pytest.approx(2 * (0.2 + 0.4))
    for schedule, extra in (("1f1b", {}), ("zb-h1", {"wgrad": w, "as_run": True})):
        assert estimate_step(engine, cut, m, 4, 1, 1, gpu, schedule).compute_s == pytest.approx(
            simulate(f, b, m, schedule, **extra).step_time, rel=1e-9)
    none = paper._replace(weight_fraction=(0.0,) * 8)                  # nothing to defer
    assert estimate_step(none, cut, m, 1, 1, 1, Hardware(), "zb-h1").step_s == pytest.approx(one.step_s)
    assert (paper.weight_fractions()[1], none.weight_fractions()[1]) == (True, True)
    guessed = paper._replace(weight_fraction=(1 / 3,) * 7 + (None,))
    assert guessed.weight_fractions() == ([1 / 3] * 7 + [WEIGHT_FRACTION_ASSUMED], False)
    assert Profile((1.0,) * 8).weight_fractions() == ([WEIGHT_FRACTION_ASSUMED] * 8, False)
    assert estimate_step(paper, [0, 8], m, 1, 1, 1, Hardware(), "zb-h1").step_s == \
        pytest.approx(estimate_step(paper, [0, 8], m, 1, 1, 1, Hardware()).step_s)   # one stage: no bubble


@pytest.mark.parametrize("layer_s, micro_batches", [(0.003, 4), (0.003, 8), (0.0085, 4), (0.0085, 8),
                                                   (0.0255, 4), (0.0255, 8)])
def test_zb_h1_model_on_cpu_runs_it_on_the_cells_where_it_measured_faster(monkeypatch, layer_s, micro_batches):
    """bench/schedules.py's 2-stage cells, global batch 32, as profiles (8 layers, W 27 % of each,
    a 0.02 s optimizer step): hidden 128 (a 0.07 s step) measured ZB-H1/1F1B 0.95 at 4 and at 8
    micro-batches, hidden 256 (0.19 s) 0.91 and 0.95, hidden 512 (0.6 s) 0.88 and 0.93, each
    faster by more than ZB_MODEL_MIN_GAIN; the model's ratio says so in each. With twice the
    split's measured cost it would keep 1F1B at 8 micro-batches (a bubble of 1/9 of the step)."""
    from pipeswift_slurm.planning import costmodel
    from pipeswift_slurm.planning.planner import ZB_MODEL_MIN_GAIN
    prof = Profile((layer_s,) * 8, micro_batch_size=8, weight_fraction=(0.27,) * 8, step_overhead_s=0.02,
                   overhead_s=0.0005)

    def ratio() -> float:
        def step(schedule: str) -> float:
            return estimate_step(prof, [0, 4, 8], micro_batches, 32 // micro_batches, 1, 1, Hardware(host_cores=2),
                                 schedule).step_s
        return step("zb-h1") / step("1f1b")
    assert ratio() < 1 - ZB_MODEL_MIN_GAIN, ratio()
    monkeypatch.setattr(costmodel, "ZB_SPLIT_COST_CPU", 2 * costmodel.ZB_SPLIT_COST_CPU)
    assert (ratio() < 1 - ZB_MODEL_MIN_GAIN) == (micro_batches == 4), ratio()


def test_a_config_that_would_not_fit_is_rejected_with_the_numbers_and_fits_in_bf16_zero1(tmp_path, monkeypatch):
    """4 GB of fp32 weights a layer, 6 layers, 2 slots of 90 GB, one stage: fp32 (16 bytes a
    parameter) needs 96 GB a slot and is refused before anything is submitted; bf16 + ZeRO-1
    over the 2 data-parallel ranks (2 + 2 + 4 + 12 / 2 bytes: the pipeline keeps the bf16
    gradients beside the fp32 ones) needs 84 GB and fits."""
    toml = copy_example(tmp_path / "ex", {"nodes": "2", "data_parallel": "None", "stages": "1",
                                          "layer_costs": "[0.1, 0.1, 0.1, 0.1, 0.1, 0.1]"})
    toml.write_text(toml.read_text().replace("data_parallel = None", "")
                    .replace("layer_costs =", "layer_memory = [4e9, 4e9, 4e9, 4e9, 4e9, 4e9]\nlayer_costs =")
                    .replace("layer_memory = [4e9", "layer_memory = [4000000000")
                    .replace(", 4e9", ", 4000000000"))
    monkeypatch.setenv("PSWIFT_DEVICE_MEMORY", "90e9")
    proc = pswift("sbatch", "--dry-run", str(toml))
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("warning:")]
    assert proc.returncode == 2 and len(errors) == 1 and errors[0].startswith("Error: "), proc.stderr
    assert "no layout fits: does not fit: training state 96.00 GB over 1 stage(s) x 2 dp, device memory 90.00 GB" in proc.stderr, proc.stderr
    assert "zero_stage = 1" in proc.stderr and "activation_checkpoint_interval" in proc.stderr
    toml.write_text(toml.read_text().replace("seed = 1\n", 'seed = 1\nzero_stage = 1\nprecision = "bf16"\n'))
    proc = pswift("sbatch", "--dry-run", str(toml))
    assert proc.returncode == 0, proc.stderr
    assert "1 stage(s) x 2 dp" in proc.stderr and proc.stdout.startswith("#!/bin/bash\n")


def test_schedule_auto_runs_zb_h1_where_measured_or_modelled_faster_and_1f1b_where_the_split_does_not_pay(tmp_path):
    """Per layout: ZB-H1 where the history measured it faster than 1F1B, or, unmeasured, where
    the step model (the measured weight-pass shares, else assumed ones, said so) saves at least
    ZB_MODEL_MIN_GAIN of the step; 1F1B where the layers have nothing to defer, the bubble is too
    small to pay for the split (m = 32: on no layout; m = 16: on 4 stages, not 2), or ZB-H1 was
    measured slower."""
    from pipeswift_slurm.planning.planner import ZB_MODEL_MIN_GAIN
    toml = big_toml(tmp_path)
    toml.write_text(toml.read_text().replace("[pipeline]", '[pipeline]\nschedule = "auto"'))
    at_32 = load_config(toml)
    wide = plan(at_32, Profile(at_32.model.layer_costs, None, None, 1, "toml"), Hardware(host_cores=8),
                cluster(None), PastRuns())
    assert {c.schedule for c in wide.candidates if c.estimate} == {"1f1b"}   # m = 32: the split costs more
    toml.write_text(toml.read_text().replace("global_batch_size = 32", "global_batch_size = 16"))
    cfg = load_config(toml)
    key = lambda c: f"{c.nodes}/{c.stages}/{c.schedule}"  # noqa: E731
    hw = Hardware(host_cores=8)

    def run(weight: tuple | None, seen: dict | None = None):
        prof = Profile(cfg.model.layer_costs, None, None, 1, "toml", weight_fraction=weight)
        res = plan(cfg, prof, hw, cluster(None), PastRuns(step_times=seen or {}), key)
        return res, {c.nodes: c for c in res.candidates if c.estimate}

    flat, by = run((0.0,) * 8)                           # measured: no layer has a weight pass to defer
    assert {c.schedule for c in by.values()} == {"1f1b"}
    assert any("ZB-H1 on 0 layout(s)" in n and "shares a ZB-H1 run measured" in n for n in flat.notes)
    one, two, four = (by[n].est.step_s for n in (1, 2, 4))
    res, by = run(None)                                  # nothing measured: the assumed share
    assert (by[1].schedule, by[2].schedule, by[4].schedule) == ("1f1b", "1f1b", "zb-h1")   # m = 16: 4 stages' bubble pays
    assert by[4].est.step_s < (1 - ZB_MODEL_MIN_GAIN) * four and by[4].est.step_source == "model"
    assert any(f"modelled at least {ZB_MODEL_MIN_GAIN:.0%} faster" in n and "assumed 25%" in n for n in res.notes)
    assert res.chosen.schedule == res.to_dict()["chosen"]["schedule"] == "zb-h1"
    seen = {"1/1/zb-h1": 0.8 * one,                      # measured faster than 1F1B's estimate: ZB-H1
            "2/2/1f1b": two, "2/2/zb-h1": 1.05 * two,    # measured slower than 1F1B: the split does not pay
            "4/4/1f1b": four}                            # 1F1B measured: ZB-H1 = that x the model's ratio
    res, by = run(None, seen)
    assert (by[1].schedule, by[1].est.step_source, by[1].est.step_s) == ("zb-h1", "measured", pytest.approx(0.8 * one))
    assert (by[2].schedule, by[2].est.step_s) == ("1f1b", pytest.approx(two))
    assert by[4].schedule == "zb-h1" and by[4].est.step_source == "calibrated"
    assert 0.9 * four < by[4].est.step_s < (1 - ZB_MODEL_MIN_GAIN) * four
    assert any('"auto": ZB-H1 on 2 layout(s) (1 measured faster than 1F1B, 1 modelled' in n for n in res.notes)


def test_plan_json_never_says_auto(tmp_path):
    from pipeswift_slurm import submit
    toml = copy_example(tmp_path / "ex")
    toml.write_text(toml.read_text().replace("[pipeline]", '[pipeline]\nschedule = "auto"'))
    p = submit.prepare(toml, tmp_path / "run", live=False, learn=False)
    assert p.plan["schedule"] in ("1f1b", "zb-h1")       # resolved by the planner's model


def test_zb_h1_where_the_stages_share_cores_gains_only_what_processor_sharing_leaves():
    """4 stages on a 2-core host: a stage's bubble is partly another stage's work already, so
    the model simulates ZB-H1 with the stages sharing the cores (measured 0.96x of 1F1B at 4 x 4
    there, bench/schedules.py): some gain at 4 micro-batches, less than on 4 cores, none left at
    8 (where the split costs what the shared bubble gives back); each exactly the shared
    simulation of the split passes."""
    from pipeswift_slurm.planning.costmodel import ZB_SPLIT_COST_CPU
    from pipeswift_slurm.planning.simulate import simulate_shared
    prof = Profile((1.0,) * 8, weight_fraction=(1 / 3,) * 8)
    cut, c = [0, 2, 4, 6, 8], ZB_SPLIT_COST_CPU

    def ratio(cores: int, m: int) -> float:
        hw = Hardware(host_cores=cores, ranks_per_host=4)
        one, zb = (estimate_step(prof, cut, m, 1, 1, 4, hw, s) for s in ("1f1b", "zb-h1"))
        assert zb.optimizer_s == one.optimizer_s == 0 and zb.allreduce_s == one.allreduce_s == 0
        return zb.step_s / one.step_s
    for m in (4, 8):
        f, b, w = [2 / 3 * (1 + c)] * 4, [4 / 3 * (1 + c)] * 4, [2 / 3 * (1 + c)] * 4
        p2p = Hardware().p2p_latency
        shared = simulate_shared(f, b, m, p2p, [0] * 4, 2, wgrad=w) / simulate_shared([2 / 3] * 4, [4 / 3] * 4, m,
                                                                                       p2p, [0] * 4, 2)
        assert ratio(2, m) == pytest.approx(shared, rel=1e-9)
        assert ratio(4, m) < ratio(2, m) - 0.05
    assert ratio(2, 4) < 0.98 and ratio(2, 8) > 0.98
