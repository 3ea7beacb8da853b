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
// statement: it is neither cancelled nor waited for.
func TestAbandonedGrantCleanupSparesOtherStatements(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn, pid := testkit.Conn(t, b.Ctx, b.Pool)
	slept := make(chan error, 1)
	go func() {
		_, err := conn.Exec(b.Ctx, `SELECT pg_sleep(0.5)`)
		slept <- err
	}()
	require.Eventually(t, func() bool {
		var n int
		err := b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'PgSleep'`, int32(pid)).Scan(&n)
		return err == nil && n == 1
	}, 5*time.Second, 5*time.Millisecond)
	start := time.Now()
	require.NoError(t, testLessor(t, b.Pool, "h").endAbandonedGrant(b.Ctx, pid))
	require.Less(t, time.Since(start), 400*time.Millisecond, "the cleanup waited for a backend that ran no grant")
	require.NoError(t, <-slept, "the cleanup cancelled another statement")
}
