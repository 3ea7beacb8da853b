package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/pgtest"
	"github.com/fencelock/fencelock/ratelimit"
)

// oneAnHour allows one request per key per hour: a key's first request is allowed and
// every later one (within the hour) refused, so a key refused after a crash is a key whose
// first decision the server still has, and a key allowed again is one whose decision it forgot.
var oneAnHour = ratelimit.Limit{Rate: 1, Per: time.Hour, Burst: 1}

// decided is a decision the limiter returned: its key and when AllowN returned (client clock).
type decided struct {
	key   string
	acked time.Time
}

// decide makes one allowed decision on each of the keys prefix:0, prefix:1, ... with rl, until
// n are made or (n = 0) until d has passed, and returns them in order.
func decide(t *testing.T, ctx context.Context, rl *ratelimit.Limiter, prefix string, n int, d time.Duration) []decided {
	t.Helper()
	var out []decided
	end := time.Now().Add(d)
	for i := 0; n > 0 && i < n || n == 0 && time.Now().Before(end); i++ {
		key := fmt.Sprintf("%s:%d", prefix, i)
		res, err := rl.Allow(ctx, key)
		require.NoError(t, err)
		require.Equal(t, 1, res.Allowed, "the first request of %s", key)
		out = append(out, decided{key, time.Now()})
	}
	return out
}

// loggedDecision is a decision of decideLogged: its key, when AllowN returned (client clock),
// and the server's WAL insert position read right after, at or past the end of its commit.
type loggedDecision struct {
	decided
	lsn int64 // bytes from 0/0
}

// decideLogged is decide (until d has passed) with the WAL insert position after each
// decision, read on pool.
func decideLogged(t *testing.T, ctx context.Context, rl *ratelimit.Limiter, pool *pgxpool.Pool, prefix string, d time.Duration) []loggedDecision {
	t.Helper()
	var out []loggedDecision
	for i, end := 0, time.Now().Add(d); time.Now().Before(end); i++ {
		key := fmt.Sprintf("%s:%d", prefix, i)
		res, err := rl.Allow(ctx, key)
		require.NoError(t, err)
		require.Equal(t, 1, res.Allowed, "the first request of %s", key)
		acked := time.Now()
		out = append(out, loggedDecision{decided{key, acked}, walPosition(t, ctx, pool, "insert")})
	}
	return out
}

// walPosition returns pool's server's WAL position of kind ("insert" or "flush"), in bytes
// from 0/0.
func walPosition(t *testing.T, ctx context.Context, pool *pgxpool.Pool, kind string) int64 {
	t.Helper()
	var lsn int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT (pg_catalog.pg_current_wal_`+kind+`_lsn() - '0/0'::pg_lsn)::bigint`).Scan(&lsn))
	return lsn
}

// crashAndRestart crashes srv (immediate shutdown: the WAL not yet written is lost), restarts
// it (crash recovery), and returns when pool reaches it again, with the time the crash began.
func crashAndRestart(t *testing.T, ctx context.Context, srv *pgtest.Server, pool *pgxpool.Pool) time.Time {
	t.Helper()
	at := time.Now()
	require.NoError(t, srv.Crash(ctx))
	require.NoError(t, srv.Restart(ctx))
	pool.Reset()
	awaitReconnect(t, ctx, pool)
	return at
}

// forgotten returns the indexes of the decisions the server no longer counts: their key's next
// request is allowed again.
func forgotten(t *testing.T, ctx context.Context, rl *ratelimit.Limiter, ds []decided) []int {
	t.Helper()
	var out []int
	for i, d := range ds {
		res, err := rl.Allow(ctx, d.key)
		require.NoError(t, err)
		if res.Allowed > 0 {
			out = append(out, i)
		}
	}
	return out
}

// What a crash of the server forgets of the limiter's decisions, on a server with fsync on
// (the WAL that was written before the crash survives it; what was still in the WAL buffers
// does not):
//
//   - Default: decisions commit without waiting for the flush, so the last ones may be
//     forgotten, but they are commits in the WAL, flushed by the WAL writer on its own (every
//     wal_writer_delay, 200 ms here, the default; nothing else commits): the test waits until
//     the WAL writer has flushed past the middle decision (an event, within the test's 4
//     minutes), and every decision whose commit the server had flushed before the crash (its
//     WAL position, read right after it, at or below the flush position read right before the
//     crash) is still counted. The forgotten ones are reported. A decision kept where the WAL
//     does not reach (an unlogged or temporary table, the session's memory) is forgotten,
//     flushed or not.
//   - DefaultIsAsynchronous: with wal_writer_delay = 10s (the WAL writer then does not flush
//     the last page of WAL before the crash) the default forgets the last decisions: it does
//     not wait for the flush (which is what makes it as fast as an asynchronous UPDATE).
//   - Durable: with the same 10 s, WithDurableDecisions forgets none.
//
// Autovacuum is off: its commits would flush the WAL at moments of its own.
func TestRateLimitDecisionsAfterCrash(t *testing.T) {
	t.Parallel()
	srv, db, ctx := crashableDB(t, 4*time.Minute, pgtest.WithSetting("fsync", "on"),
		pgtest.WithSetting("autovacuum", "off"))
	var delay string
	require.NoError(t, db.Pool.QueryRow(ctx, `SHOW wal_writer_delay`).Scan(&delay))
	require.Equal(t, "200ms", delay)
	// Applies at the next restart (not reloaded before): the phases after Default run with 10 s.
	_, err := db.Pool.Exec(ctx, `ALTER SYSTEM SET wal_writer_delay = '10s'`)
	require.NoError(t, err)
	fast, err := ratelimit.New(db.Pool, oneAnHour)
	require.NoError(t, err)
	durable, err := ratelimit.New(db.Pool, oneAnHour, ratelimit.WithDurableDecisions())
	require.NoError(t, err)

	t.Run("Default", func(t *testing.T) {
		logged := decideLogged(t, ctx, fast, db.Pool, "default", 3*time.Second)
		middle := logged[len(logged)/2]
		testkit.WaitFor(t, ctx, "the WAL writer flushes past the middle decision", func() bool {
			return walPosition(t, ctx, db.Pool, "flush") >= middle.lsn
		})
		flushed := walPosition(t, ctx, db.Pool, "flush")
		ds := make([]decided, len(logged))
		durable := 0
		for i, d := range logged {
			ds[i] = d.decided
			if d.lsn <= flushed {
				durable++
			}
		}
		crashAt := crashAndRestart(t, ctx, srv, db.Pool)
		lost := forgotten(t, ctx, fast, ds)
		var flushedLost []string
		for _, i := range lost {
			if logged[i].lsn <= flushed {
				flushedLost = append(flushedLost, fmt.Sprintf("%d (%s, WAL position %d)", i, ds[i].key, logged[i].lsn))
			}
		}
		require.Empty(t, flushedLost[:min(len(flushedLost), 5)], "%d of the %d decisions whose commits were flushed before the crash (WAL flushed to %d) forgotten; the first ones",
			len(flushedLost), durable, flushed)
		if len(lost) > 0 {
			t.Logf("%d decisions in %v, %d of them flushed before the crash; the crash forgot %d, the oldest returned %v before it",
				len(ds), 3*time.Second, durable, len(lost), crashAt.Sub(ds[lost[0]].acked))
		} else {
			t.Logf("%d decisions in %v, %d of them flushed before the crash; the crash forgot none", len(ds), 3*time.Second, durable)
		}
	})
	require.NoError(t, db.Pool.QueryRow(ctx, `SHOW wal_writer_delay`).Scan(&delay))
	if delay != "10s" { // Default did not run (go test -run): restart for the setting
		crashAndRestart(t, ctx, srv, db.Pool)
		require.NoError(t, db.Pool.QueryRow(ctx, `SHOW wal_writer_delay`).Scan(&delay))
	}
	require.Equal(t, "10s", delay)

	t.Run("Durable", func(t *testing.T) {
		ds := decide(t, ctx, durable, "durable", 300, 0)
		crashAndRestart(t, ctx, srv, db.Pool)
		require.Empty(t, forgotten(t, ctx, fast, ds), "durable decisions forgotten in the crash")
	})

	t.Run("DefaultIsAsynchronous", func(t *testing.T) {
		ds := decide(t, ctx, fast, "async", 300, 0)
		crashAndRestart(t, ctx, srv, db.Pool)
		lost := forgotten(t, ctx, fast, ds)
		require.NotEmpty(t, lost, "no decision forgotten: the default waited for the WAL flush")
		// One session, one decision after the other: the WAL holds them in order, and the crash
		// forgets a suffix.
		require.Equal(t, len(ds)-len(lost), lost[0], "forgotten: %v", lost)
		require.Equal(t, len(ds)-1, lost[len(lost)-1], "forgotten: %v", lost)
		t.Logf("the crash forgot the last %d of %d decisions", len(lost), len(ds))
	})
}
