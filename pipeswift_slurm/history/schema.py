"""The history database's schema: numbered migrations (``PRAGMA user_version``), never edited
once released (a database already at N gets only N+1 onwards), and the statements that keep
``slurm_jobs`` and its per-job roll-up current on every ingest."""

from __future__ import annotations

#: slurm_jobs' columns, in the order every ingest writes them
COLS = ("cluster", "job_id", "start", "name", "user", "partition", "state", "node_count", "nodes",
        "submit", "end", "exit_code", "work_dir", "time_limit", "procs", "source",
        "account", "qos", "derived_exit_code", "limit_s", "gpus", "mem_mb", "req_mem_mb",
        "cpu_time_s", "max_rss_mb", "eligible", "array_job_id", "array_task_id")

#: an attempt Slurm stopped and put back in the queue (its work is lost unless it checkpointed)
STOPPED = "('PREEMPTED', 'REQUEUED')"
#: of those, a preemption (a requeue by `scontrol requeue`, the job's own or an admin's, is
#: REQUEUED: it is not the partition preempting anyone, and must not raise every user's rate)
PREEMPTED = "('PREEMPTED')"


def _rollup(touched: str) -> str:
    """Recompute job_rollup's row of every (cluster, job_id) in ``touched``: totals over the
    attempts, and what the newest attempt says (name, state, exit codes, size, limit). A plain
    job's waste is every stopped attempt's elapsed time x its CPUs (else nodes); NULL (unknown)
    when one of them lacks its end or size. Its queue wait counts from when it was first
    eligible (a `--begin` or a hold is the user's choice, not the queue's)."""
    return f"""
    WITH agg AS (
        SELECT s.cluster, s.job_id, MAX(s.start) AS last_start, MIN(s.submit) AS submit,
            MIN(s.eligible) AS eligible, MAX(s.end) AS end, COUNT(*) AS attempts,
            SUM(CASE WHEN s.state IN {PREEMPTED} THEN 1 ELSE 0 END) AS preempted,
            SUM(s.end - s.start) AS run_s,
            SUM((s.end - s.start) * s.node_count) AS node_s,
            SUM((s.end - s.start) * s.procs) AS cpu_s,
            SUM((s.end - s.start) * COALESCE(s.gpus, 0)) AS gpu_s,
            SUM(s.cpu_time_s) AS cpu_time_s, MAX(s.max_rss_mb) AS max_rss_mb,
            MAX(s.req_mem_mb) AS req_mem_mb,
            CASE WHEN SUM(CASE WHEN s.state IN {STOPPED} AND (s.end IS NULL OR
                          COALESCE(s.procs, s.node_count) IS NULL) THEN 1 ELSE 0 END) > 0 THEN NULL
                 ELSE SUM(CASE WHEN s.state IN {STOPPED}
                          THEN (s.end - s.start) * COALESCE(s.procs, s.node_count) ELSE 0 END) END
                AS wasted_s
        FROM slurm_jobs s JOIN {touched} t ON t.cluster = s.cluster AND t.job_id = s.job_id
        GROUP BY s.cluster, s.job_id)
    INSERT OR REPLACE INTO job_rollup (cluster, job_id, job_num, name, partition, user, account,
        qos, nodes, cpus, gpus, work_dir, submit, end, attempts, preempted, run_s, jct_s, queue_s,
        last_state, exit_code, derived_exit_code, limit_s, last_elapsed_s, node_s, cpu_s, gpu_s,
        cpu_time_s, max_rss_mb, req_mem_mb, wasted_s, start, nodelist, mem_mb)
    SELECT a.cluster, a.job_id, CAST(a.job_id AS INTEGER), l.name, l.partition, l.user, l.account,
        l.qos, l.node_count, l.procs, l.gpus, l.work_dir, a.submit, a.end, a.attempts, a.preempted,
        a.run_s, a.end - a.submit, a.end - MAX(a.submit, COALESCE(a.eligible, a.submit)) - a.run_s, l.state, l.exit_code,
        l.derived_exit_code, l.limit_s, l.end - l.start, a.node_s, a.cpu_s, a.gpu_s, a.cpu_time_s,
        a.max_rss_mb, a.req_mem_mb, a.wasted_s, l.start, l.nodes, l.mem_mb
    FROM agg a JOIN slurm_jobs l ON l.cluster = a.cluster AND l.job_id = a.job_id
        AND l.start = a.last_start
    """


MIGRATIONS: list[str] = [
    # 1: jobs, attempts, per-config step-time statistics, per-layer profiles, ingest bookkeeping
    """
    CREATE TABLE jobs (
        id INTEGER PRIMARY KEY,
        run_dir TEXT UNIQUE NOT NULL,
        job_id TEXT, name TEXT, partition TEXT, user TEXT, model_key TEXT,
        submit_time REAL, start_time REAL, end_time REAL, state TEXT, steps INTEGER,
        chosen_nodes INTEGER, predicted_step_s REAL, predicted_jct_s REAL, predicted_queue_s REAL,
        actual_step_s REAL, actual_jct_s REAL
    );
    CREATE INDEX jobs_model ON jobs(model_key);
    CREATE INDEX jobs_partition ON jobs(partition, submit_time);
    CREATE TABLE attempts (
        job INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        attempt INTEGER NOT NULL,
        nodes INTEGER, stages INTEGER, data_parallel INTEGER, micro_batches INTEGER,
        micro_batch_size INTEGER, boundaries TEXT, config_key TEXT,
        start_time REAL, end_time REAL, start_step INTEGER, end_step INTEGER, ended TEXT,
        setup_s REAL, load_s REAL, checkpoint_s REAL, train_s REAL, resumed_from TEXT,
        step_count INTEGER, step_mean REAL, step_var REAL, step_p50 REAL, step_p95 REAL,
        PRIMARY KEY (job, attempt)
    );
    CREATE INDEX attempts_config ON attempts(config_key);
    CREATE TABLE layer_profiles (
        model_key TEXT NOT NULL, micro_batch_size INTEGER NOT NULL, layer INTEGER NOT NULL,
        seconds REAL, param_bytes INTEGER, activation_bytes INTEGER, samples INTEGER,
        updated REAL, PRIMARY KEY (model_key, micro_batch_size, layer)
    );
    CREATE TABLE ingest_state (run_dir TEXT PRIMARY KEY, size INTEGER, mtime REAL);
    """,
    # 2: every Slurm job attempt, pswift or not (jobcomp plugin spool, sacct, jobcomp filetxt)
    """
    CREATE TABLE slurm_jobs (
        cluster TEXT NOT NULL DEFAULT '', job_id TEXT NOT NULL, start REAL NOT NULL,
        name TEXT, user TEXT, partition TEXT, state TEXT, node_count INTEGER, nodes TEXT,
        submit REAL, end REAL, exit_code TEXT, work_dir TEXT, time_limit TEXT, procs INTEGER,
        source TEXT, PRIMARY KEY (cluster, job_id, start)
    ) WITHOUT ROWID;
    CREATE INDEX slurm_jobs_work_dir ON slurm_jobs(work_dir);
    """,
    # 3: one row per Slurm job (all its attempts rolled up), kept current by every ingest, so
    #    reports over millions of jobs read one narrow row per job
    """
    CREATE TABLE job_rollup (
        cluster TEXT NOT NULL, job_id TEXT NOT NULL, partition TEXT, user TEXT, nodes INTEGER,
        work_dir TEXT, submit REAL, attempts INTEGER, preempted INTEGER, run_s REAL, jct_s REAL,
        queue_s REAL, last_state TEXT, PRIMARY KEY (cluster, job_id)
    ) WITHOUT ROWID;
    CREATE INDEX job_rollup_partition ON job_rollup(partition, submit);
    INSERT INTO job_rollup SELECT cluster, job_id, MAX(partition), MAX(user), MAX(node_count),
        MAX(work_dir), MIN(submit), COUNT(*),
        SUM(CASE WHEN state IN ('PREEMPTED', 'REQUEUED') THEN 1 ELSE 0 END), SUM(end - start),
        MAX(end) - MIN(submit), MAX(end) - MIN(submit) - SUM(end - start), NULL
        FROM slurm_jobs GROUP BY cluster, job_id;
    """,
    # 4: every candidate the planner weighed for a job, with its prediction or rejection
    """
    CREATE TABLE plan_decisions (
        job INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE, rank INTEGER NOT NULL,
        chosen INTEGER, nodes INTEGER, stages INTEGER, data_parallel INTEGER, micro_batches INTEGER,
        boundaries TEXT, queue_s REAL, step_s REAL, train_s REAL, jct_s REAL, step_source TEXT,
        rejected TEXT, PRIMARY KEY (job, rank)
    );
    """,
    # 5: what the engine spends outside the layers, from the launcher's instruction timing
    """
    CREATE TABLE pipe_overheads (
        model_key TEXT NOT NULL, micro_batch_size INTEGER NOT NULL, stages INTEGER,
        micro_batches INTEGER, overhead_s REAL, last_stage_overhead_s REAL, send_s REAL,
        step_overhead_s REAL, updated REAL, PRIMARY KEY (model_key, micro_batch_size)
    );
    """,
    # 6: how far `ingest --sacct` has read each cluster's accounting (the newest end time seen)
    """
    CREATE TABLE sacct_state (cluster TEXT PRIMARY KEY, last_end REAL NOT NULL) WITHOUT ROWID;
    """,
    # 7: in-job re-layouts (re-balanced stage cuts), predicted and measured
    """
    ALTER TABLE attempts ADD COLUMN relayouts INTEGER;
    CREATE TABLE relayouts (
        job INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE, attempt INTEGER NOT NULL,
        step INTEGER NOT NULL, boundaries_from TEXT, boundaries_to TEXT, step_s REAL,
        predicted_step_s REAL, measured_step_s REAL, predicted_gain_s REAL, measured_gain_s REAL,
        predicted_cost_s REAL, measured_cost_s REAL, PRIMARY KEY (job, attempt, step)
    );
    """,
    # 8: growths beside the re-layouts (kind "relayout" or "grow", the node counts), each
    #    job's predicted JCT band, what each layer saves for its backward
    """
    ALTER TABLE relayouts ADD COLUMN kind TEXT;
    ALTER TABLE relayouts ADD COLUMN nodes_from INTEGER;
    ALTER TABLE relayouts ADD COLUMN nodes_to INTEGER;
    ALTER TABLE relayouts ADD COLUMN nodes_got INTEGER;
    ALTER TABLE jobs ADD COLUMN predicted_jct_p10_s REAL;
    ALTER TABLE jobs ADD COLUMN predicted_jct_p50_s REAL;
    ALTER TABLE jobs ADD COLUMN predicted_jct_p90_s REAL;
    ALTER TABLE layer_profiles ADD COLUMN saved_bytes INTEGER;
    """,
    # 9: what admins ask of every job (account, QOS, allocated TRES, limit, CPU time, MaxRSS,
    #    derived exit code), a job-id index, and a wider roll-up (numeric job order, node-, CPU-
    #    and GPU-seconds, efficiency inputs, a plain job's preemption waste), rebuilt from slurm_jobs
    """
    ALTER TABLE slurm_jobs ADD COLUMN account TEXT;
    ALTER TABLE slurm_jobs ADD COLUMN qos TEXT;
    ALTER TABLE slurm_jobs ADD COLUMN derived_exit_code TEXT;
    ALTER TABLE slurm_jobs ADD COLUMN limit_s REAL;
    ALTER TABLE slurm_jobs ADD COLUMN gpus INTEGER;
    ALTER TABLE slurm_jobs ADD COLUMN mem_mb REAL;
    ALTER TABLE slurm_jobs ADD COLUMN req_mem_mb REAL;
    ALTER TABLE slurm_jobs ADD COLUMN cpu_time_s REAL;
    ALTER TABLE slurm_jobs ADD COLUMN max_rss_mb REAL;
    ALTER TABLE slurm_jobs ADD COLUMN eligible REAL;
    CREATE INDEX slurm_jobs_job_id ON slurm_jobs(job_id);
    CREATE INDEX slurm_jobs_start ON slurm_jobs(start);
    DROP TABLE job_rollup;
    CREATE TABLE job_rollup (
        cluster TEXT NOT NULL, job_id TEXT NOT NULL, job_num INTEGER, name TEXT, partition TEXT,
        user TEXT, account TEXT, qos TEXT, nodes INTEGER, cpus INTEGER, gpus INTEGER,
        work_dir TEXT, submit REAL, end REAL, attempts INTEGER, preempted INTEGER, run_s REAL,
        jct_s REAL, queue_s REAL, last_state TEXT, exit_code TEXT, derived_exit_code TEXT,
        limit_s REAL, last_elapsed_s REAL, node_s REAL, cpu_s REAL, gpu_s REAL, cpu_time_s REAL,
        max_rss_mb REAL, req_mem_mb REAL, wasted_s REAL, PRIMARY KEY (cluster, job_id)
    ) WITHOUT ROWID;
    CREATE INDEX job_rollup_partition ON job_rollup(partition, submit);
    CREATE INDEX job_rollup_num ON job_rollup(job_num, job_id);
    CREATE INDEX job_rollup_job_id ON job_rollup(job_id);
    CREATE INDEX job_rollup_work_dir ON job_rollup(work_dir);
    """,   # filled by migration 14, which adds the columns the roll-up now writes
    # 10: crashes inside an attempt: how often its ranks were started again in the allocation,
    #     and what ended its last crashed launch (pipeswift_slurm.planning.decide)
    """
    ALTER TABLE attempts ADD COLUMN restarts INTEGER;
    ALTER TABLE attempts ADD COLUMN last_crash TEXT;
    """,
    # 11: a pswift job is its run directory *and* its Slurm identity (cluster, job id, user): a
    #     new job at the same path in a shared scratch no longer replaces another job's rows
    #     (jobs rebuilt without UNIQUE(run_dir); History._migrate turns foreign keys off for it)
    """
    CREATE TABLE jobs_v11 (
        id INTEGER PRIMARY KEY, cluster TEXT NOT NULL DEFAULT '', run_dir TEXT NOT NULL,
        job_id TEXT, name TEXT, partition TEXT, user TEXT, model_key TEXT,
        submit_time REAL, start_time REAL, end_time REAL, state TEXT, steps INTEGER,
        chosen_nodes INTEGER, predicted_step_s REAL, predicted_jct_s REAL, predicted_queue_s REAL,
        actual_step_s REAL, actual_jct_s REAL, predicted_jct_p10_s REAL, predicted_jct_p50_s REAL,
        predicted_jct_p90_s REAL
    );
    INSERT INTO jobs_v11 (id, run_dir, job_id, name, partition, user, model_key, submit_time, start_time, end_time, state, steps, chosen_nodes, predicted_step_s, predicted_jct_s, predicted_queue_s, actual_step_s, actual_jct_s, predicted_jct_p10_s, predicted_jct_p50_s, predicted_jct_p90_s) SELECT id, run_dir, job_id, name, partition, user, model_key, submit_time, start_time, end_time, state, steps, chosen_nodes, predicted_step_s, predicted_jct_s, predicted_queue_s, actual_step_s, actual_jct_s, predicted_jct_p10_s, predicted_jct_p50_s, predicted_jct_p90_s FROM jobs;
    DROP TABLE jobs;
    ALTER TABLE jobs_v11 RENAME TO jobs;
    CREATE INDEX jobs_model ON jobs(model_key);
    CREATE INDEX jobs_partition ON jobs(partition, submit_time);
    CREATE INDEX jobs_job_id ON jobs(job_id);
    CREATE UNIQUE INDEX jobs_identity ON jobs(run_dir, cluster, COALESCE(job_id, ''), COALESCE(user, ''))
    """,
    # 12: the hardware each launch measured at its start (pipeswift_launch.probe), which the
    #     planner fits its links and device memory from
    """
    ALTER TABLE attempts ADD COLUMN device TEXT;
    ALTER TABLE attempts ADD COLUMN p2p_latency_s REAL;
    ALTER TABLE attempts ADD COLUMN p2p_bandwidth REAL;
    ALTER TABLE attempts ADD COLUMN device_memory INTEGER;
    ALTER TABLE attempts ADD COLUMN ranks_per_host INTEGER;
    ALTER TABLE attempts ADD COLUMN host_cores INTEGER;
    """,
    # 13: a preemption is a PREEMPTED attempt only (not a REQUEUED one), a queue wait counts
    #     from eligibility (every roll-up row is recomputed by migration 14)
    "SELECT 1",
    # 14: sacct's Start, NodeList and AllocTRES of the newest attempt in the roll-up (issue 42):
    #     every roll-up row recomputed
    """
    ALTER TABLE job_rollup ADD COLUMN start REAL;
    ALTER TABLE job_rollup ADD COLUMN nodelist TEXT;
    ALTER TABLE job_rollup ADD COLUMN mem_mb REAL;
    """ + _rollup("(SELECT DISTINCT cluster, job_id FROM slurm_jobs)"),
    # 15: a layer's weight-gradient pass W measured apart under ZB-H1 (issue 41; part of seconds)
    """
    ALTER TABLE layer_profiles ADD COLUMN weight_seconds REAL;
    """,
    # 16: W's share of the layer's seconds, kept when a later profile (1F1B's) cannot measure it:
    #     the planner's ZB-H1 model (schedule = "auto") reads it
    """
    ALTER TABLE layer_profiles ADD COLUMN weight_fraction REAL;
    UPDATE layer_profiles SET weight_fraction = weight_seconds / seconds
        WHERE weight_seconds IS NOT NULL AND seconds > 0;
    """,
    # 17: a job array's task (issue 62: a pswift run of members is one array): the array's job
    #     id and the task's index, which tie each member's Slurm job to its run
    """
    ALTER TABLE slurm_jobs ADD COLUMN array_job_id TEXT;
    ALTER TABLE slurm_jobs ADD COLUMN array_task_id INTEGER;
    CREATE INDEX slurm_jobs_array ON slurm_jobs(array_job_id);
    """,
]

#: upsert one attempt: a source that does not know a field (the plugin knows no MaxRSS, sacct
#: no spool) keeps what another source said
UPSERT = (f"INSERT INTO slurm_jobs ({', '.join(COLS)}) VALUES ({', '.join('?' * len(COLS))}) "
          f"ON CONFLICT (cluster, job_id, start) DO UPDATE SET " +
          ", ".join(f"{c} = COALESCE(excluded.{c}, {c})" for c in COLS[3:]))

#: after an ingest: the roll-up rows of the jobs it touched
ROLLUP = _rollup("temp.touched")
