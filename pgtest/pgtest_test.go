package pgtest_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/fencelock/fencelock/pgtest"
)

func TestMain(m *testing.M) {
	if kind := os.Getenv(helperEnv); kind != "" {
		runHelper(kind)
		return
	}
	pgtest.Main(m)
}

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// connect opens a connection to url, its config first changed by configure (if any), and
// closes it at test cleanup.
func connect(t *testing.T, url string, configure ...func(*pgx.ConnConfig)) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	for _, f := range configure {
		f(cfg)
	}
	conn, err := pgx.ConnectConfig(testContext(t), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func TestNewDB(t *testing.T) {
	t.Parallel()

	t.Run("Migrated", func(t *testing.T) {
		t.Parallel()
		ctx := testContext(t)
		db := pgtest.NewDB(t)
		var leases, fences bool
		err := db.Pool.QueryRow(ctx, `SELECT to_regclass('fencelock.leases') IS NOT NULL, to_regclass('fencelock.fences') IS NOT NULL`).
			Scan(&leases, &fences)
		require.NoError(t, err)
		require.True(t, leases, "fencelock.leases exists")
		require.True(t, fences, "fencelock.fences exists")

		var current string
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT current_database()`).Scan(&current))
		require.Equal(t, db.Name, current)
	})

	t.Run("Isolated", func(t *testing.T) {
		t.Parallel()
		ctx := testContext(t)
		a, b := pgtest.NewDB(t), pgtest.NewDB(t)
		require.NotEqual(t, a.Name, b.Name)
		require.NotEqual(t, a.URL, b.URL)

		_, err := a.Pool.Exec(ctx, `INSERT INTO fencelock.leases (name, holder, acquired_at, expires_at) VALUES ('x', 'a', now(), now() + interval '1 minute')`)
		require.NoError(t, err)
		_, err = a.Pool.Exec(ctx, `CREATE TABLE only_in_a (id int)`)
		require.NoError(t, err)

		var n int
		require.NoError(t, b.Pool.QueryRow(ctx, `SELECT count(*) FROM fencelock.leases`).Scan(&n))
		require.Zero(t, n, "b sees no lease of a")
		var exists bool
		require.NoError(t, b.Pool.QueryRow(ctx, `SELECT to_regclass('only_in_a') IS NOT NULL`).Scan(&exists))
		require.False(t, exists, "b sees no table of a")
	})

	t.Run("URLConnects", func(t *testing.T) {
		t.Parallel()
		ctx := testContext(t)
		db := pgtest.NewDB(t)
		conn := connect(t, db.URL)
		var current string
		require.NoError(t, conn.QueryRow(ctx, `SELECT current_database()`).Scan(&current))
		require.Equal(t, db.Name, current)
	})
}

func TestServer_TerminateBackend(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	db := pgtest.NewDB(t)

	victim := connect(t, db.URL)
	_, err := victim.Exec(ctx, `SELECT 1`)
	require.NoError(t, err)

	require.NoError(t, db.Server.TerminateBackend(ctx, victim.PgConn().PID()))
	_, err = victim.Exec(ctx, `SELECT 1`)
	require.Error(t, err, "the victim's next query fails")

	err = db.Server.TerminateBackend(ctx, victim.PgConn().PID())
	require.ErrorContains(t, err, "returned false", "the backend is gone")
}

func TestServer_CrashRestart(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	srv := pgtest.NewServer(t, pgtest.Crashable())
	require.True(t, srv.CanCrash(), "fault tests need a server from local binaries")
	db := srv.NewDB(t)

	_, err := db.Pool.Exec(ctx, `INSERT INTO fencelock.leases (name, holder, acquired_at, expires_at) VALUES ('committed', 'a', now(), now() + interval '1 minute')`)
	require.NoError(t, err)
	require.ErrorContains(t, srv.Restart(ctx), "is running", "Restart needs a Crash first")

	require.NoError(t, srv.Crash(ctx))
	_, err = db.Pool.Exec(ctx, `SELECT 1`)
	require.Error(t, err, "the server is down")
	require.ErrorContains(t, srv.Crash(ctx), "not running")

	require.NoError(t, srv.Restart(ctx))
	conn := connect(t, db.URL)
	var holder string
	require.NoError(t, conn.QueryRow(ctx, `SELECT holder FROM fencelock.leases WHERE name = 'committed'`).Scan(&holder))
	require.Equal(t, "a", holder, "a commit before the crash survives it")

	// A second round: the restarted server crashes and recovers as well.
	require.NoError(t, srv.Crash(ctx))
	require.NoError(t, srv.Restart(ctx))
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT holder FROM fencelock.leases WHERE name = 'committed'`).Scan(&holder))
}

func TestWithSetting(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	srv := pgtest.NewServer(t, pgtest.WithSetting("synchronous_commit", "off"), pgtest.WithSetting("work_mem", "8MB"))
	conn := connect(t, srv.URL("postgres"))

	for name, want := range map[string]string{
		"synchronous_commit": "off",
		"work_mem":           "8MB",
		"fsync":              "off", // a default of pgtest
		"max_connections":    "300",
	} {
		var got string
		require.NoError(t, conn.QueryRow(ctx, "SHOW "+name).Scan(&got))
		require.Equal(t, want, got, name)
	}
}

func TestStart_InvalidOption(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		opt   pgtest.Option
		error string
	}{
		{"ManagedPort", pgtest.WithSetting("port", "5432"), `parameter "port" is managed by pgtest`},
		{"ManagedCaseInsensitive", pgtest.WithSetting("Listen_Addresses", "*"), "is managed by pgtest"},
		{"NameWithSpace", pgtest.WithSetting("work mem", "1MB"), "invalid parameter name"},
		{"NameWithEquals", pgtest.WithSetting("a=b", "1"), "invalid parameter name"},
		{"EmptyName", pgtest.WithSetting("", "1"), "invalid parameter name"},
		{"NulInValue", pgtest.WithSetting("work_mem", "1\x00MB"), "NUL"},
		{"NilOption", nil, "nil Option"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			srv, err := pgtest.Start(testContext(t), tc.opt)
			require.ErrorContains(t, err, tc.error)
			require.Nil(t, srv)
			require.Less(t, time.Since(start), time.Second, "validation starts nothing")
		})
	}
}

// TestStart_Close runs a server's whole life without testing.T helpers and checks that
// nothing is left running: no goroutine, and the server no longer accepts connections.
func TestStart_Close(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx := testContext(t)

	began := time.Now()
	srv, err := pgtest.Start(ctx)
	require.NoError(t, err)
	t.Logf("Start: %v", time.Since(began))
	url := srv.URL("postgres")

	began = time.Now()
	name, dbURL, err := srv.CreateDatabase(ctx)
	require.NoError(t, err)
	t.Logf("first CreateDatabase (template and migrations): %v", time.Since(began))
	began = time.Now()
	_, _, err = srv.CreateDatabase(ctx)
	require.NoError(t, err)
	t.Logf("second CreateDatabase: %v", time.Since(began))

	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	var current string
	require.NoError(t, conn.QueryRow(ctx, `SELECT current_database()`).Scan(&current))
	require.Equal(t, name, current)
	require.NoError(t, conn.Close(ctx))

	began = time.Now()
	require.NoError(t, srv.Close())
	t.Logf("Close: %v", time.Since(began))
	require.NoError(t, srv.Close(), "Close is idempotent")
	require.ErrorContains(t, srv.Restart(ctx), "closed")

	_, err = pgx.Connect(ctx, url)
	require.Error(t, err, "the server is gone")
}

func TestTimings(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	pgtest.NewDB(t) // the shared server and its template exist from here on
	const n = 10
	began := time.Now()
	for range n {
		pgtest.NewDB(t)
	}
	t.Logf("NewDB: %v each (mean of %d)", time.Since(began)/n, n)
	began = time.Now()
	for range 3 {
		pgtest.NewServer(t)
	}
	t.Logf("NewServer: %v each (mean of 3)", time.Since(began)/3)
}

// helperEnv, set to "server" or "patroni", turns the test binary into the child of
// startHangingChild: it starts a local server or a 2-node Patroni cluster, prints its URL and
// waits to be killed.
const helperEnv = "PGTEST_HELPER_START_AND_HANG"

// runHelper is the child of startHangingChild (see helperEnv).
func runHelper(kind string) {
	var url string
	var err error
	switch kind {
	case "server":
		var srv *pgtest.Server
		if srv, err = pgtest.Start(context.Background()); err == nil {
			url = srv.URL("postgres")
		}
	case "patroni":
		var c *pgtest.PatroniCluster
		if c, err = pgtest.StartPatroni(context.Background(), 2); err == nil {
			url = c.URL("postgres")
		}
	default:
		err = fmt.Errorf("unknown kind %q", kind)
	}
	if err != nil {
		fmt.Println("error:", strings.ReplaceAll(err.Error(), "\n", " | "))
		os.Exit(1)
	}
	fmt.Println(url)
	time.Sleep(time.Hour) // killed by the parent test
}

// startHangingChild runs the test binary as a child that starts a server of kind ("server" or
// "patroni"), with env added to its environment and TMPDIR set to a temp dir of its own (its
// temp dirs may be left behind by design), and returns the child, that dir and the URL the
// child printed. The child is killed at test cleanup if the test has not killed it.
func startHangingChild(t *testing.T, kind string, env ...string) (cmd *exec.Cmd, tmp, url string) {
	t.Helper()
	tmp, err := os.MkdirTemp("", "pgtest-child-*")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(tmp, 0o1777))
	t.Cleanup(func() { os.RemoveAll(tmp) })
	cmd = exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), helperEnv+"="+kind, "TMPDIR="+tmp), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	url = strings.TrimSpace(line)
	require.True(t, strings.HasPrefix(url, "postgres://"), "child: %s", url)
	return cmd, tmp, url
}

// TestServerDiesWithTestBinary checks that the kernel kills a local server whose test binary
// is killed (SIGKILL, so no cleanup runs).
func TestServerDiesWithTestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	t.Parallel()
	ctx := testContext(t)
	cmd, _, url := startHangingChild(t, "server", pgtest.EnvServer+"=local")
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err, "the child's server is up")
	require.NoError(t, conn.Close(ctx))

	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	require.Eventually(t, func() bool {
		conn, err := pgx.Connect(ctx, url)
		if err == nil {
			_ = conn.Close(ctx)
			return false
		}
		return true
	}, 10*time.Second, 20*time.Millisecond, "the server dies with its test binary")
}

// TestServer_UnsupportedOnExisting runs only in the children of TestExistingServer.
func TestServer_UnsupportedOnExisting(t *testing.T) {
	if os.Getenv(pgtest.EnvDatabaseURL) == "" {
		t.Skip("runs in TestExistingServer's child processes, with " + pgtest.EnvDatabaseURL)
	}
	db := pgtest.NewDB(t)
	require.False(t, db.Server.CanCrash())
	require.ErrorIs(t, db.Server.Crash(testContext(t)), errors.ErrUnsupported)
	require.ErrorIs(t, db.Server.Restart(testContext(t)), errors.ErrUnsupported)
	_, err := db.Server.StartStandby(testContext(t))
	require.ErrorIs(t, err, errors.ErrUnsupported)
	require.NoError(t, db.Server.Close(), "Close leaves an existing server alone")
	var one int
	require.NoError(t, db.Pool.QueryRow(testContext(t), `SELECT 1`).Scan(&one))
}

// TestExistingServer runs this package's database tests in child processes whose NewDB uses
// FENCELOCK_TEST_DATABASE_URL, pointed at a dedicated server: two at once (they share the
// template), with a keyword/value string, and with a role that cannot create databases.
func TestExistingServer(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	srv := pgtest.NewServer(t)
	conn := connect(t, srv.URL("postgres"))
	_, err := conn.Exec(ctx, `CREATE ROLE creator LOGIN CREATEDB; CREATE ROLE plain LOGIN`)
	require.NoError(t, err)
	cfg := conn.Config()

	child := func(dbURL string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.v", "-test.count=1",
			"-test.run=^(TestNewDB|TestServer_TerminateBackend|TestServer_UnsupportedOnExisting)$")
		cmd.Env = append(os.Environ(), pgtest.EnvDatabaseURL+"="+dbURL)
		return cmd
	}
	passed := func(t *testing.T, out []byte, err error) {
		t.Helper()
		require.NoError(t, err, "%s", out)
		require.Contains(t, string(out), "--- PASS: TestServer_UnsupportedOnExisting")
		require.Contains(t, string(out), "--- PASS: TestNewDB/Isolated")
	}

	t.Run("TwoProcessesAtOnce", func(t *testing.T) {
		u := strings.Replace(srv.URL("postgres"), "postgres@", "creator@", 1)
		a, b := child(u), child(u)
		var outA, outB strings.Builder
		a.Stdout, a.Stderr, b.Stdout, b.Stderr = &outA, &outA, &outB, &outB
		require.NoError(t, a.Start())
		require.NoError(t, b.Start())
		errA, errB := a.Wait(), b.Wait()
		passed(t, []byte(outA.String()), errA)
		passed(t, []byte(outB.String()), errB)

		var n int
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname LIKE 't\_%'`).Scan(&n))
		require.Zero(t, n, "the children dropped their databases")
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname LIKE 'fencelock\_template\_%' AND datistemplate`).Scan(&n))
		require.Equal(t, 1, n, "one template, built once")
	})

	t.Run("KeywordValue", func(t *testing.T) {
		kv := fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable", cfg.Host, cfg.Port)
		out, err := child(kv).CombinedOutput()
		passed(t, out, err)
	})

	t.Run("RoleWithoutCreatedb", func(t *testing.T) {
		u := strings.Replace(srv.URL("postgres"), "postgres@", "plain@", 1)
		out, err := child(u).CombinedOutput()
		require.Error(t, err, "the tests fail, they do not skip")
		require.Contains(t, string(out), `role "plain" cannot create databases`)
		require.NotContains(t, string(out), "--- SKIP")
	})
}
