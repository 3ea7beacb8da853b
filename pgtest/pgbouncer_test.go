package pgtest_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/pgtest"
)

// connectExec opens a connection to url that sends no named prepared statements, as clients of
// a PgBouncer older than 1.21 in transaction or statement mode must.
func connectExec(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	return connect(t, url, func(cfg *pgx.ConnConfig) { cfg.DefaultQueryExecMode = pgx.QueryExecModeExec })
}

func TestNewPgBouncer_TransactionPool(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	db := pgtest.NewDB(t)
	began := time.Now()
	pgb := pgtest.NewPgBouncer(t, db.Server, "transaction")
	t.Logf("NewPgBouncer: %v (%s, prepared statements tracked: %v)", time.Since(began), pgb.Version(), pgb.PreparedStatements())
	require.True(t, strings.HasPrefix(pgb.URL(db.Name), "postgres://postgres@127.0.0.1:"), pgb.URL(db.Name))
	require.NotContains(t, pgb.URL(db.Name), db.Server.URL(db.Name), "a port of its own")

	cfg, err := pgxpool.ParseConfig(pgb.URL(db.Name))
	require.NoError(t, err)
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	cfg.MaxConns = 30 // more clients than default_pool_size (20) server connections
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()

	var current string
	require.NoError(t, pool.QueryRow(ctx, `SELECT current_database()`).Scan(&current))
	require.Equal(t, db.Name, current, "the wildcard entry reaches the database named in the URL")

	// Concurrent statements with arguments and transactions, through the pooler.
	var wg sync.WaitGroup
	errs := make(chan error, 30)
	for i := range 30 {
		wg.Go(func() {
			name := fmt.Sprintf("lease-%d", i)
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO fencelock.leases (name, holder, acquired_at, expires_at) VALUES ($1, $2, now(), now() + interval '1 minute')`, name, "pgbouncer")
				return err
			})
			if err == nil {
				var holder string
				err = pool.QueryRow(ctx, `SELECT holder FROM fencelock.leases WHERE name = $1`, name).Scan(&holder)
				if err == nil && holder != "pgbouncer" {
					err = fmt.Errorf("holder of %s: %q", name, holder)
				}
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM fencelock.leases WHERE holder = 'pgbouncer'`).Scan(&n))
	require.Equal(t, 30, n, "every write went through to the server")
}

// TestPgBouncer_BackendPID shows how a client can tell it is behind PgBouncer: the pid in the
// BackendKeyData (pgconn.PgConn.PID) is PgBouncer's invention, not the server backend's
// pg_backend_pid(), in every pool mode. Directly connected, the two agree.
func TestPgBouncer_BackendPID(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)

	t.Run("Direct", func(t *testing.T) {
		t.Parallel()
		conn := connectExec(t, db.URL)
		var backend uint32
		require.NoError(t, conn.QueryRow(testContext(t), `SELECT pg_backend_pid()`).Scan(&backend))
		require.Equal(t, conn.PgConn().PID(), backend)
	})

	for _, mode := range []string{"session", "transaction", "statement"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			pgb := pgtest.NewPgBouncer(t, db.Server, mode)
			for range 5 { // each on a new client connection
				conn := connectExec(t, pgb.URL(db.Name))
				var backend uint32
				require.NoError(t, conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend))
				require.NotEqual(t, conn.PgConn().PID(), backend,
					"%s mode: the client sees PgBouncer's pid, not the backend's", mode)
				t.Logf("%s mode: PgConn.PID()=%d pg_backend_pid()=%d", mode, conn.PgConn().PID(), backend)
			}
		})
	}
}

func TestStartPgBouncer_Invalid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		poolMode string
		error    string
	}{
		{"Empty", "", `pool mode ""`},
		{"CaseMatters", "Transaction", `pool mode "Transaction"`},
		{"Unknown", "sessions", `pool mode "sessions"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			p, err := pgtest.StartPgBouncer(testContext(t), nil, tc.poolMode)
			require.ErrorContains(t, err, tc.error)
			require.Nil(t, p)
			require.Less(t, time.Since(start), time.Second, "validation starts nothing")
		})
	}
	t.Run("NilServer", func(t *testing.T) {
		t.Parallel()
		p, err := pgtest.StartPgBouncer(testContext(t), nil, "session")
		require.ErrorContains(t, err, "nil Server")
		require.Nil(t, p)
	})
}

// TestStartPgBouncer_Close runs a PgBouncer's whole life without testing.T helpers.
func TestStartPgBouncer_Close(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	db := pgtest.NewDB(t)
	pgtest.NeedPgBouncer(t)
	began := time.Now()
	pgb, err := pgtest.StartPgBouncer(ctx, db.Server, "session")
	require.NoError(t, err)
	t.Logf("StartPgBouncer: %v", time.Since(began))
	url := pgb.URL(db.Name)
	conn := connectExec(t, url)
	require.NoError(t, conn.Ping(ctx))

	require.NoError(t, pgb.Close())
	require.NoError(t, pgb.Close(), "Close is idempotent")
	require.Error(t, conn.Ping(ctx), "connections through it break")
	_, err = pgx.Connect(ctx, url)
	require.Error(t, err, "PgBouncer is gone")
	require.NoError(t, db.Pool.Ping(ctx), "the server runs on")
}
