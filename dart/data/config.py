"""Typed, frozen configuration of the data manager (built with ``dart.config.build``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from dart.config import require
from dart.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class StoreConfig:
    """Where the projection lives: chdb embedded (default) or a ClickHouse server."""

    dsn: str = "chdb://./dart-data/chdb"
    """chdb:///abs/path (embedded; one process per path) or http://host:8123 (ClickHouse server)."""
    database: str = "dart"
    """Database that holds the projection tables; created on start."""
    username: str = "default"
    """ClickHouse server user (server mode only)."""
    password_env: str = "CLICKHOUSE_PASSWORD"
    """Environment variable holding the server password (never put secrets in config files)."""
    password_file: Path | None = None
    """File holding the password, read when `password_env` is unset or empty (the compose
    stack's writer password, in a volume only the data manager mounts)."""

    @property
    def password(self) -> str:
        """The server password: `password_env`, else `password_file`, else empty."""
        from_env = os.environ.get(self.password_env)
        if from_env:
            return from_env
        if self.password_file is not None:
            try:
                return self.password_file.read_text().strip()
            except OSError as exc:
                raise ConfigError(f"store.password_file: cannot read {self.password_file}: {exc}") from exc
        return ""

    def __post_init__(self) -> None:
        require(self.dsn.startswith(("chdb://", "http://", "https://")), "dsn",
                f"must start with chdb://, http:// or https://, got {self.dsn!r}")
        require(self.database.isidentifier(), "database", f"must be an identifier, got {self.database!r}")


@dataclass(frozen=True, kw_only=True)
class ProjectionConfig:
    """How events are written into the projection."""

    batch_rows: int = 5000
    """Most events per insert. An insert holds what one consumer fetch returned for a
    partition: under load fetches fill up to this (size), when quiet they return within the
    consumer's poll window (time); the offsets are committed only after the insert."""
    group: str = "data-manager"
    """Consumer group of the projection consumer."""
    linger_ms: int = 400
    """After a fetch returns records, keep fetching for up to this long (or until ``batch_rows``)
    before inserting: Kafka Connect's flush interval. An insert has a fixed cost (a new part in
    every table the events reach), so a steady trickle of small fetches cost the data manager
    more CPU than the env and rollout workers that made the events; 0: insert every fetch."""
    fetch_max_wait_ms: int = 250
    """How long the broker may hold the projection's fetch when no record is there. The projection
    lingers anyway; a short wait keeps the broker answering empty fetches of every partition for every
    idle consumer (`benchmarks/idle_fetch.py` measures it; `bus.fetch_max_wait_ms` is for the hot path)."""
    clickhouse_decode: bool = True
    """ClickHouse decodes the Avro records and maps them to rows itself (``dart/data/avroload.py``;
    embedded chdb only; `benchmarks/ingest.py` times both); false: every record is decoded and mapped in Python
    (``rows.py``). Both write the same rows."""

    def __post_init__(self) -> None:
        require(self.batch_rows >= 1, "batch_rows", f"must be >= 1, got {self.batch_rows}")
        require(0 <= self.linger_ms <= 60_000, "linger_ms", f"must be 0-60000, got {self.linger_ms}")
        require(1 <= self.fetch_max_wait_ms <= 10_000, "fetch_max_wait_ms",
                f"must be 1-10000, got {self.fetch_max_wait_ms}")


@dataclass(frozen=True, kw_only=True)
class CurationConfig:
    """DART adaptive data curation (each rule is a pure function in ``dart.data.curation``)."""

    success_threshold: float = 0.5
    """A trajectory is a success when its reward is >= this."""
    window: int = 32
    """Success rate of a task over its last `window` finished trajectories..."""
    window_versions: int = 4
    """... produced by policy versions >= current - window_versions."""
    n_default: int = 8
    """Rollouts per task while its success rate is below `rate_threshold` (or unknown)."""
    n_min: int = 2
    """Fewest rollouts per task (DART n = max(n_min, floor(9/s - 7)))."""
    rate_threshold: float = 0.6
    """Success rate from which fewer rollouts are requested."""
    max_steps: int = 30
    """Trajectory step cap; unsolved tasks get it."""
    min_steps: int = 5
    """Smallest per-task step cap."""
    steps_slack: float = 1.5
    """Per-task cap = ceil(longest successful length * slack), bounded by [min_steps, max_steps]."""
    adaptive_max_steps: bool = True
    """Per-task step caps from successful lengths (False: always `max_steps`)."""
    lengths_from: str = "online"
    """Whose successes set a task's cap: ``online`` (the policy's own rollouts) or ``any`` (experience
    and oracle trajectories too). An oracle solves a task in its fewest steps, and 1.5x that is a
    cap a policy that still makes mistakes rarely meets: its groups on the task stay all-fail."""
    staleness_bound: int = 4
    """Samples from policy versions < current - staleness_bound are never batched."""
    entropy_top_fraction: float = 0.8
    """Keep this fraction of steps with the highest mean token entropy (1.0 keeps all)."""
    min_failed_steps: int = 4
    """Drop failed trajectories shorter than this many steps (0 keeps all; public DART code: 4)."""
    inject_experience: bool = True
    """Put one pool success into a group whose online rollouts all failed."""
    experience_sft: bool = True
    """Mark injected samples for the trainer's SFT term."""

    def __post_init__(self) -> None:
        require(0.0 < self.success_threshold <= 1.0, "success_threshold", f"must be in (0, 1], got {self.success_threshold}")
        require(self.window >= 1, "window", f"must be >= 1, got {self.window}")
        require(self.window_versions >= 0, "window_versions", f"must be >= 0, got {self.window_versions}")
        require(2 <= self.n_min <= self.n_default, "n_min", f"must be in [2, n_default] (a group needs two), got {self.n_min}")
        require(0.0 < self.rate_threshold <= 1.0, "rate_threshold", f"must be in (0, 1], got {self.rate_threshold}")
        require(1 <= self.min_steps <= self.max_steps, "min_steps", f"must be in [1, max_steps], got {self.min_steps}")
        require(self.steps_slack >= 1.0, "steps_slack", f"must be >= 1, got {self.steps_slack}")
        require(self.lengths_from in ("online", "any"), "lengths_from",
                f"must be 'online' or 'any', got {self.lengths_from!r}")
        require(self.staleness_bound >= 0, "staleness_bound", f"must be >= 0, got {self.staleness_bound}")
        require(0.0 < self.entropy_top_fraction <= 1.0, "entropy_top_fraction",
                f"must be in (0, 1], got {self.entropy_top_fraction}")
        require(self.min_failed_steps >= 0, "min_failed_steps", f"must be >= 0, got {self.min_failed_steps}")


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """Keeps env slots busy with RolloutRequested, bounded and paced by the trainer."""

    enabled: bool = True
    """Emit rollout requests (False: project and batch only)."""
    interval_s: float = 1.5
    """Seconds between scheduling passes. A pass is a few curation queries (0.3-0.5 s on the store
    thread late in a `make run` on 2 busy cores): at 0.5 s the data manager took ~55 % of a core
    that the rollout worker and the trainer need."""
    capacity: int | None = None
    """Env slots; None sums `slots` of live env worker heartbeats."""
    capacity_factor: float = 3.0
    """In-flight rollouts <= capacity * factor (a queue keeps slots busy between two passes),
    unless ``refill_cycles`` asks for more. At 2x the slots ran dry between two 1.5 s passes late
    in a `make run` (engine batches fell from ~20 rows to 3)."""
    refill_cycles: float = 3.0
    """The queue must last this many scheduling cycles (the measured time between two passes'
    plans, at least ``interval_s``) at the rate the slots lately finished rollouts: in-flight
    rollouts may reach capacity + that many (see ``scheduler.in_flight_limit``). One cycle until
    the next pass, up to one more before a finished rollout reaches the projection and stops
    counting as in flight, and one for the bursts: the rollout engine answers its batch at once,
    so many slots finish together (a 64-slot run's queue ran dry at 2.3 cycles' worth).
    0: the capacity factor alone."""
    heartbeat_ttl_s: float = 30.0
    """A worker whose last heartbeat is older than this counts as gone."""
    request_timeout_s: float = 1800.0
    """A request with no trajectory after this long no longer counts as in flight."""
    groups_per_task: int = 1
    """Open (unfinished) groups per task at most."""
    max_attempts: int = 3
    """Tries of one rollout (infra errors re-queue it); after this many infra errors its slot
    in the group is given up. Keep equal to the env workers' max_attempts."""
    requeue_infra_errors: bool = False
    """Re-request infra_error rollouts from here. Off: dart's env workers re-queue them
    themselves (attempt + 1); turn on only for env workers that do not."""
    stats_every_s: float = 10.0
    """Success rates, longest successes and the experience pool are read again this often (and
    when the policy version moves); the in-flight count, open groups and load on every pass.
    0: every pass."""
    mode: str = "train"
    """Mode stamped on requests (train | eval)."""
    split: str = "train"
    """Tasks of this split are scheduled."""
    temperature: float = 0.7
    top_p: float = 0.9
    max_new_tokens: int = 500
    frequency_penalty: float = 1.0

    def __post_init__(self) -> None:
        require(self.interval_s > 0, "interval_s", f"must be > 0, got {self.interval_s}")
        require(self.capacity is None or self.capacity >= 0, "capacity", f"must be >= 0, got {self.capacity}")
        require(self.stats_every_s >= 0, "stats_every_s", f"must be >= 0, got {self.stats_every_s}")
        require(self.capacity_factor >= 1.0, "capacity_factor", f"must be >= 1, got {self.capacity_factor}")
        require(self.refill_cycles >= 0, "refill_cycles", f"must be >= 0, got {self.refill_cycles}")
        require(self.groups_per_task >= 1, "groups_per_task", f"must be >= 1, got {self.groups_per_task}")
        require(self.max_attempts >= 1, "max_attempts", f"must be >= 1, got {self.max_attempts}")


@dataclass(frozen=True, kw_only=True)
class BatcherConfig:
    """Turns complete groups into training batches."""

    enabled: bool = True
    """Assemble batches (False: project and schedule only)."""
    interval_s: float = 1.5
    """Seconds between batching passes (a pass is curation queries too: see
    ``SchedulerConfig.interval_s``)."""
    groups_per_batch: int = 6
    """Kept groups (tasks) per batch (DART: 6-8)."""
    min_group_size: int = 2
    """Groups with fewer usable trajectories than this are not trained on."""
    group_timeout_s: float = 1800.0
    """A group missing trajectories after this long is judged with what arrived."""
    steps_grace_s: float = 30.0
    """Wait up to this long after a trajectory finished for all its steps to be projected."""

    def __post_init__(self) -> None:
        require(self.groups_per_batch >= 1, "groups_per_batch", f"must be >= 1, got {self.groups_per_batch}")
        require(self.min_group_size >= 2, "min_group_size", f"must be >= 2, got {self.min_group_size}")


@dataclass(frozen=True, kw_only=True)
class SqlLimits:
    """What one request to the SQL endpoint may cost; past a limit it fails, the endpoint goes on."""

    max_body_bytes: int = 32 * 1024**2
    """Largest request body (query or INSERT data, after decompression); larger: HTTP 413."""
    max_execution_time_s: float = 60.0
    """A query running longer is stopped (ClickHouse TIMEOUT_EXCEEDED)."""
    max_result_rows: int = 10_000_000
    """A result with more rows fails (result_overflow_mode = throw), never silently truncated."""
    max_result_bytes: int = 1024**3
    """A result with more bytes (uncompressed, in memory) fails the same way."""
    max_memory_bytes: int = 4 * 1024**3
    """Memory one query may use (ClickHouse max_memory_usage)."""
    max_concurrent: int = 4
    """Queries run at once; each holds a worker thread."""
    queue_timeout_s: float = 5.0
    """A request that finds `max_concurrent` queries running waits this long, then gets HTTP 503."""
    max_concurrent_per_client: int = 2
    """Queries one client runs at once (a client: the user id owning the peer socket on loopback,
    else the peer address), so one client never holds every slot."""
    max_queued: int = 64
    """Requests waiting for a slot; past it a request gets HTTP 503 at once."""
    max_connections: int = 256
    """Open connections; past it a new one is closed at once. Kept well below the process's file
    descriptor limit (the endpoint takes at most a quarter of it) so the projection always has
    descriptors left."""
    header_timeout_s: float = 10.0
    """A connection that began a request must finish its headers within this, else it is closed."""
    body_timeout_s: float = 30.0
    """A request body must arrive within this, else HTTP 408 and the connection is closed."""
    idle_timeout_s: float = 30.0
    """A connection with no request in progress for this long is closed."""
    max_query_chars: int = 32_768
    """Longest statement (an INSERT's data after FORMAT X / VALUES does not count): ClickHouse's
    parser is slow on some texts (nested brackets, long lists inside them), so its time is
    bounded by bounding the text (dart's own report queries are a few KB)."""
    max_bracket_depth: int = 128
    """Deepest nesting of ( [ { in a statement (counted over the raw text, inside strings too):
    unclosed nesting is what makes ClickHouse's parser slow."""
    max_inflate_ratio: int = 100
    """A compressed body may inflate to at most this many times its size (and `max_body_bytes`)."""
    max_unsent_bytes: int = 2 * 1024**3
    """Results held for their clients at once, all together (a result is held from the end of its
    query until its client has taken the last byte); a finished result that would pass it gets HTTP
    503 instead, so clients that never read cannot pin `max_result_bytes` each."""
    send_timeout_s: float = 30.0
    """A client must take each MiB of its result within this, else its connection is closed and the
    result freed."""
    max_login_failures: int = 5
    """Wrong writer passwords one client may send within `login_failure_window_s`; past it its
    logins get HTTP 429 without a password check (each check is PBKDF2 work) until the window passes."""
    login_failure_window_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_result_rows", "max_result_bytes", "max_memory_bytes", "max_concurrent",
                     "max_concurrent_per_client", "max_connections", "max_query_chars", "max_bracket_depth",
                     "max_inflate_ratio", "max_unsent_bytes", "max_login_failures"):
            require(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        require(self.max_execution_time_s > 0, "max_execution_time_s", f"must be > 0, got {self.max_execution_time_s}")
        require(self.queue_timeout_s >= 0, "queue_timeout_s", f"must be >= 0, got {self.queue_timeout_s}")
        require(self.max_queued >= 0, "max_queued", f"must be >= 0, got {self.max_queued}")
        for name in ("header_timeout_s", "body_timeout_s", "idle_timeout_s", "send_timeout_s", "login_failure_window_s"):
            require(getattr(self, name) > 0, name, f"must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True, kw_only=True)
class HttpConfig:
    """The ClickHouse HTTP interface served over the embedded store (see the README's Security)."""

    enabled: bool = True
    """Serve SQL over HTTP (chdb allows one process per database: this is how others query it)."""
    host: str = "127.0.0.1"
    """Bind address; keep it on loopback: analytics clients need no credentials."""
    port: int = 8123
    """TCP port; 0 picks a free one (written to `port_file`)."""
    port_file: Path | None = None
    """Write the bound port here once serving."""
    limits: SqlLimits = field(default_factory=SqlLimits)
    writer_user: str = "dart_writer"
    """User of the writer role (INSERT, and CREATE in the dart database; never DROP, TRUNCATE or
    ALTER): enabled only when the environment variable
    `writer_password_file_env` names a file holding its password or a hash of it. Every other
    client is a read-only analytics client."""
    writer_password_file_env: str = "DART_SQL_WRITER_PASSWORD_FILE"
    """Environment variable naming the writer's password file (the Docker-secrets `*_FILE`
    convention): the password is never in the environment (`/proc/self/environ` keeps the
    start-up environment for the life of the process) nor in config files. The file holds the
    password or `dart.data.http.hash_password`'s hash of it; the process keeps only a hash."""


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Everything the data manager needs."""

    run_id: str = "dev"
    """Run stamped on the events this service produces."""
    worker_id: str = "data-manager"
    """Producer id of this service."""
    blobs: str = "./dart-data/blobs"
    """Blob store URL or directory (batch manifests go there)."""
    store: StoreConfig = field(default_factory=StoreConfig)
    projection: ProjectionConfig = field(default_factory=ProjectionConfig)
    curation: CurationConfig = field(default_factory=CurationConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    batcher: BatcherConfig = field(default_factory=BatcherConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    backend: Literal["synthetic", "xdesktop", "libvirt"] | str = "synthetic"
    """Env backend stamped on requests when a task does not name one."""
    pipeline: Literal["decoupled", "coupled"] = "decoupled"
    """decoupled (default): DART's asynchronous loop (rollout-wise scheduling, batches whenever
    groups are ready, no waiting for weights). coupled: the synchronous baseline DART compares
    against, built from the same components: request one batch worth of groups
    (batcher.groups_per_batch tasks x group size) at once; wait until every one finished;
    assemble the batch; wait until the trainer published the weights made from it and every
    live rollout worker serves them; then the next round (``dart.data.coupled``)."""

    def __post_init__(self) -> None:
        require(self.pipeline in ("decoupled", "coupled"), "pipeline",
                f"must be 'decoupled' or 'coupled', got {self.pipeline!r}")
