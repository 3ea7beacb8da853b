package gooselock

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
)

// unreachableLessor returns a lessor on a pool that cannot connect (nothing listens on port 1):
// a call that ran SQL on it would fail with a connection error, not an ArgumentError.
var unreachableLessor = fencetest.UnreachableLessor

// New refuses bad input with an ArgumentError naming it; no SQL runs.
func TestNewRefusesBadInput(t *testing.T) {
	for _, tc := range fencetest.BadLeaseArgs(t, "migrations") {
		t.Run(tc.Desc, func(t *testing.T) {
			g, err := New(tc.Lessor, tc.Name, tc.TTL)
			require.Nil(t, g)
			fencetest.RequireArgError(t, err, tc.Arg)
		})
	}
}

// Before the first Lock nothing is held, and saying so runs no SQL: Unlock and Err wrap
// ErrNotHeld, Done is closed, and a context from Context stays live until cancelled.
func TestNothingHeldBeforeLock(t *testing.T) {
	g, err := New(unreachableLessor(t), "migrations", 10*time.Second)
	require.NoError(t, err)
	require.ErrorIs(t, g.Unlock(context.Background(), nil), fencelock.ErrNotHeld)
	require.ErrorIs(t, g.Err(), fencelock.ErrNotHeld)
	select {
	case <-g.Done():
	default:
		t.Fatal("Done open before the first Lock")
	}
	ctx, cancel := g.Context(context.Background())
	require.NoError(t, ctx.Err())
	cancel()
	<-ctx.Done()
	require.ErrorIs(t, context.Cause(ctx), context.Canceled)
}
