-- idempg schema, version 2: the idempotency records of idempg.Store and
-- idempg.Do, and the recovery points of idempg.Steps (version 2 adds
-- idempotency_steps; applying this file to a database at version 1 migrates
-- it). Apply it with idempg.Migrate, or with your own migration tool:
-- every statement is idempotent, so applying it twice changes nothing.

-- One row per (operation, key). A row whose expires_at has passed is absent
-- for every reader; the sweeper (Store.Sweep) deletes it.
CREATE TABLE IF NOT EXISTS idempotency_records (
    operation   text COLLATE "C" NOT NULL,
    key         text COLLATE "C" NOT NULL,
    -- 'pending', 'completed' or 'not_replayable'; any other value is
    -- reported as unreadable (a row of a newer format, or damaged by hand).
    state       text NOT NULL,
    -- The owner token of the caller that reserved or wrote the row.
    token       text NOT NULL,
    -- The request fingerprint; '' for none.
    fingerprint text NOT NULL DEFAULT '',
    -- The encoded result (completed), or the reason (not_replayable): bytes,
    -- since a reason may be cut in the middle of a UTF-8 sequence.
    result      bytea,
    -- The lease of a pending row, the time to live of any other, on the
    -- database's clock.
    expires_at  timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (operation, key)
);

-- The sweeper deletes expired rows oldest first through this index.
CREATE INDEX IF NOT EXISTS idempotency_records_expires_at_idx
    ON idempotency_records (expires_at);

-- The recovery points of idempg.Steps: one row per step of a key that
-- committed (a phase's progress, with its writes) or whose answer was kept (an
-- outside call's, with the next phase or the record). A row whose expires_at
-- has passed is absent; the sweeper deletes it. A key's steps live at least as
-- long as its completed record.
CREATE TABLE IF NOT EXISTS idempotency_steps (
    operation   text COLLATE "C" NOT NULL,
    key         text COLLATE "C" NOT NULL,
    -- The step's name, as the code names it (idempg.Phase, idempg.Outside).
    step        text COLLATE "C" NOT NULL,
    -- 'phase' (a local transaction) or 'outside' (an outside call's answer).
    kind        text NOT NULL,
    -- 'done', or 'failed' for a failure kept for good.
    state       text NOT NULL,
    -- The request fingerprint; '' for none.
    fingerprint text NOT NULL DEFAULT '',
    -- The step's result as JSON (done), or the failure's message (failed).
    result      bytea,
    expires_at  timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (operation, key, step)
);

CREATE INDEX IF NOT EXISTS idempotency_steps_expires_at_idx
    ON idempotency_steps (expires_at);

-- The schema versions applied; idempg.CheckSchema compares the highest with
-- the version the library expects (idempg.SchemaVersion).
CREATE TABLE IF NOT EXISTS idempotency_schema (
    version    integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO idempotency_schema (version) VALUES (2) ON CONFLICT (version) DO NOTHING;
