"""The flags every rank agrees on at a step's end (pipeswift_launch.collectives.StepFlags), on
two real gloo processes: at once (agree), or posted at one step's end and taken at the next
(post/take), the largest of each slot over the ranks either way; at once where every rank
posted a slot set (early: a stop signalled to every rank in the same step); and the rule that says which
(pipeswift_slurm.codes): the seconds from a signal to the stop that the USR2 lead and the
GraceTime warning count."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from helpers import DIST_CHILD

from pipeswift_slurm.codes import POSTED_BELOW_S, to_stop_s
from pipeswift_slurm.planning import limits

RANK = r'''
import json, sys
import torch.distributed as dist
from pipeswift_launch.collectives import StepFlags
r, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=r, world_size=2)
flags = StepFlags(3)
seen = {"none_posted": flags.take()}
flags.mine = [float(r), 5.0 - r, 0.0]
seen["agree"] = flags.agree()
flags.mine = [0.0, float(10 * r), 7.0]     # step 1's end: posted
flags.post()
flags.mine = [99.0, 99.0, 99.0]            # what the rank holds by the next step's end
seen["taken"] = flags.take()
seen["taken_again"] = flags.take()
flags.mine = [float(r), 0.0, 1.0]
flags.post()
seen["then"] = flags.take()
flags.mine = [2.0 + r, 0.0, float(r)]      # both ranks set slot 0: both act at once, nothing left
flags.post()
seen["early_both"] = flags.early(0)
seen["early_both_left"] = flags.take()
flags.mine = [3.0 * r, 0.0, 4.0]           # rank 1 alone sets slot 0: nobody acts early
flags.post()
seen["early_one"] = flags.early(0)
flags.mine = [0.0, 0.0, 0.0]
seen["early_one_taken"] = flags.take()     # a step later, on both, as posted
seen["early_unposted"] = flags.early(0)
dist.barrier()
json.dump(seen, open(f"{out}.{r}", "w"))
print("done")
'''


@pytest.mark.deepspeed
def test_posted_flags_are_every_ranks_largest_taken_a_step_later(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = str(s.getsockname()[1])
    s.close()
    ranks = [subprocess.Popen([sys.executable, "-c", DIST_CHILD, RANK, str(r), port, str(tmp_path / "seen")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    for p in ranks:
        out, err = p.communicate(timeout=120)
        assert "done" in out, out[-2000:] + err[-3000:]
    for r in (0, 1):
        seen = json.loads((tmp_path / f"seen.{r}").read_text())
        assert seen == {"none_posted": None, "agree": [1.0, 5.0, 0.0], "taken": [0.0, 10.0, 7.0],
                        "taken_again": None, "then": [1.0, 0.0, 1.0],
                        "early_both": [3.0, 0.0, 1.0], "early_both_left": None,
                        "early_one": None, "early_one_taken": [3.0, 0.0, 4.0], "early_unposted": None}, (r, seen)


def test_short_steps_stop_a_step_later_and_the_usr2_lead_counts_it():
    assert to_stop_s(0.3) == 0.6 and to_stop_s(POSTED_BELOW_S) == POSTED_BELOW_S and to_stop_s(20.0) == 20.0
    assert limits.lead_wanted(10.0, 0.5) == 10 + 1 + limits.SIGNAL_SLACK_S
    assert limits.lead_wanted(10.0, 5.0) == 10 + 5 + limits.SIGNAL_SLACK_S
