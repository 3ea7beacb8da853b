package fencelock_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// SweepLeases deletes exactly the rows expired for longer than the grace period, in pages,
// keeps held rows, rows inside the grace period and rows a transaction holds, and a name
// granted again after its row was swept still gets a larger token.
func TestSweepLeases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// 1,200 rows expired an hour ago (more than two pages), 10 expired 30 s ago, 10 held.
	insertLeases(t, b, "old:", 1200, "-2 hours", "-1 hour")
	insertLeases(t, b, "recent:", 10, "-1 minute", "-30 seconds")
	l := newLessor(t, b.Pool, "holder")
	var held []*fencelock.Lease
	for _, name := range []string{"live:1", "live:2", "live:3", "live:4", "live:5", "live:6", "live:7", "live:8", "live:9", "live:10"} {
		lease, err := l.TryAcquire(b.Ctx, name, time.Minute)
		require.NoError(t, err)
		held = append(held, lease)
	}
	maxToken := maxLeaseToken(t, b)
	// A fence row is never swept, however old the lease that advanced it.
	require.NoError(t, pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error { return fencelock.FenceTx(b.Ctx, tx, "old:3", 1) }))

	// A transaction-scoped holder of an expired-looking row (RunLocked rows expire at their
	// transaction's start) is skipped, not waited for.
	inTx := make(chan struct{})
	finish := make(chan struct{})
	runErr := make(chan error, 1)
	go func() {
		runErr <- l.RunLocked(context.WithoutCancel(b.Ctx), "old:1", func(context.Context, pgx.Tx, fencelock.Token) error {
			close(inTx)
			<-finish
			return nil
		})
	}()
	<-inTx

	_, err := fencelock.SweepLeases(b.Ctx, b.Pool, fencelock.MinSweepGrace-time.Second)
	require.ErrorIs(t, err, fencelock.ErrInvalidArgument)
	_, err = fencelock.SweepLeases(b.Ctx, nil, time.Minute)
	require.ErrorIs(t, err, fencelock.ErrInvalidArgument)

	deleted, err := fencelock.SweepLeases(b.Ctx, b.Pool, 10*time.Minute)
	require.NoError(t, err)
	require.EqualValues(t, 1199, deleted) // every old row but the one a transaction holds
	close(finish)
	require.NoError(t, <-runErr)

	count := func(pattern string) (n int) {
		require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM fencelock.leases WHERE name LIKE $1`, pattern).Scan(&n))
		return n
	}
	require.Equal(t, 1, count("old:%"))
	require.Equal(t, 10, count("recent:%"))
	require.Equal(t, 10, count("live:%"))
	var fences int
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM fencelock.fences`).Scan(&fences))
	require.Equal(t, 1, fences, "the sweep deleted a fence row")
	for _, lease := range held {
		require.NoError(t, lease.Renew(b.Ctx), "a held lease survives the sweep")
	}

	// Swept names are granted again with larger tokens.
	again, err := l.TryAcquire(b.Ctx, "old:2", time.Minute)
	require.NoError(t, err)
	require.Greater(t, int64(again.Token()), maxToken)
	require.NoError(t, again.Release(b.Ctx))

	// The RunLocked row is free now, but it expired only at its transaction's start, under a
	// minute ago: it stays, as do the recent rows (30 s). Moved an hour back, they go.
	_, err = b.Pool.Exec(b.Ctx, `UPDATE fencelock.leases SET expires_at = expires_at - interval '1 hour' WHERE name LIKE 'recent:%' OR name = 'old:1'`)
	require.NoError(t, err)
	deleted, err = fencelock.SweepLeases(b.Ctx, b.Pool, fencelock.MinSweepGrace)
	require.NoError(t, err)
	require.EqualValues(t, 11, deleted) // 10 recent, old:1
	for _, lease := range held {
		require.NoError(t, lease.Release(b.Ctx))
	}
}

// Concurrent sweeps are safe: four at once over 5,000 expired rows delete each row once
// between them, while grants of the swept names go on and get larger tokens. SweepLeases also
// deletes the token_flushes rows of backends that have exited, and keeps live ones'.
func TestSweepLeasesConcurrent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	insertLeases(t, b, "old:", 5000, "-2 hours", "-1 hour")
	maxToken := maxLeaseToken(t, b)
	// A token_flushes row of a backend that has exited, and one of a live backend.
	_, err := b.Pool.Exec(b.Ctx, `INSERT INTO fencelock.token_flushes VALUES (2147483000, 1), (pg_backend_pid(), 2)`)
	require.NoError(t, err)

	l := newLessor(t, b.Pool, "g")
	var wg sync.WaitGroup
	counts := make([]int64, 4)
	for i := range counts {
		wg.Go(func() {
			n, err := fencelock.SweepLeases(b.Ctx, b.Pool, fencelock.MinSweepGrace)
			assert.NoError(t, err)
			counts[i] = n
		})
	}
	var granted int64
	for i := 1; i <= 200; i += 7 {
		lease, err := l.Acquire(b.Ctx, fmt.Sprintf("old:%d", i), time.Minute)
		require.NoError(t, err)
		require.Greater(t, int64(lease.Token()), maxToken)
		require.NoError(t, lease.Release(b.Ctx))
		granted++
	}
	wg.Wait()
	var total int64
	for _, n := range counts {
		total += n
	}
	var left int64
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM fencelock.leases WHERE expires_at < now() - interval '1 minute'`).Scan(&left))
	require.Zero(t, left, "expired rows left after the sweeps")
	// Every old row was deleted once, except those a grant took over before a sweep reached it.
	require.LessOrEqual(t, total, int64(5000))
	require.GreaterOrEqual(t, total, 5000-granted)
	var pids []int32
	rows, err := b.Pool.Query(b.Ctx, `SELECT pid FROM fencelock.token_flushes`)
	require.NoError(t, err)
	pids, err = pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	require.NotContains(t, pids, int32(2147483000), "the row of an exited backend was not swept")
	require.Len(t, pids, 1, "the row of a live backend was swept")
}

// maxLeaseToken returns the largest token of fencelock.leases.
func maxLeaseToken(t *testing.T, b *bundle) int64 {
	t.Helper()
	var token int64
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT max(token) FROM fencelock.leases`).Scan(&token))
	return token
}
