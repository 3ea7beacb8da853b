package gooselock_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/pgserver"
)

// The helpers of the locker's server tests (goose_locker_test.go): copies of the root
// package's (helpers_test.go, queue_test.go), which a test package of another directory cannot
// import.

// bundle is what a server test needs: a fresh migrated database and a context bounded so that
// a hung test fails instead of stalling the suite.
type bundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
	db   *pgserver.DB
}

// setup returns a bundle on a fresh database of the shared server of TestMain (main_test.go),
// its context ending at test cleanup or after two minutes.
func setup(t *testing.T) *bundle {
	t.Helper()
	db := pgserver.NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return &bundle{ctx: ctx, pool: db.Pool, db: db}
}

// newPool returns a pool on url, closed at test cleanup.
func newPool(t *testing.T, ctx context.Context, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// newLessor returns a lessor on pool with holder id holder and opts, failing the test on error.
func newLessor(t *testing.T, pool *pgxpool.Pool, holder string, opts ...fencelock.LessorOption) *fencelock.Lessor {
	t.Helper()
	l, err := fencelock.NewLessor(pool, append([]fencelock.LessorOption{fencelock.WithHolder(holder)}, opts...)...)
	require.NoError(t, err)
	return l
}

// queued is one row of the view fencelock.lease_queue.
type queued struct {
	Holder   string
	Position int64
	Notify   bool
}

// readQueue returns the live waiters of name in order, as the view fencelock.lease_queue
// shows them.
func readQueue(t *testing.T, ctx context.Context, pool *pgxpool.Pool, name string) []queued {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT holder, position, woken_by_notify FROM fencelock.lease_queue WHERE name = $1 ORDER BY position`, name)
	require.NoError(t, err)
	q, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (queued, error) {
		var e queued
		err := r.Scan(&e.Holder, &e.Position, &e.Notify)
		return e, err
	})
	require.NoError(t, err)
	return q
}

// awaitQueue waits until the queue of name is exactly holders, in that order (and, with notify,
// each of them is woken by NOTIFY rather than polling), failing the test after 10 s.
func awaitQueue(t *testing.T, ctx context.Context, pool *pgxpool.Pool, name string, notify bool, holders ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		q := readQueue(t, ctx, pool, name)
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
