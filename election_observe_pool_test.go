package fencelock_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
)

// An election observer reads the leader on a session of its own (taken from the pool and
// hijacked: the pool's slot freed), so once it observes it needs nothing more of its pool: an
// observer whose pool is saturated (every connection taken: a small pool, session advisory
// locks held, long transactions) still delivers the new leader when the NOTIFY wakes it.
// Issue 22's review found the first shared-notifier version reading through the pool, which
// delivered nothing here (each read waited for a connection, which the application holds until
// the test ends): a hang, so the 20 s below are a bound for a hang, not for the machine's speed
// (3 s, the bound before, was a time a loaded machine's NOTIFY and read had to beat).
func TestObserveWithSaturatedPool(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg, err := pgxpool.ParseConfig(b.DB.URL)
	require.NoError(t, err)
	cfg.MaxConns = 1
	small, err := pgxpool.NewWithConfig(b.Ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(small.Close)

	const name = "election:saturated"
	watcher, err := fencelock.NewElection(newLessor(t, small, "sat-watcher"), name, 5*time.Second)
	require.NoError(t, err)
	octx, stop := context.WithCancel(b.Ctx)
	defer stop()
	states := watcher.Observe(octx)
	// The first state means the observer has read once, on its own session (hijacked: the
	// pool's slot freed). Whether LISTEN is in place yet does not matter: without it the
	// observer polls, on that same session.
	require.Equal(t, fencelock.LeaderInfo{}, fencetest.Next(t, states), "nobody leads yet")

	// The application takes the small pool's only connection (a listening connection is
	// hijacked too and does not count).
	conn, err := small.Acquire(b.Ctx)
	require.NoError(t, err)
	defer conn.Release()

	cand, err := fencelock.NewElection(newLessor(t, b.Pool, "sat-cand"), name, 5*time.Second)
	require.NoError(t, err)
	term, err := cand.Campaign(b.Ctx, "v1")
	require.NoError(t, err)
	defer func() { _ = term.Resign(context.Background()) }()

	select {
	case got := <-states:
		require.Equal(t, "sat-cand", got.Holder)
	case <-time.After(20 * time.Second):
		t.Fatal("the observer delivered no new leader in 20 s while its pool was saturated")
	}
}
