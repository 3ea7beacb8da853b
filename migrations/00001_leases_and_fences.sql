-- +goose Up
-- Schema fencelock holds the lease and fence tables and goose's own version table
-- (fencelock.goose_db_version), so an application's goose_db_version is never touched.
CREATE SCHEMA IF NOT EXISTS fencelock;

-- One row per lease name. token is a BIGSERIAL: every grant sets it to DEFAULT (nextval) while
-- it holds the row lock, so tokens for one name rise strictly in grant order, and tokens are
-- unique across all names. expires_at is on the database clock. fillfactor 70 leaves room on
-- each page so renewals and re-grants (which never change the key) stay HOT updates.
CREATE TABLE fencelock.leases (
    name        text        PRIMARY KEY,
    holder      text        NOT NULL,
    token       bigserial   NOT NULL,
    acquired_at timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    CONSTRAINT leases_name_length CHECK (octet_length(name) BETWEEN 1 AND 1024),
    CONSTRAINT leases_holder_length CHECK (octet_length(holder) BETWEEN 1 AND 1024)
) WITH (fillfactor = 70);

-- The high-water mark of fencing tokens per protected resource. A fenced write advances it
-- to its own token inside the writer's transaction, or is rejected as stale.
CREATE TABLE fencelock.fences (
    resource text   COLLATE "C" PRIMARY KEY,
    token    bigint NOT NULL,
    CONSTRAINT fences_resource_length CHECK (octet_length(resource) BETWEEN 1 AND 1024),
    CONSTRAINT fences_token_positive CHECK (token > 0)
) WITH (fillfactor = 70);

-- +goose Down
DROP TABLE fencelock.fences;
DROP TABLE fencelock.leases;
