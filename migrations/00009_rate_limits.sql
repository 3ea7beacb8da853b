-- +goose Up
-- Rate limits (package ratelimit): one row per key, the state of GCRA, the generic cell rate
-- algorithm of ATM networks (ITU-T I.371), as go-redis/redis_rate and Brandur Leach's
-- throttled keep it: tat, the theoretical arrival time of the next request on the database
-- clock. A request of cost n at time now is allowed when
--   greatest(tat, now) + n * emission - burst * emission <= now
-- (emission = the interval between requests at the steady rate), and then moves tat to
-- greatest(tat, now) + n * emission. So in any window [a, b) of the database clock at most
-- burst + (b - a) / emission requests are allowed. A key is created on its first request and
-- swept (ratelimit.Sweep) once its tat is past by a grace period: a row whose tat has
-- passed is a full bucket, the same as no row.
CREATE TABLE fencelock.rate_limits (
    key        text        PRIMARY KEY,
    tat        timestamptz NOT NULL,
    -- The last request: whether it was allowed (it moved tat; RETURNING cannot tell that from
    -- tat alone), and when it was decided (clock_timestamp() once the row was locked).
    allowed    boolean     NOT NULL,
    decided_at timestamptz NOT NULL
) WITH (fillfactor = 70);

SELECT fencelock.grant_to_lease_roles('SELECT, INSERT, UPDATE, DELETE', 'fencelock.rate_limits');

-- +goose Down
DROP TABLE fencelock.rate_limits;
