package fencetest

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// NewElection returns the election name with ttl on a lessor of its own on pool, with holder
// id holder and opts.
func NewElection(t testing.TB, pool *pgxpool.Pool, holder, name string, ttl time.Duration, opts ...fencelock.LessorOption) *fencelock.Election {
	t.Helper()
	e, err := fencelock.NewElection(NewLessor(t, pool, holder, opts...), name, ttl)
	require.NoError(t, err)
	return e
}

// Next receives an observer's next state, failing the test after 10 s or when the channel
// closes.
func Next(t testing.TB, ch <-chan fencelock.LeaderInfo) fencelock.LeaderInfo {
	t.Helper()
	select {
	case info, ok := <-ch:
		require.True(t, ok, "the observer's channel closed")
		return info
	case <-time.After(10 * time.Second):
		t.Fatal("the observer delivered nothing in 10 s")
	}
	return fencelock.LeaderInfo{}
}

// NextWhere skips an observer's states until one satisfies cond (a state with the new
// leader's value may be preceded by the same term before it proclaimed), checking that terms
// only rise from last.
func NextWhere(t testing.TB, ch <-chan fencelock.LeaderInfo, last fencelock.Token, cond func(fencelock.LeaderInfo) bool) fencelock.LeaderInfo {
	t.Helper()
	for {
		info := Next(t, ch)
		if info.Token != 0 {
			require.GreaterOrEqual(t, info.Token, last, "terms delivered out of order")
			last = info.Token
		}
		if cond(info) {
			return info
		}
	}
}
