"""What a gloo receive of data already sent costs while the sender computes (issue 41: where a ZB-H1
step on a CPU host loses time beyond its passes), without pswift or DeepSpeed: two processes, plain
torch.distributed on gloo over localhost, one thread each for compute.

Each iteration: both ranks meet at a barrier; rank 0 posts a non-blocking send of a (4, 32, 256)
fp32 activation (what ZB-H1's PostSendActivation does after a forward), then for 14 ms either
sleeps (``idle``), runs forward passes of a 2-block MLP (``forward``) or forward and backward
passes (``backward``: what it runs while ZB-H1's next stage asks for that activation;
``backward_posted``: the same with rank 1's receive posted before the barrier, as pswift's ZB-H1
posts a receive as soon as its buffer is free); rank 1 computes forward and backward passes for
8 ms (as ZB-H1's last stage runs B and W before it receives), then receives and times the
receive. Gloo writes a send whose receive is already posted from the sender's own thread; one
whose receive comes later waits for the sender's gloo thread. A 1F1B step never meets this: its
sends block until the receiver is there. Modes alternate their order by round; the figure is
the median over rounds of each mode's median receive time, and the backward/idle ratio with a
bootstrap 90 % interval of its median.

    python bench/gloo_posted.py [--rounds 8] [--iterations 40] [--quick]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

MODES = ("idle", "forward", "backward", "backward_posted")
HIDDEN, SENDER_MS, RECEIVER_MS = 256, 14.0, 8.0


def rank_main(rank: int, port: int, order: list[str], iterations: int, out: Path) -> None:
    """One rank of one round: every mode of ``order`` for ``iterations`` receives."""
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model = torch.nn.Sequential(*(layer for _ in range(2) for layer in (
        torch.nn.Linear(HIDDEN, 4 * HIDDEN), torch.nn.GELU(), torch.nn.Linear(4 * HIDDEN, HIDDEN))))
    x, grad = torch.randn(4, 32, HIDDEN), torch.randn(4, 32, HIDDEN)
    buffer = torch.empty_like(x)

    def compute(mode: str, ms: float) -> None:
        if mode == "idle":
            time.sleep(ms / 1e3)
            return
        until = time.perf_counter() + ms / 1e3
        while time.perf_counter() < until:
            if mode == "backward":
                model(x).backward(grad)
            else:
                with torch.no_grad():
                    model(x)

    waits: dict[str, list[float]] = {m: [] for m in order}
    for mode in order:
        for _ in range(iterations):
            # backward_posted: the receive is posted before the send (pswift's ZB-H1 posts each
            # receive as soon as its buffer is free), so the sender's own thread writes the data
            posted = dist.irecv(buffer, 0) if rank == 1 and mode == "backward_posted" else None
            dist.barrier()
            if rank == 0:
                work = dist.isend(x, 1)
                compute(mode.removesuffix("_posted"), SENDER_MS)
                work.wait()
            else:
                compute("backward", RECEIVER_MS)
                t0 = time.perf_counter()
                posted.wait() if posted is not None else dist.recv(buffer, 0)
                waits[mode].append(time.perf_counter() - t0)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 1:
        out.write_text(json.dumps(waits))


def one_round(order: list[str], iterations: int, work: Path) -> dict[str, float]:
    """Each mode's median receive time (seconds) in one round, both ranks fresh processes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = work / f"round-{time.monotonic_ns()}.json"
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--port", str(port), "--order",
                               ",".join(order), "--iterations", str(iterations), "--result", str(out)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("a rank failed:\n" + "\n".join(log[-2000:] for log in logs))
    return {m: statistics.median(v) for m, v in json.loads(out.read_text()).items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--iterations", type=int, default=40)
    ap.add_argument("--quick", action="store_true", help="one round of 5 receives a mode (CI: the bench still runs)")
    ap.add_argument("--out", default=str(benchlib.ROOT / "bench" / "results" / "gloo_posted.json"))
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--order", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.port, args.order.split(","), args.iterations, Path(args.result))
        return
    if args.quick:
        args.rounds, args.iterations = 1, 5
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = list(MODES[r % len(MODES):] + MODES[:r % len(MODES)])
            rounds.append(one_round(order, args.iterations, Path(tmp)))
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{m} {rounds[-1][m] * 1e3:.2f} ms" for m in MODES),
                  flush=True)
    median_ms = {m: statistics.median(r[m] for r in rounds) * 1e3 for m in MODES}
    ratios = [r["backward"] / r["idle"] for r in rounds]
    ratio, interval = statistics.median(ratios), benchlib.median_interval(ratios)
    low, high = min(r["backward"] for r in rounds), max(r["backward"] for r in rounds)
    posted_low, posted_high = min(r["backward_posted"] for r in rounds), max(r["backward_posted"] for r in rounds)
    figures = (f"a receive of data sent 8 ms earlier: {median_ms['idle']:.2f} ms with the sender idle, "
               f"{median_ms['forward']:.2f} ms while it runs forward passes, {median_ms['backward']:.2f} ms "
               f"while it runs forward and backward passes ({ratio:.1f}x idle, 90 % interval "
               f"{interval[0]:.1f}-{interval[1]:.1f}x; rounds {low * 1e3:.2f}-{high * 1e3:.2f} ms); "
               f"{median_ms['backward_posted']:.2f} ms there with the receive posted before the send "
               f"(rounds {posted_low * 1e3:.2f}-{posted_high * 1e3:.2f} ms); "
               f"{args.rounds} alternated rounds of {args.iterations}")
    benchlib.save(args.out, {"median_ms": median_ms, "backward_over_idle": ratio,
                             "backward_over_idle_interval": list(interval), "rounds": rounds},
                  quick=args.quick, what="gloo on CPU: receiving what the other rank already sent, while it computes",
                  figures=figures)


if __name__ == "__main__":
    main()
