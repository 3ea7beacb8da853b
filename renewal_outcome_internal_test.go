package fencelock

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// One renewal statement applies to each lease its own outcome, matched by the lease's place
// in the batch (LeaseRenew returns indexes, not names): renewed (its trust window and expiry
// move on), its row locked by another transaction (retried soon, still held, its window
// unchanged), or gone from the server (lost: Done closes). The batch lists them out of grant
// order, so a mismatched index gives a lease another's outcome.
func TestRenewLeasesOutcomeByIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := testLessor(t, b.Pool, "outcomes", WithoutHeartbeat())
	grant := func(name string) *Lease {
		lease, err := l.TryAcquire(b.Ctx, name, 30*time.Second)
		require.NoError(t, err)
		return lease
	}
	renewed, locked, gone := grant("renewed"), grant("locked"), grant("gone")

	tx, err := b.Pool.Begin(b.Ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.Ctx) }()
	_, err = tx.Exec(b.Ctx, `SELECT 1 FROM fencelock.leases WHERE name = 'locked' FOR UPDATE`)
	require.NoError(t, err)
	_, err = b.Pool.Exec(b.Ctx, `DELETE FROM fencelock.leases WHERE name = 'gone'`)
	require.NoError(t, err)

	trust, expiry, lockedTrust := renewed.TrustedUntil(), renewed.ExpiresAt(), locked.TrustedUntil()
	n, err := renewLeases(b.Ctx, l, []*Lease{gone, renewed, locked})
	require.NoError(t, err)
	require.Equal(t, 1, n, "one lease came back locked")

	require.NoError(t, renewed.Err())
	require.True(t, renewed.TrustedUntil().After(trust), "renewed: its trust window moved on")
	require.True(t, renewed.ExpiresAt().After(expiry), "renewed: its expiry moved on")

	require.NoError(t, locked.Err(), "locked: still held")
	require.Equal(t, lockedTrust, locked.TrustedUntil(), "locked: its window did not move")
	locked.mu.Lock()
	require.ErrorIs(t, locked.lastErr, errRowLocked)
	locked.mu.Unlock()

	select {
	case <-gone.Done():
	default:
		t.Fatal("gone: Done is still open")
	}
	require.ErrorIs(t, gone.Err(), ErrLeaseLost)
	require.ErrorIs(t, gone.Err(), errGoneOnServer)
}
