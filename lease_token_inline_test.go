package fencelock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// A lease grant draws its token inline on the common path (issue 31); these are the attacks
// an adversarial review found against that path, each of which the PL/pgSQL next_token it
// replaced did not allow.

// A sequence altered to a large INCREMENT near the budget: the inline draw checks the value it
// drew, not the sequence's last value, so a draw past 2^47 is refused with ErrTokenBudget
// instead of wrapping into a lower token.
func TestLeaseGrantInlineTokenBudgetWithLargeIncrement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.Pool.Exec(b.Ctx, `SELECT setval('fencelock.leases_token_seq', $1::bigint)`, int64(1)<<47-1<<20-3)
	require.NoError(t, err)
	l := newLessor(t, b.Pool, "big-step")
	lease, err := l.TryAcquire(b.Ctx, "w", time.Minute)
	require.NoError(t, err)
	last := lease.Token()
	require.NoError(t, lease.Release(b.Ctx))
	_, err = b.Pool.Exec(b.Ctx, `ALTER SEQUENCE fencelock.leases_token_seq INCREMENT 2097152`)
	require.NoError(t, err)
	lease, err = l.TryAcquire(b.Ctx, "w", time.Minute)
	if err == nil {
		t.Fatalf("granted token %d after %d: the draw passed the budget", lease.Token(), last)
	}
	require.ErrorIs(t, err, fencelock.ErrTokenBudget)
	requireNothingHeld(t, b.Ctx, b.Pool, "w")
}

// A RunLocked whose grant waits on the lease row's lock while RebaseTokenEpoch commits and
// returns draws a token of the new epoch, above a token of the new epoch issued to another
// name meanwhile: the inline draw reads the epoch in its statement's snapshot only while the
// statement has run for less than 5 ms, and the rebase returns no sooner than 10 ms after its
// commit.
func TestRunLockedWaitingThroughRebaseDrawsNewEpoch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.Ctx
	h := newLessor(t, b.Pool, "h")
	// A grant first, outside any open transaction: the first token of an epoch records the
	// epoch under token_epoch's row lock, which H's open transaction would then hold, and the
	// rebase waits for it.
	warm, err := h.TryAcquire(ctx, "warm", time.Minute)
	require.NoError(t, err)
	require.NoError(t, warm.Release(ctx))
	inside, leave := make(chan struct{}), make(chan struct{})
	var once sync.Once
	letGo := func() { once.Do(func() { close(leave) }) }
	defer letGo()
	held := make(chan error, 1)
	go func() {
		held <- h.TryRunLocked(ctx, "x", func(context.Context, pgx.Tx, fencelock.Token) error {
			close(inside)
			<-leave
			return nil
		})
	}()
	<-inside
	type result struct {
		token fencelock.Token
		err   error
	}
	got := make(chan result, 1)
	go func() {
		var tok fencelock.Token
		err := newLessor(t, b.Pool, "s").RunLocked(ctx, "x", func(_ context.Context, _ pgx.Tx, token fencelock.Token) error {
			tok = token
			return nil
		})
		got <- result{tok, err}
	}()
	waitFor(t, b, "the grant waiting on the row lock", func() bool {
		var n int
		require.NoError(t, b.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%LeaseGrant%'`).Scan(&n))
		return n == 1
	})
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	epoch, err := fencelock.RebaseTokenEpoch(rctx, b.Pool, 0)
	require.NoError(t, err)
	other, err := newLessor(t, b.Pool, "y").TryAcquire(ctx, "y", time.Minute)
	require.NoError(t, err)
	require.Equal(t, epoch, other.Token().Epoch(), "a grant after the rebase")
	letGo()
	require.NoError(t, <-held)
	r := <-got
	require.NoError(t, r.err)
	require.Equal(t, epoch, r.token.Epoch(), "the waiting grant's token is of the new epoch")
	require.Greater(t, r.token, other.Token())
}
