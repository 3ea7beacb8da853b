package pgtest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/pgtest"
)

// requireReadOnly checks that the database behind conn is in recovery and refuses a write
// with SQLSTATE 25006 (read_only_sql_transaction).
func requireReadOnly(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	ctx := testContext(t)
	var inRecovery bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery))
	require.True(t, inRecovery, "pg_is_in_recovery()")
	_, err := conn.Exec(ctx, `INSERT INTO fencelock.leases (name, holder, acquired_at, expires_at) VALUES ('w', 'standby', now(), now() + interval '1 minute')`)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "a write on the standby fails with a PgError: %v", err)
	require.Equal(t, "25006", pgErr.Code, "read_only_sql_transaction")
}

func TestServer_NewStandby(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	primary := pgtest.NewServer(t, pgtest.Crashable())
	before := primary.NewDB(t) // migrated, created before the standby
	_, err := before.Pool.Exec(ctx, `INSERT INTO fencelock.leases (name, holder, acquired_at, expires_at) VALUES ('before', 'primary', now(), now() + interval '1 minute')`)
	require.NoError(t, err)

	began := time.Now()
	standby := primary.NewStandby(t)
	t.Logf("NewStandby: %v", time.Since(began))
	require.NotEqual(t, primary.URL("postgres"), standby.URL("postgres"))

	// requireReplicated checks that the standby has the primary's lease name in database, and
	// refuses a write there.
	requireReplicated := func(t *testing.T, database, name string) {
		t.Helper()
		conn := connect(t, standby.URL(database))
		var holder string
		require.NoError(t, conn.QueryRow(ctx, `SELECT holder FROM fencelock.leases WHERE name = $1`, name).Scan(&holder))
		require.Equal(t, "primary", holder)
		requireReadOnly(t, conn)
	}

	t.Run("DatabaseCreatedBeforeIsThere", func(t *testing.T) {
		requireReplicated(t, before.Name, "before")
	})

	t.Run("WaitReplay", func(t *testing.T) {
		after := primary.NewDB(t) // created after the standby started
		_, err := after.Pool.Exec(ctx, `INSERT INTO fencelock.leases (name, holder, acquired_at, expires_at) VALUES ('after', 'primary', now(), now() + interval '1 minute')`)
		require.NoError(t, err)
		began := time.Now()
		require.NoError(t, primary.WaitReplay(ctx, standby))
		t.Logf("WaitReplay: %v", time.Since(began))
		requireReplicated(t, after.Name, "after")
	})

	t.Run("NoDatabasesOnStandby", func(t *testing.T) {
		_, _, err := standby.CreateDatabase(ctx)
		require.ErrorContains(t, err, "read-only hot standby")
	})

	t.Run("WaitReplayNeedsItsStandby", func(t *testing.T) {
		require.ErrorContains(t, primary.WaitReplay(ctx, nil), "not a standby of this server")
		require.ErrorContains(t, standby.WaitReplay(ctx, primary), "not a standby of this server")
		_, err := standby.StartStandby(ctx)
		require.ErrorContains(t, err, "itself a standby")
	})

	t.Run("CrashRestart", func(t *testing.T) {
		require.True(t, standby.CanCrash())
		require.NoError(t, standby.Crash(ctx))
		_, err := pgx.Connect(ctx, standby.URL(before.Name))
		require.Error(t, err, "the standby is down")
		require.NoError(t, standby.Restart(ctx))
		conn := connect(t, standby.URL(before.Name))
		requireReadOnly(t, conn)
		_, err = before.Pool.Exec(ctx, `INSERT INTO fencelock.leases (name, holder, acquired_at, expires_at) VALUES ('restarted', 'primary', now(), now() + interval '1 minute')`)
		require.NoError(t, err)
		require.NoError(t, primary.WaitReplay(ctx, standby), "the restarted standby streams again")
		var n int
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM fencelock.leases WHERE name = 'restarted'`).Scan(&n))
		require.Equal(t, 1, n)
	})
}

// TestServer_StartStandby_Close runs a standby's whole life without testing.T helpers.
func TestServer_StartStandby_Close(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	primary := pgtest.NewServer(t, pgtest.Crashable())
	standby, err := primary.StartStandby(ctx)
	require.NoError(t, err)
	url := standby.URL("postgres")
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	requireReadOnlyServer(t, conn)
	require.NoError(t, conn.Close(ctx))

	require.NoError(t, standby.Close())
	require.NoError(t, standby.Close(), "Close is idempotent")
	_, err = pgx.Connect(ctx, url)
	require.Error(t, err, "the standby is gone")
	require.ErrorContains(t, primary.WaitReplay(ctx, standby), "connect", "its standby is closed")

	var one int
	require.NoError(t, pgxConnectScan(t, primary.URL("postgres"), `SELECT 1`, &one), "the primary runs on")
}

// requireReadOnlyServer checks that the server behind conn is in recovery and refuses DDL
// with SQLSTATE 25006.
func requireReadOnlyServer(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	ctx := testContext(t)
	var inRecovery bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery))
	require.True(t, inRecovery)
	_, err := conn.Exec(ctx, `CREATE TABLE t (id int)`)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "25006", pgErr.Code)
}

// pgxConnectScan runs query on a new connection to url and scans its one row into dest.
func pgxConnectScan(t *testing.T, url, query string, dest ...any) error {
	return connectScan(testContext(t), url, query, dest...)
}

// connectScan runs query on a new connection to url, made within ctx, and scans its one row
// into dest.
func connectScan(ctx context.Context, url, query string, dest ...any) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, query).Scan(dest...)
}
