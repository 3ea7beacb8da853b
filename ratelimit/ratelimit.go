package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/internal/db"
	"github.com/fencelock/fencelock/internal/pgerr"
	"github.com/fencelock/fencelock/internal/validate"
)

// MaxBurst is the largest burst a [Limit] takes.
const MaxBurst = 1_000_000

// Limit is what a [Limiter] allows per key: Rate requests per Per at the steady rate, and up
// to Burst at once after the key has been idle. In any window of length w on the database
// clock, a key allows at most Burst + Rate*w/Per requests (counting a request of cost n as n).
// A full refill, Burst times Per/Rate, must take at most 7 days (fencelock's MaxTTL).
type Limit struct {
	Rate  int           // requests per Per, >= 1
	Per   time.Duration // the period, >= 1µs; Per/Rate is rounded up to a whole microsecond
	Burst int           // requests allowed at once, 1 to MaxBurst
}

// PerSecond is a Limit of rate requests a second with a burst of rate.
func PerSecond(rate int) Limit { return Limit{Rate: rate, Per: time.Second, Burst: rate} }

// PerMinute is a Limit of rate requests a minute with a burst of rate.
func PerMinute(rate int) Limit { return Limit{Rate: rate, Per: time.Minute, Burst: rate} }

// emission returns the interval between requests at the steady rate, rounded up to a whole
// microsecond (the database clock's resolution), so the rate enforced is never above Rate/Per.
func (r Limit) emission() time.Duration {
	e := r.Per / time.Duration(r.Rate) // Rate >= 1 (check)
	if r.Per%time.Duration(r.Rate) != 0 {
		e++
	}
	if rem := e % time.Microsecond; rem != 0 {
		e += time.Microsecond - rem // no overflow once check has checked Per/Rate <= MaxTTL
	}
	return e
}

// check returns an [*ArgumentError] when r is not a limit New takes.
func (r Limit) check() error {
	switch {
	case r.Rate < 1:
		return validate.Errorf("limit.Rate", "is %d; it must be at least 1", r.Rate)
	case r.Per < time.Microsecond:
		return validate.Errorf("limit.Per", "is %v; it must be at least 1µs", r.Per)
	case r.Burst < 1 || r.Burst > MaxBurst:
		return validate.Errorf("limit.Burst", "is %d; it must be between 1 and %d", r.Burst, MaxBurst)
	case r.Per/time.Duration(r.Rate) > validate.MaxTTL || time.Duration(r.Burst) > validate.MaxTTL/r.emission():
		return validate.Errorf("limit", "%d per %v with a burst of %d takes longer than MaxTTL (%v) to refill", r.Rate, r.Per, r.Burst, validate.MaxTTL)
	}
	return nil
}

// Limiter allows requests per key at a [Limit], with the state in the database: one row of
// fencelock.rate_limits per key, created by the key's first request, and one statement per
// request, decided on the database clock, so every process that shares the database shares
// the limit. The algorithm is GCRA, the generic cell rate algorithm (ITU-T I.371), as in
// go-redis/redis_rate and Brandur Leach's throttled: the row keeps the theoretical arrival time
// of the next request, and a request is allowed when it is not too early for it by more than
// the burst allows. Concurrent requests for a key are decided one after the other under its
// row lock; the decision and the row's update are the same statement.
//
// By default a decision commits without waiting for the server to flush it to disk
// (synchronous_commit off for that one statement): a crash of the server (not a clean
// shutdown) may forget the decisions of its last moments, at most about 3 x wal_writer_delay
// (600 ms with PostgreSQL's default 200 ms; longer only when the server's WAL writer is starved
// of CPU), and the same after a failover to a standby that had not received them. A forgotten
// decision gives its key back the room it took: after a crash a key may allow at most the
// requests of that window again, on top of its Burst + Rate*w/Per. [WithDurableDecisions]
// makes every decision durable when it returns, at the cost of a WAL flush per request (about
// the cost of the statement itself with fsync on).
//
// Idle keys are rows nobody needs (an idle key's bucket is full, the same as no row): delete
// them with [Sweep]. A Limiter is safe for concurrent use; it holds no connection between
// calls.
type Limiter struct {
	pool    *pgxpool.Pool
	q       *db.Queries
	limit   Limit
	e       time.Duration
	durable bool // WithDurableDecisions
	// tol is Burst x e, the tolerance of GCRA.
	tol time.Duration
	// cost1 and slack1 are the intervals of a request of cost 1 (most requests): its cost,
	// and its cost less the tolerance.
	cost1, slack1 pgtype.Interval
}

// Option configures a [Limiter]; [New] takes them. An Option is an immutable value: one may
// be passed to any number of calls of New, from any goroutine.
type Option interface {
	applyLimiter(*Limiter) error
}

// limiterOption is an [Option] made of a func.
type limiterOption func(*Limiter) error

func (o limiterOption) applyLimiter(r *Limiter) error { return o(r) }

// WithDurableDecisions makes every decision durable when AllowN returns: the statement commits
// with the session's synchronous_commit, raised to on when it is off, so it waits for the WAL
// flush (and for synchronous standbys, if the server has any). A crash then forgets no
// decision that was returned. It costs a WAL flush per request: with fsync on, about as much
// as the statement itself (one decision per flush at one client; concurrent commits share
// flushes). Without it, a crash may forget the decisions of the last moments (see [Limiter]).
func WithDurableDecisions() Option {
	return limiterOption(func(r *Limiter) error { r.durable = true; return nil })
}

// Result is the decision on one request.
type Result struct {
	// Allowed is the request's cost when it was allowed, else 0.
	Allowed int
	// Remaining is how many more requests of cost 1 would be allowed right now.
	Remaining int
	// RetryAfter is how long until the request would be allowed, when refused (0 when allowed;
	// other requests may take the room first).
	RetryAfter time.Duration
	// ResetAfter is how long until the key is idle again (its bucket full).
	ResetAfter time.Duration
	// At is the decision's time on the database clock: clock_timestamp() read once the key's
	// row was locked.
	At time.Time
}

// New returns a rate limiter on pool, which must reach a primary where fencelock.Migrate has
// run. Errors: an [*ArgumentError] for a nil pool, a bad limit or a nil option. No SQL runs.
//
// Defaults: decisions commit without waiting for the WAL flush ([WithDurableDecisions]
// changes that).
func New(pool *pgxpool.Pool, limit Limit, opts ...Option) (*Limiter, error) {
	if pool == nil {
		return nil, validate.Errorf("pool", "must not be nil")
	}
	if err := limit.check(); err != nil {
		return nil, err
	}
	e := limit.emission()
	r := &Limiter{pool: pool, q: db.New(), limit: limit, e: e, tol: time.Duration(limit.Burst) * e}
	for i, opt := range opts {
		if opt == nil {
			return nil, validate.Errorf(fmt.Sprintf("opts[%d]", i), "must not be nil")
		}
		if err := opt.applyLimiter(r); err != nil {
			return nil, err
		}
	}
	r.cost1, r.slack1 = micros(e), micros(e-r.tol)
	return r, nil
}

// Limit returns the limiter's Limit.
func (r *Limiter) Limit() Limit { return r.limit }

// Allow is AllowN(ctx, key, 1).
func (r *Limiter) Allow(ctx context.Context, key string) (Result, error) {
	return r.AllowN(ctx, key, 1)
}

// AllowN decides a request of cost n (1 to the limit's Burst) for key (1 to 1024 bytes, the
// MaxNameLength of package fencelock, of UTF-8 without NUL), in one statement (three for a
// key's first request): allowed now, or refused with the time to wait. A refused request
// changes nothing but the row's last-decision flag. The decision is durable when it returns
// only with [WithDurableDecisions] (see [Limiter] for what a crash forgets otherwise). Safe
// for concurrent use.
//
// Errors: an [*ArgumentError] before any SQL; an error wrapping [ErrReadOnly] on a hot
// standby; otherwise the pgx error, wrapped (the request then counts as not allowed; it may
// have been counted on the server if the error came after the statement ran).
func (r *Limiter) AllowN(ctx context.Context, key string, n int) (Result, error) {
	if err := validate.Name("key", key); err != nil {
		return Result{}, err
	}
	if n < 1 || n > r.limit.Burst {
		return Result{}, validate.Errorf("n", "is %d; it must be between 1 and the burst, %d", n, r.limit.Burst)
	}
	cost := time.Duration(n) * r.e
	tol := r.tol
	// key, cost, cost - tolerance, durable
	args := db.RateAllowParams{Column1: key, Column2: r.cost1, Column3: r.slack1, Column4: r.durable}
	if n != 1 {
		args.Column2, args.Column3 = micros(cost), micros(cost-tol)
	}
	var row db.RateAllowRow
	var err error
	for try := 0; ; try++ {
		row, err = r.q.RateAllow(ctx, r.pool, args)
		if !errors.Is(err, pgx.ErrNoRows) || try == 2 {
			break
		}
		// The key's first request (or its first since a sweep, which may also delete the
		// row just created: hence a few tries): create the row, a full bucket, and decide.
		if err = r.q.RateCreate(ctx, r.pool, key); err != nil {
			break
		}
	}
	if err != nil {
		return Result{}, pgerr.Wrap(fmt.Sprintf("rate limit %q", key), err)
	}
	res := Result{At: row.At, ResetAfter: max(0, row.Tat.Sub(row.At))}
	res.Remaining = int(max(0, row.At.Add(tol).Sub(row.Tat)) / r.e)
	if row.Allowed {
		res.Allowed = n
	} else {
		res.RetryAfter = max(time.Microsecond, row.Tat.Add(cost-tol).Sub(row.At))
	}
	return res, nil
}

// Wait waits until a request of cost n for key is allowed, or ctx ends: AllowN, then a sleep of
// RetryAfter after each refusal. It returns the allowing decision. Requests are not queued:
// among many waiters, whoever asks first after the room frees gets it. Errors: as for
// [Limiter.AllowN], and ctx's error (wrapped) when ctx ends first.
func (r *Limiter) Wait(ctx context.Context, key string, n int) (Result, error) {
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		res, err := r.AllowN(ctx, key, n)
		if err != nil || res.Allowed > 0 {
			return res, err
		}
		if t == nil {
			t = time.NewTimer(res.RetryAfter)
		} else {
			t.Reset(res.RetryAfter)
		}
		select {
		case <-ctx.Done():
			return Result{}, fmt.Errorf("rate limit %q: %w", key, context.Cause(ctx))
		case <-t.C:
		}
	}
}

// Reset forgets key's state: its next request finds a full bucket. Errors: an [*ArgumentError]
// before any SQL; an error wrapping [ErrReadOnly] on a hot standby; otherwise the pgx error,
// wrapped.
func (r *Limiter) Reset(ctx context.Context, key string) error {
	if err := validate.Name("key", key); err != nil {
		return err
	}
	if _, err := r.q.RateReset(ctx, r.pool, key); err != nil {
		return pgerr.Wrap(fmt.Sprintf("reset rate limit %q", key), err)
	}
	return nil
}

// Sweep deletes the rate-limit keys idle for longer than idle (a time.Duration >= 0) on the
// database clock, in one statement, and returns how many it deleted. A key is idle once its
// theoretical arrival time has passed: its bucket is then full, which is exactly what a key
// without a row has, so deleting it changes no decision, whatever the limit (idle = 0 is safe;
// a longer idle keeps rows that are about to be used again). Safe for concurrent use; a
// request for a key being deleted waits for the delete's row lock (a few milliseconds).
//
// Errors: an [*ArgumentError] for a nil pool or a negative idle (before any SQL); an error
// wrapping [ErrReadOnly] on a hot standby; otherwise the pgx error, wrapped.
func Sweep(ctx context.Context, pool *pgxpool.Pool, idle time.Duration) (int64, error) {
	if pool == nil {
		return 0, validate.Errorf("pool", "must not be nil")
	}
	if idle < 0 {
		return 0, validate.Errorf("idle", "is %v; it must not be negative", idle)
	}
	n, err := db.New().RateSweep(ctx, pool, idle.Microseconds())
	if err != nil {
		return 0, pgerr.Wrap("sweep rate limits", err)
	}
	return n, nil
}

// micros is d as an interval of whole microseconds.
func micros(d time.Duration) pgtype.Interval {
	return pgtype.Interval{Microseconds: d.Microseconds(), Valid: true}
}
