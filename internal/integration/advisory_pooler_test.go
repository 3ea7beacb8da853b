package integration

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/pgtest"
)

// A real PgBouncer in session mode pins one server session to each client connection: a locker
// declared WithSessionPooler takes session locks there, and they exclude, end on Unlock, and
// end when the client connection closes (PgBouncer's DISCARD ALL). Without the option the
// pooler is refused, as behind a transaction pooler.
func TestAdvisoryBehindSessionPooler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bouncer := pgtest.NewPgBouncer(t, b.DB.Server, "session")
	viaBouncer := func() *pgxpool.Pool {
		return goosePool(t, b.Ctx, bouncer.URL(b.DB.Name), true) // PgBouncer < 1.21: no named prepared statements
	}
	poolA, poolB := viaBouncer(), viaBouncer()

	refusing := newLocker(t, poolA)
	_, err := refusing.TryLock(b.Ctx, "job")
	require.ErrorIs(t, err, fencelock.ErrConnectionPooler, "a pooler not declared is refused")

	a := newLocker(t, poolA, fencelock.WithSessionPooler(), fencelock.WithWatchdogInterval(time.Second))
	other := newLocker(t, poolB, fencelock.WithSessionPooler())
	key := keyOf(t, a, "job")
	lk, err := a.TryLock(b.Ctx, "job")
	require.NoError(t, err)
	require.Equal(t, []uint32{lk.BackendPID()}, advisoryHolders(t, b.Ctx, b.Pool, key, true), "the server session named by BackendPID holds the lock")
	_, err = other.TryLock(b.Ctx, "job")
	require.ErrorIs(t, err, fencelock.ErrNotAcquired, "held through one client connection, refused through another")

	// A watchdog round passes without ending the lock: its first probe labels the server
	// session (which it finds the same), and the lock stays held.
	waitFor(t, b, "the watchdog's first probe labels the session", func() bool {
		var app string
		require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT application_name FROM pg_stat_activity WHERE pid = $1`, int32(lk.BackendPID())).Scan(&app))
		return app == "fencelock job"
	})
	select {
	case <-lk.Done():
		t.Fatalf("lock ended behind a session pooler: %v", lk.Err())
	default:
	}
	require.NoError(t, lk.Unlock(b.Ctx))
	require.Empty(t, advisoryHolders(t, b.Ctx, b.Pool, key, true), "Unlock released it on the server")

	// The server session behind the holder's client connection ends: PgBouncer drops the
	// client connection with it, the watchdog ends the lock, and another client may take it.
	lk2, err := other.TryLock(b.Ctx, "job")
	require.NoError(t, err)
	require.NoError(t, b.DB.Server.TerminateBackend(b.Ctx, lk2.BackendPID()))
	select {
	case <-lk2.Done():
		require.ErrorIs(t, lk2.Err(), fencelock.ErrLockLost)
	case <-time.After(30 * time.Second):
		t.Fatal("Done did not close after the lock's server session ended behind the session pooler")
	}
	require.Empty(t, advisoryHolders(t, b.Ctx, b.Pool, key, true))
	lk3, err := a.TryLock(b.Ctx, "job")
	require.NoError(t, err)
	require.NoError(t, lk3.Unlock(b.Ctx))
}
