"""The database schema and its migrations.

The schema version lives in ``PRAGMA user_version``; :meth:`Store.open` migrates an
older file in place, step by step (``MIGRATIONS[n]`` moves version ``n`` to ``n + 1``).
"""

_SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS jobs (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    id          TEXT NOT NULL UNIQUE,
    spec        TEXT NOT NULL,
    state       TEXT NOT NULL,
    reason      TEXT,
    owner       TEXT NOT NULL,
    priority    INTEGER NOT NULL DEFAULT 0,
    exit_code   INTEGER,
    attempts    INTEGER NOT NULL DEFAULT 0,
    worker_id   TEXT,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL,
    started_at  REAL,
    ended_at    REAL,
    log_count   INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state, priority, seq);
CREATE TABLE IF NOT EXISTS tasks (
    id               TEXT PRIMARY KEY,
    job_id           TEXT NOT NULL REFERENCES jobs (id),
    attempt          INTEGER NOT NULL,
    state            TEXT NOT NULL,
    worker_id        TEXT,
    gpu_indices      TEXT NOT NULL DEFAULT '[]',
    exit_code        INTEGER,
    reason           TEXT,
    created_at       REAL NOT NULL,
    started_at       REAL,
    ended_at         REAL,
    lease_expires    REAL,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    log_seq          INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS tasks_by_job ON tasks (job_id, attempt);
CREATE INDEX IF NOT EXISTS tasks_by_worker ON tasks (worker_id, state);
CREATE TABLE IF NOT EXISTS events (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id   TEXT NOT NULL,
    task_id  TEXT,
    ts       REAL NOT NULL,
    state    TEXT NOT NULL,
    reason   TEXT
);
CREATE INDEX IF NOT EXISTS events_by_job ON events (job_id, seq);
CREATE TABLE IF NOT EXISTS logs (
    job_id   TEXT NOT NULL,
    offset   INTEGER NOT NULL,
    task_id  TEXT,
    stream   TEXT NOT NULL,
    ts       REAL NOT NULL,
    text     TEXT NOT NULL,
    PRIMARY KEY (job_id, offset)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS artifacts (
    job_id     TEXT NOT NULL,
    name       TEXT NOT NULL,
    sha256     TEXT NOT NULL,
    size       INTEGER NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (job_id, name)
);
CREATE TABLE IF NOT EXISTS workers (
    id              TEXT PRIMARY KEY,
    name            TEXT NOT NULL UNIQUE,
    hostname        TEXT NOT NULL,
    state           TEXT NOT NULL,
    info            TEXT NOT NULL,
    registered_at   REAL NOT NULL,
    last_heartbeat  REAL,
    cpu_percent     REAL,
    memory_used     INTEGER
);
CREATE TABLE IF NOT EXISTS tokens (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    role        TEXT NOT NULL,
    hash        TEXT NOT NULL UNIQUE,
    created_at  REAL NOT NULL,
    expires_at  REAL,
    revoked_at  REAL,
    worker_id   TEXT
);
"""

# v2: a drained worker stays draining across heartbeats and re-registrations.
_SCHEMA_V2 = """
ALTER TABLE workers ADD COLUMN draining INTEGER NOT NULL DEFAULT 0;
"""

# v3: single-use join tokens (consumed by the one registration they allow).
_SCHEMA_V3 = """
ALTER TABLE tokens ADD COLUMN single_use INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tokens ADD COLUMN used_at REAL;
CREATE INDEX IF NOT EXISTS tokens_by_name ON tokens (name);
"""

# v4: what function jobs returned (pickled outcomes), inline or as a blob.
_SCHEMA_V4 = """
CREATE TABLE IF NOT EXISTS results (
    job_id      TEXT PRIMARY KEY REFERENCES jobs(id),
    task_id     TEXT NOT NULL,
    inline      BLOB,
    sha256      TEXT,
    size        INTEGER NOT NULL
);
"""

# v5: distributed jobs (a task's node and rendezvous, a log line's rank) and the
# training metrics their tasks ship.
_SCHEMA_V5 = """
ALTER TABLE tasks ADD COLUMN node_rank INTEGER;
ALTER TABLE tasks ADD COLUMN gang TEXT;
ALTER TABLE tasks ADD COLUMN metric_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE logs ADD COLUMN rank INTEGER;
CREATE TABLE IF NOT EXISTS metrics (
    job_id   TEXT NOT NULL,
    seq      INTEGER NOT NULL,
    task_id  TEXT,
    rank     INTEGER,
    step     INTEGER,
    epoch    INTEGER,
    ts       REAL NOT NULL,
    metrics  TEXT NOT NULL,
    PRIMARY KEY (job_id, seq)
) WITHOUT ROWID;
"""

# v6: who uploaded each blob: a submitter may name a bundle, payload or pushed
# variables in a job only when it uploaded those bytes itself (a known sha256 is
# not read access).
_SCHEMA_V6 = """
CREATE TABLE IF NOT EXISTS blob_owners (
    sha256      TEXT NOT NULL,
    owner       TEXT NOT NULL,
    uploaded_at REAL NOT NULL,
    PRIMARY KEY (sha256, owner)
) WITHOUT ROWID;
"""

# v7: a task's own API token (jobs with api_access), revoked when the task ends.
_SCHEMA_V7 = """
ALTER TABLE tokens ADD COLUMN task_id TEXT;
CREATE INDEX IF NOT EXISTS tokens_by_task ON tokens (task_id);
"""

# v8: the log text a job stored, against the per-job log quota (older jobs count from 0).
_SCHEMA_V8 = """
ALTER TABLE jobs ADD COLUMN log_bytes INTEGER NOT NULL DEFAULT 0;
"""

# v9: idempotency keys of submits (docs/adr/0085): which jobs a key created, per owner,
# and a digest of the request, so a repeat answers the same jobs and a different body
# with the same key is refused.
_SCHEMA_V9 = """
CREATE TABLE IF NOT EXISTS idempotency_keys (
    owner       TEXT NOT NULL,
    key         TEXT NOT NULL,
    digest      TEXT NOT NULL,
    job_ids     TEXT NOT NULL,
    created_at  REAL NOT NULL,
    PRIMARY KEY (owner, key)
);
CREATE INDEX IF NOT EXISTS idempotency_keys_by_age ON idempotency_keys (created_at);
"""

# v10: secrets (docs/secrets.md): each owner's values sealed with the data dir's key
# (AES-GCM, owner and name as associated data), and the owners an admin shared one with.
_SCHEMA_V10 = """
CREATE TABLE IF NOT EXISTS secrets (
    owner       TEXT NOT NULL,
    name        TEXT NOT NULL,
    sealed      BLOB NOT NULL,
    shared_with TEXT NOT NULL DEFAULT '[]',
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL,
    PRIMARY KEY (owner, name)
);
CREATE INDEX IF NOT EXISTS secrets_by_name ON secrets (name);
"""

# v11: provider instances (docs/providers.md, ADR 0117): what gpulayer asked providers
# to create, which workers joined from each, and every provider call as an intent written
# before the call and its outcome after (a crash in between is reconciled on restart); a
# join token may be bound to one instance's worker name.
_SCHEMA_V11 = """
CREATE TABLE IF NOT EXISTS instances (
    id              TEXT PRIMARY KEY,
    provider        TEXT NOT NULL,
    offer           TEXT NOT NULL,
    state           TEXT NOT NULL,
    external_id     TEXT,
    workers         TEXT NOT NULL DEFAULT '[]',
    nodes           INTEGER NOT NULL DEFAULT 1,
    gpus            INTEGER NOT NULL DEFAULT 0,
    slots           INTEGER NOT NULL DEFAULT 1,
    job_ids         TEXT NOT NULL DEFAULT '[]',
    price_per_hour  REAL NOT NULL DEFAULT 0,
    reason          TEXT,
    detail          TEXT,
    created_at      REAL NOT NULL,
    booted_at       REAL,
    ready_at        REAL,
    idle_since      REAL,
    ends_at         REAL,
    ended_at        REAL
);
CREATE INDEX IF NOT EXISTS instances_by_state ON instances (state, provider);
CREATE TABLE IF NOT EXISTS instance_workers (
    worker_id    TEXT PRIMARY KEY,
    instance_id  TEXT NOT NULL,
    worker_name  TEXT NOT NULL,
    joined_at    REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS instance_workers_by_instance ON instance_workers (instance_id);
CREATE TABLE IF NOT EXISTS provider_intents (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    instance_id  TEXT NOT NULL,
    provider     TEXT NOT NULL,
    action       TEXT NOT NULL,
    created_at   REAL NOT NULL,
    outcome      TEXT,
    outcome_at   REAL
);
CREATE INDEX IF NOT EXISTS provider_intents_open ON provider_intents (outcome_at);
ALTER TABLE tokens ADD COLUMN instance_id TEXT;
"""

# v12: result parts (docs/adr/0096): each call's outcome of a function task of several
# calls, kept as it finishes, so the calls an attempt finished outlive its worker.
_SCHEMA_V12 = """
CREATE TABLE IF NOT EXISTS result_parts (
    job_id      TEXT NOT NULL,
    idx         INTEGER NOT NULL,
    task_id     TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    outcome     BLOB NOT NULL,
    PRIMARY KEY (job_id, idx)
);
"""

# v13: what a task's Python environment is doing (docs/environments.md): the worker's
# last TaskEnvironment report as JSON (preparing, or ready with the exact versions).
_SCHEMA_V13 = """
ALTER TABLE tasks ADD COLUMN environment TEXT;
"""

# v14 (docs/adr/0140): the active tasks by state. Placement reads what the active
# tasks hold at every submit, and the sweep looks for running tasks whose lease ran
# out; without this index both scanned every task ever run (7 ms a submit with
# 100,000 in the store, benchmarks/results/history.md). And jobs listed newest first
# by state, by owner, or both (the sidebar, `gpulayer jobs`, a submitter's quota
# count), which sorted or scanned every job of that state: 60 ms on the event loop
# for the newest 50 succeeded jobs of 100,000.
_SCHEMA_V14 = """
CREATE INDEX IF NOT EXISTS tasks_by_state ON tasks (state, lease_expires);
CREATE INDEX IF NOT EXISTS jobs_by_state_seq ON jobs (state, seq);
CREATE INDEX IF NOT EXISTS jobs_by_owner ON jobs (owner, seq);
CREATE INDEX IF NOT EXISTS jobs_by_owner_state ON jobs (owner, state, seq);
"""

#: Index n holds the script that moves a database from version n to n + 1.
MIGRATIONS: tuple[str, ...] = (
    _SCHEMA_V1, _SCHEMA_V2, _SCHEMA_V3, _SCHEMA_V4, _SCHEMA_V5, _SCHEMA_V6, _SCHEMA_V7,
    _SCHEMA_V8, _SCHEMA_V9, _SCHEMA_V10, _SCHEMA_V11, _SCHEMA_V12, _SCHEMA_V13, _SCHEMA_V14,
)  # fmt: skip
SCHEMA_VERSION = len(MIGRATIONS)
