package fencelock_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// Issue 22 review. Before the redesign (fd9a72a) an election observer read the leader on a
// connection of its own (taken from the pool and hijacked: the pool's slot freed), so once it
// was observing it needed nothing more of the pool. Now it reads through the pool
// (o.l.q.ElectionLeader(rctx, o.l.pool, ...), election_observe.go) and listens on the pool's
// shared notifier: an observer whose pool is saturated (every connection taken: a small pool,
// session advisory locks held, long transactions) is woken by the NOTIFY but cannot read, and
// delivers nothing until a connection frees up (each read gives up after max(TTL, 5 s)).
//
// Fails on the redesign (no state in 3 s); on base semantics the new leader is delivered in a
// few milliseconds.
func TestReviewObserveWithSaturatedPool(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	cfg.MaxConns = 1
	small, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(small.Close)

	const name = "election:saturated"
	watcher, err := fencelock.NewElection(newLessor(t, small, "sat-watcher"), name, 5*time.Second)
	require.NoError(t, err)
	octx, stop := context.WithCancel(b.ctx)
	defer stop()
	states := watcher.Observe(octx)
	require.Equal(t, fencelock.LeaderInfo{}, next(t, states), "nobody leads yet")
	time.Sleep(time.Second) // the observer's LISTEN is in place, whichever connection it is on

	// The application takes the small pool's only connection (the listening one, hijacked,
	// no longer counts).
	conn, err := small.Acquire(b.ctx)
	require.NoError(t, err)
	defer conn.Release()

	cand, err := fencelock.NewElection(newLessor(t, b.pool, "sat-cand"), name, 5*time.Second)
	require.NoError(t, err)
	term, err := cand.Campaign(b.ctx, "v1")
	require.NoError(t, err)
	defer func() { _ = term.Resign(context.Background()) }()

	select {
	case got := <-states:
		require.Equal(t, "sat-cand", got.Holder)
	case <-time.After(3 * time.Second):
		t.Fatal("the observer delivered no new leader in 3 s while its pool was saturated")
	}
}
