package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencelock/fencelock/internal/pgserver"
)

// PgBouncer is a PgBouncer process in front of a [Server], for tests of code that must work
// behind a connection pooler. Start one with [StartPgBouncer] or [NewPgBouncer]. Its methods
// are safe for concurrent use.
//
// Clients connect as user postgres (the only user it knows), without a password and without
// TLS; PgBouncer logs in to the server as the server's own user. In transaction and statement
// pool modes, a PgBouncer older than 1.21 does not track protocol-level prepared statements:
// pgx clients must then use [github.com/jackc/pgx/v5.QueryExecModeExec] or
// [github.com/jackc/pgx/v5.QueryExecModeSimpleProtocol] as their DefaultQueryExecMode (pgx's
// default, QueryExecModeCacheStatement, would find its cached statements missing on another
// server connection). From 1.21 on, pgtest sets max_prepared_statements and any mode works;
// [PgBouncer.PreparedStatements] tells which case applies.
//
// PgBouncer reports a pid in its BackendKeyData of its own making, so
// [github.com/jackc/pgx/v5/pgconn.PgConn.PID] of a client connection is not the pid of the
// server backend (SELECT pg_backend_pid()), in any pool mode.
type PgBouncer struct {
	base     *url.URL // the postgres database through PgBouncer
	version  string   // first line of pgbouncer --version, e.g. "PgBouncer 1.18.0"
	prepared bool     // max_prepared_statements is set
	dir      string   // temp dir: pgbouncer.ini, userlist.txt, pgbouncer.log, stderr.log
	proc     *pgserver.Run

	closeOnce sync.Once
	closeErr  error
}

// poolModes are the pool_mode values of PgBouncer.
var poolModes = []string{"session", "transaction", "statement"}

// pgbouncerPreparedSince is the first PgBouncer version with max_prepared_statements.
var pgbouncerPreparedSince = [2]int{1, 21}

// StartPgBouncer starts PgBouncer in front of s with pool_mode poolMode ("session",
// "transaction" or "statement") and returns it once a connection through it to s's
// maintenance database succeeds (at most one minute, less if ctx ends first). The caller must
// [PgBouncer.Close] it; on Linux it is also killed (SIGKILL) if the test binary dies. The
// binary is pgbouncer from PATH, else /usr/sbin/pgbouncer (Debian's package); as root it runs
// as user postgres (or nobody), like local servers, since PgBouncer refuses to run as root.
//
// Defaults: a config in a fresh temp dir; listen_addr 127.0.0.1 on a free port; no Unix
// socket; auth_type trust with an auth_file listing user postgres; one wildcard database entry
// (* = host, port, user and password of s, from [Server.URL]); max_client_conn 200;
// default_pool_size 20; server_login_retry 1 s (so that it reconnects soon after
// [Server.Restart]); ignore_startup_parameters extra_float_digits,options; logfile in the temp
// dir; max_prepared_statements 200 from PgBouncer 1.21 on.
//
// Errors: an invalid poolMode or a nil s, before anything starts; one saying to
// `apt-get install pgbouncer` when no binary is found; an error when s's host, user or
// password contain spaces, quotes or backslashes; the start error with the tail of
// PgBouncer's log. Safe for concurrent use.
func StartPgBouncer(ctx context.Context, s *Server, poolMode string) (*PgBouncer, error) {
	if !slices.Contains(poolModes, poolMode) {
		return nil, fmt.Errorf("pgtest: pgbouncer: pool mode %q: want %q", poolMode, poolModes)
	}
	if s == nil {
		return nil, errors.New("pgtest: pgbouncer: nil Server")
	}
	target, err := pgbouncerTarget(s)
	if err != nil {
		return nil, err
	}
	bin, err := findPgBouncer()
	if err != nil {
		return nil, err
	}
	return launchPgBouncer(ctx, bin, target, poolMode, s.maintDB)
}

// pgbouncerTarget returns the libpq-style connection string of s (host, port, user and
// password) for PgBouncer's [databases] section.
func pgbouncerTarget(s *Server) (string, error) {
	cfg, err := pgconn.ParseConfig(s.URL(s.maintDB))
	if err != nil {
		return "", fmt.Errorf("pgtest: pgbouncer: server address: %w", err)
	}
	target := []string{"host=" + cfg.Host, "port=" + strconv.Itoa(int(cfg.Port)), "user=" + cfg.User}
	if cfg.Password != "" {
		target = append(target, "password="+cfg.Password)
	}
	for _, kv := range target {
		if strings.ContainsAny(kv, " \t\r\n'\"\\") {
			return "", fmt.Errorf("pgtest: pgbouncer: server's %s contains spaces, quotes or backslashes", strings.SplitN(kv, "=", 2)[0])
		}
	}
	return strings.Join(target, " "), nil
}

// pgbouncerConfig returns the text of pgbouncer.ini for a PgBouncer whose files are in dir.
func pgbouncerConfig(dir string, port int, target, poolMode string, prepared bool) string {
	var b strings.Builder
	b.WriteString("[pgbouncer]\n")
	fmt.Fprintf(&b, "logfile = %s\n", filepath.Join(dir, "pgbouncer.log")) // first: errors after it go there
	b.WriteString("listen_addr = 127.0.0.1\n")
	fmt.Fprintf(&b, "listen_port = %d\n", port)
	b.WriteString("unix_socket_dir =\n")
	b.WriteString("auth_type = trust\n")
	fmt.Fprintf(&b, "auth_file = %s\n", filepath.Join(dir, "userlist.txt"))
	fmt.Fprintf(&b, "pool_mode = %s\n", poolMode)
	b.WriteString("max_client_conn = 200\n")
	b.WriteString("default_pool_size = 20\n")
	b.WriteString("server_login_retry = 1\n")
	b.WriteString("ignore_startup_parameters = extra_float_digits,options\n")
	if prepared {
		b.WriteString("max_prepared_statements = 200\n")
	}
	b.WriteString("\n[databases]\n")
	fmt.Fprintf(&b, "* = %s\n", target)
	return b.String()
}

// pgbouncerUserlist is the auth_file: user postgres, no password (auth_type trust).
const pgbouncerUserlist = `"postgres" ""` + "\n"

// parsePgBouncerVersion returns the first line of `pgbouncer --version` output ("PgBouncer
// 1.18.0") and whether that version has max_prepared_statements.
func parsePgBouncerVersion(out string) (version string, prepared bool) {
	version, _, _ = strings.Cut(strings.TrimSpace(out), "\n")
	version = strings.TrimSpace(version)
	fields := strings.Fields(version)
	if len(fields) == 0 {
		return version, false
	}
	parts := strings.SplitN(fields[len(fields)-1], ".", 3)
	if len(parts) < 2 {
		return version, false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return version, false
	}
	since := pgbouncerPreparedSince
	return version, major > since[0] || major == since[0] && minor >= since[1]
}

// URL returns a postgres:// URL of database through PgBouncer, as user postgres, with
// sslmode=disable. It does not check that the database exists.
func (p *PgBouncer) URL(database string) string {
	u := *p.base
	u.Path = "/" + database
	u.RawPath = ""
	return u.String()
}

// Version returns the first line of `pgbouncer --version`, for example "PgBouncer 1.18.0".
func (p *PgBouncer) Version() string { return p.version }

// PreparedStatements reports whether PgBouncer tracks protocol-level prepared statements in
// transaction and statement pool modes (version 1.21 or later, max_prepared_statements set),
// so that pgx's default QueryExecModeCacheStatement works through it.
func (p *PgBouncer) PreparedStatements() bool { return p.prepared }

// Close kills PgBouncer (SIGKILL: it holds no state worth a clean shutdown, and its
// graceful signals wait for clients), waits until it has exited and removes its temp dir.
// Client connections through it break. Close is idempotent: later calls return the first
// call's result.
func (p *PgBouncer) Close() error {
	p.closeOnce.Do(func() { p.closeErr = p.close() })
	return p.closeErr
}

// NewPgBouncer starts PgBouncer in front of s with [StartPgBouncer] and closes it at test
// cleanup.
//
// With go test -short it calls t.Skip("needs PostgreSQL"). A missing pgbouncer binary skips
// the test with a message saying to `apt-get install pgbouncer`, or, under CI ([InCI]), fails
// it; any other start error fails it with t.Fatal.
func NewPgBouncer(t testing.TB, s *Server, poolMode string) *PgBouncer {
	t.Helper()
	if testing.Short() {
		t.Skip(skipReason)
	}
	NeedPgBouncer(t)
	return startOrSkip(t, serverStartTimeout, func(ctx context.Context) (*PgBouncer, error) {
		return StartPgBouncer(ctx, s, poolMode)
	}, (*PgBouncer).Close)
}
