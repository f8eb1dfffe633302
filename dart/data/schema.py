"""Versioned DDL of the projection: migrations applied in order at start.

A migration is never edited once released: a change is a new migration with the next
version. ``{db}`` is replaced by the configured database name. Every event table is a
``ReplacingMergeTree`` whose sorting key ends in ``event_id``, so a redelivered event (same
id, same content) collapses into one row; queries that count read with ``FINAL`` (or
aggregate over the natural key) so duplicates not yet merged never show.
"""

from __future__ import annotations

from dataclasses import dataclass

ENVELOPE = """
    event_id String,
    event_time DateTime64(3, 'UTC'),
    run_id LowCardinality(String),
    producer LowCardinality(String),"""

SAMPLING = """
    temperature Float64,
    top_p Float64,
    max_new_tokens Int32,
    seed Int64,
    frequency_penalty Float64,"""


def _table(name: str, columns: str, order_by: str, granularity: int = 8192) -> str:
    return (
        f"CREATE TABLE IF NOT EXISTS {{db}}.{name} ({ENVELOPE}{columns.rstrip().rstrip(',')}\n)"
        f" ENGINE = ReplacingMergeTree ORDER BY ({order_by}) SETTINGS index_granularity = {granularity}"
    )


# Steps are read a trajectory at a time (a batch = a few dozen rollouts): small granules keep
# a point lookup by rollout_id from reading 8192 rows of token arrays per rollout.
STEP_GRANULARITY = 1024


V1_TABLES = (
    _table("tasks", """
    task_id String, domain LowCardinality(String), instruction String, backend LowCardinality(String),
    split LowCardinality(String), task_json String, source String""", "task_id, event_id"),
    _table("requests", f"""
    request_id String, task_id String, group_id String, rollout_index Int32, group_size Int32,
    max_steps Int32, attempt Int32, mode LowCardinality(String), backend LowCardinality(String),{SAMPLING}
    scheduled_at_version Int64""", "group_id, rollout_index, event_id"),
    _table("observations", f"""
    rollout_id String, request_id String, task_id String, group_id String, step_index Int32,
    instruction String, screenshot_digest String, screen_width Int32, screen_height Int32,
    history_step_index Array(Int32), history_screenshot_digest Array(String),
    history_response_text Array(String),
    reply_topic String, reply_partition Int32, reply_worker String,{SAMPLING}
    max_steps Int32, mode LowCardinality(String), env_worker LowCardinality(String), slot Int32""",
           "rollout_id, step_index, event_id", STEP_GRANULARITY),
    _table("actions", f"""
    in_reply_to String, rollout_id String, request_id String, task_id String, step_index Int32,
    response_text String, action_kinds Array(LowCardinality(String)), actions_json String,
    response_token_ids Array(Int32), logprobs Array(Float32), entropies Array(Float32),
    num_tokens Int32, mean_entropy Float64, policy_version Int64, prompt_hash String,
    prompt_tokens Int32, finish_reason LowCardinality(String), engine LowCardinality(String),
    queue_s Float64, generate_s Float64,{SAMPLING}
    newer_version_seen Nullable(Int64)""", "rollout_id, step_index, event_id", STEP_GRANULARITY),
    _table("trajectories", """
    rollout_id String, request_id String, task_id String, group_id String, rollout_index Int32,
    status LowCardinality(String), finish_reason LowCardinality(String), num_steps Int32,
    max_steps Int32, step_policy_versions Array(Int64), min_policy_version Int64,
    max_policy_version Int64, error Nullable(String), attempt Int32, mode LowCardinality(String),
    origin LowCardinality(String), env_worker LowCardinality(String), slot Int32, reset_s Float64,
    env_s Float64, policy_wait_s Float64, eval_s Float64, started_at DateTime64(3, 'UTC')""",
           "task_id, rollout_id, event_id"),
    _table("rewards", """
    rollout_id String, task_id String, group_id String, reward Float64,
    evaluator LowCardinality(String), evaluator_version LowCardinality(String), details String""",
           "rollout_id, event_id"),
    _table("batches", """
    batch_id String, seq Int64, manifest_digest String, manifest_bytes Int64, num_samples Int32,
    num_groups Int32, num_trajectories Int32, rollout_ids Array(String), task_ids Array(String),
    min_policy_version Int64, max_policy_version Int64, trainer_version Int64, injected Int32""",
           "batch_id, event_id"),
    _table("weights", """
    version Int64, parent_version Int64, blob_names Array(String), blob_digests Array(String),
    blob_sizes Array(Int64), sha256 String, format LowCardinality(String), train_step Int64,
    batch_id Nullable(String)""", "version, event_id"),
    _table("train_metrics", """
    step Int64, policy_version Int64, batch_id String, loss Float64, kl Float64, entropy Float64,
    clip_frac Float64, tis_mean Float64, logprob_mismatch Float64, grad_norm Float64,
    num_samples Int32, num_tokens Int64, duration_s Float64, tokens_per_s Float64,
    metrics Map(String, Float64)""", "step, event_id"),
    _table("heartbeats", """
    worker_id String, role LowCardinality(String), state LowCardinality(String), host String,
    pid Int32, slots Int32, slots_busy Int32, busy_s Float64, idle_s Float64, uptime_s Float64,
    policy_version Nullable(Int64), health LowCardinality(String), metrics Map(String, Float64),
    info Map(String, String)""", "worker_id, event_time, event_id"),
    _table("weights_loaded", """
    worker_id String, version Int64, previous_version Int64, ok Bool, fetch_s Float64,
    swap_s Float64, error Nullable(String)""", "worker_id, version, event_id"),
    _table("dead_letters", """
    source_topic String, partition Int32, offset Int64, key Nullable(String), value String,
    stage LowCardinality(String), error_type LowCardinality(String), error String,
    consumer_group LowCardinality(String)""", "source_topic, event_id"),
)

V2_VIEWS = (
    # One row per rollout: its latest TrajectoryFinished (a redo of a killed worker's request
    # runs the same rollout_id again) with its latest reward (re-scoring is a new event).
    """CREATE VIEW IF NOT EXISTS {db}.trajectory_rewards AS
    SELECT t.*, r.reward AS reward, r.evaluator AS evaluator, r.has_reward AS has_reward
    FROM (SELECT * FROM {db}.trajectories FINAL ORDER BY event_time DESC, event_id LIMIT 1 BY rollout_id) AS t
    LEFT JOIN (
        SELECT rollout_id, argMax(reward, event_time) AS reward,
               argMax(evaluator, event_time) AS evaluator, 1 AS has_reward
        FROM {db}.rewards FINAL GROUP BY rollout_id
    ) AS r USING rollout_id""",
    # Every step of every run, one row each: what the model saw, what it said, how it ended.
    """CREATE VIEW IF NOT EXISTS {db}.steps AS
    SELECT a.rollout_id AS rollout_id, a.step_index AS step_index, a.task_id AS task_id,
           a.policy_version AS policy_version, a.response_text AS response_text,
           a.action_kinds AS action_kinds, a.num_tokens AS num_tokens,
           a.mean_entropy AS mean_entropy, a.generate_s AS generate_s, a.engine AS engine,
           o.screenshot_digest AS screenshot_digest, o.env_worker AS env_worker,
           t.status AS status, t.num_steps AS num_steps, t.origin AS origin, t.mode AS mode,
           t.reward AS reward
    FROM {db}.actions AS a FINAL
    LEFT JOIN {db}.observations AS o FINAL
        ON a.rollout_id = o.rollout_id AND a.step_index = o.step_index
    LEFT JOIN {db}.trajectory_rewards AS t ON a.rollout_id = t.rollout_id""",
)


# Derived state of the data manager, not events: a cache that makes its first pass after a restart
# as cheap as a later one. A store rebuilt from the log has none (and reads the whole run once);
# `dart replay` compares the event tables only.
V3_STATE = (
    "CREATE TABLE IF NOT EXISTS {db}.manager_state (key String, saved_ms Int64, state String)"
    " ENGINE = ReplacingMergeTree(saved_ms) ORDER BY key",
)


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "event tables", V1_TABLES),
    Migration(2, "views: trajectory_rewards, steps", V2_VIEWS),
    Migration(3, "data manager state: the curation horizon", V3_STATE),
)

SCHEMA_VERSION_DDL = (
    "CREATE TABLE IF NOT EXISTS {db}.schema_version (version UInt32, name String, "
    "applied_at DateTime64(3, 'UTC') DEFAULT now64(3)) ENGINE = ReplacingMergeTree ORDER BY version"
)


def pending(applied: set[int], migrations: tuple[Migration, ...] = MIGRATIONS) -> list[Migration]:
    """Migrations not applied yet, in version order (pure)."""
    versions = [m.version for m in migrations]
    if versions != sorted(set(versions)):
        raise ValueError(f"migration versions must be strictly increasing, got {versions}")
    return [m for m in migrations if m.version not in applied]


def render(statement: str, database: str) -> str:
    return statement.replace("{db}", database)
