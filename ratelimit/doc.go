// Package ratelimit limits requests per key with the state in PostgreSQL, so every process
// that shares the database shares the limit: [New] returns a [*Limiter] for a [Limit]
// (Rate requests per Per, in bursts of up to Burst), and [Limiter.Allow] decides one request
// in one statement on the database clock.
//
//	rl, err := ratelimit.New(pool, ratelimit.PerSecond(20)) // ratelimit.WithDurableDecisions() for crash-proof decisions
//	res, err := rl.Allow(ctx, "domain:example.com") // res.Allowed == 0: refused, see res.RetryAfter
//	res, err = rl.Wait(ctx, "domain:example.com", 1) // sleeps until allowed, or ctx ends
//	n, err := ratelimit.Sweep(ctx, pool, time.Hour)   // deletes the keys idle for an hour
//
// # The algorithm
//
// GCRA, the generic cell rate algorithm of ATM networks (ITU-T I.371), as go-redis/redis_rate
// and Brandur Leach's throttled keep it: one row per key holds the theoretical arrival time
// (tat) of the key's next request on the database clock, and a request of cost n is allowed
// when greatest(tat, now) + n*emission - Burst*emission <= now (emission = Per/Rate, rounded
// up to a whole microsecond), which then moves tat on by n*emission. In any window of length w
// on the database clock a key allows at most Burst + Rate*w/Per requests. A key without a row
// and a key whose tat has passed are the same full bucket, so [Sweep] deletes idle keys
// without changing any decision.
//
// # Commits, and what a crash forgets
//
// A decision is one autocommit statement, and by default its commit does not wait for the
// server to flush the WAL to disk: the statement sets synchronous_commit off for its own
// transaction (set_config(..., true), which ends with the commit; the session's setting is
// untouched). A decision then costs what an asynchronous one-row UPDATE costs, which with
// fsync on is several times less than a synchronous one. The price: a crash of the server (not
// a clean shutdown) forgets the decisions whose WAL had not been written yet, at most about
// 3 x wal_writer_delay (PostgreSQL's bound for asynchronous commit: 600 ms with the default
// 200 ms; longer only when the WAL writer is starved of CPU), and a failover forgets what the
// standby had not received. A forgotten decision gives its key back the room it took, so just
// after a crash a key may allow up to the requests of that window again on top of its limit
// (no token, lease or fence depends on a decision).
// [WithDurableDecisions] makes every decision durable before it returns (the statement keeps
// the session's synchronous_commit, raised to on when it is off), for a WAL flush per request.
// internal/integration's TestRateLimitDecisionsAfterCrash crashes a server to check both.
//
// # The SQL it owns
//
// The table fencelock.rate_limits (migration 00009_rate_limits.sql, applied by
// fencelock.Migrate with the others: this package only reads and writes it), and the queries
// of sqlc/queries/ratelimits.sql, generated into internal/db:
//
//   - RateAllow: one request, decided and recorded in one UPDATE of the key's row, at
//     clock_timestamp() read once the row is locked, committed as above;
//   - RateCreate: the key's first request creates its row (a full bucket; always committed
//     without waiting for the flush: a lost row is the same full bucket), then RateAllow
//     decides;
//   - RateReset: [Limiter.Reset], a DELETE of the key's row;
//   - RateSweep: [Sweep], a DELETE of the rows idle for longer than a grace.
//
// No server function belongs to it. It shares nothing with the lease core of package
// fencelock but the checks on input and the errors below.
//
// # Errors
//
// Bad input is refused before any SQL runs with an [*ArgumentError], which matches
// [ErrInvalidArgument]; a server that refuses writes (a hot standby) gives an error wrapping
// [ErrReadOnly]. These are package fencelock's own type and values under other names (as
// os.PathError is io/fs.PathError), so errors.Is(err, fencelock.ErrInvalidArgument) and
// errors.As into a *fencelock.ArgumentError match the errors of this package too. Other
// errors are pgx's, wrapped with %w.
package ratelimit
