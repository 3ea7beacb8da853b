package fencetest

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
)

// CancelRunLockedSQLOnRowLock drives a RunLockedSQL on sqlDB whose grant waits on the lease
// row's lock (a TryRunLocked on pool holds the row in its transaction) and whose ctx is
// cancelled meanwhile. It returns the time from the cancellation to the call's return and the
// call's error, after asserting that no backend still runs the abandoned grant once the call
// has returned and that the holder's transaction then commits.
func CancelRunLockedSQLOnRowLock(t testing.TB, ctx context.Context, pool *pgxpool.Pool, sqlDB *sql.DB) (time.Duration, error) {
	t.Helper()
	l := NewLessor(t, pool, "a")
	inside, leave := make(chan struct{}), make(chan struct{})
	var once sync.Once
	letGo := func() { once.Do(func() { close(leave) }) }
	defer letGo() // also when an assertion below fails: the holder's transaction ends
	held := make(chan error, 1)
	go func() {
		held <- l.TryRunLocked(ctx, "job", func(context.Context, pgx.Tx, fencelock.Token) error {
			close(inside)
			<-leave
			return nil
		})
	}()
	<-inside

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	waited := make(chan error, 1)
	w := NewLessor(t, pool, "w")
	go func() {
		waited <- w.RunLockedSQL(wctx, sqlDB, "job", func(context.Context, *sql.Tx, fencelock.Token) error {
			return errors.New("granted after cancellation")
		})
	}()
	testkit.WaitFor(t, ctx, "the grant waiting on the row lock", func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%LeaseGrant%'`).Scan(&n))
		return n == 1
	})
	cancelled := time.Now()
	cancel()
	err := <-waited
	took := time.Since(cancelled)
	var running int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND query LIKE '%LeaseGrant%' AND state = 'active' AND pid <> pg_backend_pid()`).Scan(&running))
	require.Zero(t, running, "a backend still runs the abandoned grant after RunLockedSQL returned")
	letGo()
	require.NoError(t, <-held)
	return took, err
}
