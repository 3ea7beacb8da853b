package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/pgtest"
)

// Regression test for a bug found by TestScenarioSIGSTOP, fixed in lease.go: Lease.Err
// returned nil, and Done stayed open, after the trust window had ended, until the heartbeat
// goroutine's timer happened to run. A holder that checked Err() right after a pause (a
// resumed SIGSTOP, a long GC) was told the lease was still held, ~0.3-1.2 s past the
// server-side expiry in almost every run. Lease.Err now reads the clock and ends the lease
// on the spot.
//
// Here the heartbeat cannot renew (a GuardTx transaction holds the lease row), and a tight
// loop looks for a moment past TrustedUntil at which Err still returns nil.
func TestRegressionErrNilPastTrustWindow(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := fencelock.NewLessor(db.Pool, fencelock.WithHolder("h"))
	require.NoError(t, err)
	lease, err := l.TryAcquire(ctx, "trust", 300*time.Millisecond)
	require.NoError(t, err)
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	require.NoError(t, lease.GuardTx(ctx, tx)) // renewals now skip this lease
	var trustedLate time.Duration
	for {
		now := time.Now()
		if lease.Err() != nil {
			break
		}
		if late := now.Sub(lease.TrustedUntil()); late > 0 {
			trustedLate = late
			break
		}
	}
	require.Zero(t, trustedLate, "Err() returned nil %v after the trust window ended", trustedLate)
}
