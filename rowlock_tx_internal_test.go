package fencelock

import (
	"testing"
	"time"

	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/stretchr/testify/require"
)

// The cleanup of an abandoned RunLocked grant cancels only a grant statement in this database:
// behind a pooler the pid a connection reported belongs to no backend of its own, or to
// someone else's, whose statement must go on. Here the pid is a live backend running another
// statement, one that waits at a gate the test holds (an advisory lock), so it runs for as long
// as the test wants however slow the machine: the cleanup returns while it still waits (it is
// not waited for: it could not end before the gate opens), and once the gate opens that
// statement completes (it was not cancelled). The 10 s bounds are hang bounds.
func TestAbandonedGrantCleanupSparesOtherStatements(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const gateKey = 737373
	gate, _ := testkit.Conn(t, b.Ctx, b.Pool)
	_, err := gate.Exec(b.Ctx, `SELECT pg_advisory_lock($1)`, gateKey)
	require.NoError(t, err)
	conn, pid := testkit.Conn(t, b.Ctx, b.Pool)
	gated := make(chan error, 1)
	go func() {
		_, err := conn.Exec(b.Ctx, `SELECT pg_advisory_xact_lock($1)`, gateKey)
		gated <- err
	}()
	waiting := func() bool { // the other statement waits at the gate
		var n int
		err := b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock' AND wait_event = 'advisory'`, int32(pid)).Scan(&n)
		return err == nil && n == 1
	}
	require.Eventually(t, waiting, 10*time.Second, 5*time.Millisecond)
	l := testLessor(t, b.Pool, "h")
	cleaned := testkit.Async(func() error { return l.endAbandonedGrant(b.Ctx, pid) })
	// The cleanup's own bound is cleanupTimeout (5 s): one that waited for this backend would
	// come back with an error, not hang.
	cleanupErr := testkit.Receive(t, cleaned, 10*time.Second, "return of the cleanup")
	require.True(t, waiting(), "the other statement no longer waits at the gate: the cleanup cancelled it")
	_, err = gate.Exec(b.Ctx, `SELECT pg_advisory_unlock($1)`, gateKey)
	require.NoError(t, err)
	require.NoError(t, testkit.Receive(t, gated, 10*time.Second, "end of the other statement"), "the cleanup cancelled another statement")
	require.NoError(t, cleanupErr, "the cleanup waited for a backend that ran no grant")
}
