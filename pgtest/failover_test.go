package pgtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/pgtest"
)

// timeline returns the timeline the server behind pool writes WAL on.
func timeline(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	var tli int64
	require.NoError(t, pool.QueryRow(testContext(t), `SELECT ('x' || substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8))::bit(32)::bigint`).Scan(&tli))
	return tli
}

// rows returns the values of table kv in the database behind pool, in order.
func rows(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	r, err := pool.Query(testContext(t), `SELECT v FROM kv ORDER BY v`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(r, pgx.RowTo[string])
	require.NoError(t, err)
	return got
}

// kvPair starts a crashable primary with a database holding an empty table kv(v text), and a
// standby of it.
func kvPair(t *testing.T) (primary *pgtest.Server, db *pgtest.DB, standby *pgtest.Server) {
	t.Helper()
	primary = pgtest.NewServer(t, pgtest.Crashable())
	db = primary.NewDB(t)
	_, err := db.Pool.Exec(testContext(t), `CREATE TABLE kv (v text PRIMARY KEY)`)
	require.NoError(t, err)
	return primary, db, primary.NewStandby(t)
}

// A failover as an asynchronous HA setup has it: WAL senders paused (the standby lags), the
// primary crashes, the standby is promoted. The commit the standby never received is lost,
// the promoted server is on a new timeline, and a pool made from ClusterURL follows it.
func TestServer_Promote_AsyncLosesLaggedCommits(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	primary := pgtest.NewServer(t, pgtest.Crashable())
	db := primary.NewDB(t)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE kv (v text PRIMARY KEY); INSERT INTO kv VALUES ('replicated')`)
	require.NoError(t, err)
	standby := primary.NewStandby(t)
	url, err := pgtest.ClusterURL(db.Name, primary, standby)
	require.NoError(t, err)
	require.Contains(t, url, "target_session_attrs=read-write")
	cluster, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer cluster.Close()
	before := timeline(t, cluster)
	require.Equal(t, timeline(t, db.Pool), before, "the cluster pool reaches the primary")

	n, err := primary.PauseWALSenders(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = db.Pool.Exec(ctx, `INSERT INTO kv VALUES ('lagged')`)
	require.NoError(t, err, "an asynchronous commit does not wait for the paused sender")
	require.NoError(t, primary.Crash(ctx))
	require.NoError(t, standby.Promote(ctx))
	cluster.Reset() // its idle connections to the crashed primary are broken

	require.Equal(t, []string{"replicated"}, rows(t, cluster), "the lagged commit is lost; the pool reached the promoted server")
	require.Equal(t, before+1, timeline(t, cluster), "a promotion starts the next timeline")
	var inRecovery bool
	require.NoError(t, cluster.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery))
	require.False(t, inRecovery)
	_, err = cluster.Exec(ctx, `INSERT INTO kv VALUES ('after')`)
	require.NoError(t, err, "the promoted server takes writes")

	fresh := standby.NewDB(t) // a promoted server is a primary of its own
	var one int
	require.NoError(t, fresh.Pool.QueryRow(ctx, `SELECT 1`).Scan(&one))
	require.ErrorContains(t, standby.Promote(ctx), "not a standby")
	require.ErrorContains(t, primary.WaitReplay(ctx, standby), "not a standby of this server")
}

// With a synchronous standby, a commit waits until the standby has flushed its WAL: a paused
// sender holds commits back, and a crash of the primary loses no acknowledged commit.
func TestServer_Promote_SyncKeepsAcknowledgedCommits(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	primary, db, standby := kvPair(t)
	require.NoError(t, primary.SetSynchronousStandbys(ctx, "*"))
	_, err := db.Pool.Exec(ctx, `INSERT INTO kv VALUES ('acked')`)
	require.NoError(t, err)

	_, err = primary.PauseWALSenders(ctx)
	require.NoError(t, err)
	held := make(chan error, 1)
	go func() {
		_, err := db.Pool.Exec(context.WithoutCancel(ctx), `INSERT INTO kv VALUES ('held')`)
		held <- err
	}()
	// The commit waits for the standby: its backend shows the SyncRep wait event.
	mon, err := pgx.Connect(ctx, primary.URL("postgres"))
	require.NoError(t, err)
	defer mon.Close(context.Background())
	require.Eventually(t, func() bool {
		var waiting bool
		err := mon.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE wait_event = 'SyncRep')`).Scan(&waiting)
		return err == nil && waiting
	}, 30*time.Second, 5*time.Millisecond, "no commit waits for the synchronous standby")
	select {
	case err := <-held:
		t.Fatalf("a commit returned (%v) while the synchronous standby's sender was paused", err)
	default:
	}
	require.NoError(t, primary.Crash(ctx))
	require.Error(t, <-held, "the held commit was never acknowledged")
	require.NoError(t, standby.Promote(ctx))
	sdb, err := pgxpool.New(ctx, standby.URL(db.Name))
	require.NoError(t, err)
	defer sdb.Close()
	got := rows(t, sdb)
	require.Contains(t, got, "acked", "an acknowledged commit survives the failover")

	// The standby was made before the primary's ALTER SYSTEM (a file, not WAL): the promoted
	// server has no synchronous_standby_names, and SetSynchronousStandbys("") finds it in force.
	var names string
	require.NoError(t, sdb.QueryRow(ctx, `SHOW synchronous_standby_names`).Scan(&names))
	require.Empty(t, names)
	require.NoError(t, standby.SetSynchronousStandbys(ctx, ""))
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = sdb.Exec(wctx, `INSERT INTO kv VALUES ('after') ON CONFLICT DO NOTHING`)
	require.NoError(t, err)
}

// PauseWALSenders stops the standby's feed; ResumeWALSenders lets it catch up.
func TestServer_PauseResumeWALSenders(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	primary, db, standby := kvPair(t)
	sdb, err := pgxpool.New(ctx, standby.URL(db.Name))
	require.NoError(t, err)
	defer sdb.Close()

	_, err = primary.PauseWALSenders(ctx)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO kv VALUES ('x')`)
	require.NoError(t, err)
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, primary.WaitReplay(short, standby), context.DeadlineExceeded, "the paused sender holds the standby back")
	require.Empty(t, rows(t, sdb))

	require.NoError(t, primary.ResumeWALSenders())
	require.NoError(t, primary.WaitReplay(ctx, standby))
	require.Equal(t, []string{"x"}, rows(t, sdb))
	require.NoError(t, primary.ResumeWALSenders(), "nothing paused: a no-op")

	// Close with a paused sender does not wait for the postmaster's 5 s SIGKILL of children.
	_, err = primary.PauseWALSenders(ctx)
	require.NoError(t, err)
	start := time.Now()
	require.NoError(t, primary.Crash(ctx))
	require.Less(t, time.Since(start), 4*time.Second, "Crash kills the paused sender")
}

func TestClusterURL(t *testing.T) {
	t.Parallel()
	_, err := pgtest.ClusterURL("db")
	require.ErrorContains(t, err, "no servers")
	_, err = pgtest.ClusterURL("db", nil)
	require.ErrorContains(t, err, "no URL form")
}
