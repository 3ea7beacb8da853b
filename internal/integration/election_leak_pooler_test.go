package integration

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/fencelock/fencelock"
)

// An observer's goroutine and connection end when its ctx does. Not parallel: it counts
// goroutines.
func TestElectionObserveNoLeak(t *testing.T) {
	b := setup(t)
	opts := goleak.IgnoreCurrent()
	e := newElection(t, b, "leak", "election:leak", time.Second)
	ctx, cancel := context.WithCancel(b.Ctx)
	states := e.Observe(ctx)
	next(t, states)
	cancel()
	for range states {
	}
	verifyNoLeakWithin(t, 5*time.Second, opts)
}

// Behind PgBouncer in transaction mode (LISTEN cannot be trusted there) an observer polls, and
// still delivers each leader with its value and nobody leading after the resign; campaigns and
// resigns work through the pooler.
func TestElectionObserveBehindPgBouncer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, pool := viaPgBouncer(t, b, "transaction")
	const name = "election:pooled"
	watcher, err := fencelock.NewElection(newLessor(t, pool, "pooled-watcher"), name, time.Second)
	require.NoError(t, err)
	cand, err := fencelock.NewElection(newLessor(t, pool, "pooled-cand"), name, time.Second)
	require.NoError(t, err)
	states := watcher.Observe(b.Ctx)
	require.Equal(t, fencelock.LeaderInfo{}, next(t, states))
	term, err := cand.Campaign(b.Ctx, "behind-bouncer")
	require.NoError(t, err)
	got := nextWhere(t, states, 0, func(i fencelock.LeaderInfo) bool { return i.Value == "behind-bouncer" })
	require.Equal(t, term.Token(), got.Token)
	require.NoError(t, term.Resign(b.Ctx))
	require.Equal(t, fencelock.LeaderInfo{}, nextWhere(t, states, term.Token(), func(i fencelock.LeaderInfo) bool { return i.Token == 0 }))
}
