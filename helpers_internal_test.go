package fencelock

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/pgserver"
)

// The helpers of the internal tests (package fencelock), which drive what the public API does
// not reach: a grant's reply made late, the cleanup of an abandoned grant, a held session, the
// count of wake-ups. They are small copies of the external tests' helpers (helpers_test.go,
// queue_test.go, package fencelock_test), which these files cannot use. The server is the
// shared one of pgserver.Main, which the package's TestMain (main_test.go) runs for both.

// bundle is what the internal tests need: a fresh migrated database and a context bounded so
// that a hung test fails instead of stalling the suite.
type bundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
	db   *pgserver.DB
}

// setup returns a bundle on a fresh database of the shared server, its context ending at
// test cleanup or after two minutes.
func setup(t *testing.T) *bundle {
	t.Helper()
	db := pgserver.NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return &bundle{ctx: ctx, pool: db.Pool, db: db}
}

// testLessor returns a lessor on pool with holder id holder and opts, failing the test on
// error. (newLessor, its name in the external tests, is the package's constructor here.)
func testLessor(t *testing.T, pool *pgxpool.Pool, holder string, opts ...LessorOption) *Lessor {
	t.Helper()
	l, err := NewLessor(pool, append([]LessorOption{WithHolder(holder)}, opts...)...)
	require.NoError(t, err)
	return l
}

// newPool returns a pool on url, closed at test cleanup.
func newPool(t *testing.T, ctx context.Context, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// leaseExpired reports whether the row of lease name has expired, failing the test if there
// is none.
func leaseExpired(t *testing.T, ctx context.Context, pool *pgxpool.Pool, name string) bool {
	t.Helper()
	var expired bool
	err := pool.QueryRow(ctx, `SELECT expires_at <= clock_timestamp() FROM fencelock.leases WHERE name = $1`, name).Scan(&expired)
	require.NoError(t, err)
	return expired
}

// acquired is the result of an Acquire run by acquireAsync.
type acquired struct {
	lease *Lease
	err   error
}

// acquireAsync runs l.Acquire in a goroutine; the result arrives on the channel.
func acquireAsync(ctx context.Context, l *Lessor, name string, ttl time.Duration) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		lease, err := l.Acquire(ctx, name, ttl)
		ch <- acquired{lease, err}
	}()
	return ch
}

// receive waits for an acquire's result, failing the test after limit.
func receive(t *testing.T, ch <-chan acquired, limit time.Duration) acquired {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(limit):
		t.Fatalf("no grant within %v", limit)
		return acquired{}
	}
}

// queued is one row of the view fencelock.lease_queue.
type queued struct {
	Holder   string
	Position int64
	Notify   bool
}

// awaitQueue waits until the queue of name is exactly holders, in that order (and, with notify,
// each of them is woken by NOTIFY rather than polling), failing the test after 10 s.
func awaitQueue(t *testing.T, ctx context.Context, pool *pgxpool.Pool, name string, notify bool, holders ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rows, err := pool.Query(ctx, `SELECT holder, position, woken_by_notify FROM fencelock.lease_queue WHERE name = $1 ORDER BY position`, name)
		require.NoError(t, err)
		q, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (queued, error) {
			var e queued
			err := r.Scan(&e.Holder, &e.Position, &e.Notify)
			return e, err
		})
		require.NoError(t, err)
		got := make([]string, len(q))
		ok := len(q) == len(holders)
		for i, e := range q {
			got[i] = e.Holder
			ok = ok && e.Holder == holders[i] && e.Position == int64(i+1) && (!notify || e.Notify)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue of %q is %v (%+v), want %v (notify %v)", name, got, q, holders, notify)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
