"""The hardware probe's figures (pipeswift_launch.probe) always fit the events schema: one CI run
timed the 4 MiB transfer faster than the 4-byte one, got a bandwidth of 4e15 B/s, and the start
event carrying it was dropped whole by the readers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeswift_launch.probe import BIG_ELEMENTS, MAX_BANDWIDTH, MIN_SECONDS, link_figures
from pipeswift_slurm import events

START = {"event": "start", "time": 1.0, "attempt": 0, "nodes": 2, "world_size": 2, "stages": 2,
         "data_parallel": 1, "micro_batches": 4, "micro_batch_size": 8, "step": 0}
seconds = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(seconds, seconds)
def test_any_timing_gives_figures_the_start_event_keeps(small, big):
    latency, per_byte = link_figures(small, big)
    bandwidth = 1.0 / per_byte
    assert MIN_SECONDS <= latency and bandwidth <= MAX_BANDWIDTH
    ev = events.validate({**START, "device": "cpu", "p2p_latency_s": latency, "p2p_bandwidth": bandwidth,
                          "device_memory": 12 << 30, "ranks_per_host": 2, "host_cores": 2})
    assert ev is not None and ev["p2p_bandwidth"] == bandwidth


def test_a_slow_link_reads_as_its_own_figures_and_the_ci_runs_timing_as_the_fastest_link():
    big = 4 * BIG_ELEMENTS / 2e9 + 2e-4                                    # 200 us, then 2 GB/s
    latency, per_byte = link_figures(2e-4, big)
    assert latency == 2e-4 and 1.0 / per_byte == pytest.approx(4 * BIG_ELEMENTS / big)   # 1.83 GB/s
    latency, per_byte = link_figures(5.7e-3, 1e-9)                         # the CI run's noise
    assert latency == 5.7e-3 and 1.0 / per_byte == MAX_BANDWIDTH
