package pgtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/migrations"
)

// Environment variables read by pgtest.
const (
	// EnvDatabaseURL names the variable holding the URL of an existing server for [NewDB]. The
	// role needs CREATEDB. [Start] and [NewServer] ignore it.
	EnvDatabaseURL = "FENCELOCK_TEST_DATABASE_URL"
	// EnvServer names the variable that forces how [Start] gets a server: "docker" or "local";
	// empty (the default) tries Docker first, then local binaries.
	EnvServer = "FENCELOCK_TEST_SERVER"
	// EnvPGBin names the variable holding the directory of the PostgreSQL server binaries
	// (initdb, postgres) to use for local servers.
	EnvPGBin = "PG_BIN"
)

// templateName is the migrated template database on servers pgtest starts itself.
const templateName = "fencelock_template"

// serverKind says where a Server runs.
type serverKind int

const (
	kindLocal     serverKind = iota + 1 // a child process from local binaries
	kindContainer                       // a testcontainers-go container
	kindExternal                        // the server of FENCELOCK_TEST_DATABASE_URL
)

func (k serverKind) String() string {
	switch k {
	case kindLocal:
		return "a local server"
	case kindContainer:
		return "a Docker container"
	case kindExternal:
		return "the existing server of " + EnvDatabaseURL
	}
	return "an unknown server"
}

// Server is a PostgreSQL server for tests: a child process started from local binaries, a
// Docker container, or (for [NewDB] only) the existing server named by
// FENCELOCK_TEST_DATABASE_URL. Its methods are safe for concurrent use.
type Server struct {
	kind serverKind
	// base is the URL of the maintenance database (URL form); nil when kv is used instead.
	base *url.URL
	// kv is an external keyword/value connection string ("host=... user=...").
	kv string
	// maintDB is the database administrative statements run in.
	maintDB string
	// tplName is the migrated template each CreateDatabase clones.
	tplName string

	local *localServer                  // kindLocal only
	ctr   *tcpostgres.PostgresContainer // kindContainer only
	// primary is the server this one is a hot standby of (see StartStandby); nil otherwise,
	// and nil again once [Server.Promote] has promoted it.
	primary atomic.Pointer[Server]

	tplMu    sync.Mutex // guards tplDone; held while the template is built
	tplDone  bool
	createMu sync.Mutex // serialises CREATE DATABASE ... TEMPLATE

	closeOnce sync.Once
	closeErr  error
	closed    atomic.Bool
}

// Start starts a fresh PostgreSQL server dedicated to the caller and returns once it accepts
// connections. It never uses FENCELOCK_TEST_DATABASE_URL. It tries, in order:
//
//  1. a Docker daemon, if one answers a ping within a few seconds (DOCKER_HOST, or a socket
//     at a default path): a postgres:15 container through testcontainers-go's postgres module;
//  2. local server binaries, from the directory in PG_BIN, else PATH, else the newest
//     /usr/lib/postgresql/<version>/bin (Debian) or /usr/pgsql-<version>/bin (RHEL): a
//     cluster in a fresh temp dir, copied from one initdb per process, listening on
//     127.0.0.1 and a free port. When run as root the server runs as user postgres (else
//     nobody), since initdb and postgres refuse to run as root.
//
// FENCELOCK_TEST_SERVER=docker or =local forces one path; [Crashable] forces local binaries. The caller must [Server.Close]
// the server; a local server is also killed (SIGKILL) if the process that started it dies.
// ctx bounds the start (an image pull included). Errors: invalid options, or every path's
// error, joined.
//
// Defaults: superuser postgres, trust authentication (local) or password postgres
// (container), settings fsync=off, full_page_writes=off, max_connections=300,
// shared_buffers=64MB, then [WithSetting] values.
func Start(ctx context.Context, opts ...Option) (*Server, error) {
	c, err := parseOptions(opts)
	if err != nil {
		return nil, err
	}
	settings := append(slices.Clone(defaultSettings), c.settings...)

	switch mode := os.Getenv(EnvServer); {
	case mode == "local", c.crashable && mode == "":
		return startLocal(ctx, settings, c.archive)
	case mode == "docker" && c.crashable:
		return nil, fmt.Errorf("pgtest: a Crashable server needs local binaries, but %s=docker", EnvServer)
	case mode == "docker":
		return startContainer(ctx, settings)
	case mode == "":
	default:
		return nil, fmt.Errorf("pgtest: %s=%q: want \"docker\", \"local\" or empty", EnvServer, mode)
	}

	dockerErr := dockerAvailable(ctx)
	if dockerErr == nil {
		s, err := startContainer(ctx, settings)
		if err == nil {
			return s, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		dockerErr = err
	}
	s, localErr := startLocal(ctx, settings, false)
	if localErr != nil {
		return nil, fmt.Errorf("pgtest: no PostgreSQL server could be started:\n\tdocker: %w\n\tlocal binaries: %w", dockerErr, localErr)
	}
	return s, nil
}

// URL returns a postgres:// URL of database on the server, as its superuser, with
// sslmode=disable (for the server of FENCELOCK_TEST_DATABASE_URL: that URL with its database
// replaced, in the same form). It does not check that the database exists.
func (s *Server) URL(database string) string {
	if s.base == nil {
		return s.kv + " dbname=" + quoteKeywordValue(database)
	}
	u := *s.base
	u.Path = "/" + database
	u.RawPath = ""
	return u.String()
}

// quoteKeywordValue quotes v for a keyword/value connection string.
func quoteKeywordValue(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}

// CanCrash reports whether [Server.Crash] and [Server.Restart] work on this server: true for
// a server started from local binaries, false for a container or an existing server.
func (s *Server) CanCrash() bool { return s.kind == kindLocal }

// Crash shuts the server down the way `pg_ctl stop -m immediate` does (SIGQUIT to the
// postmaster: no checkpoint, every backend killed, so the next start runs crash recovery) and
// returns once the postmaster has exited. Connections to the server fail from then on.
//
// Errors: one wrapping [errors.ErrUnsupported] unless [Server.CanCrash]; an error if the
// server is closed or not running; ctx's error if it ends first (the server may then still
// be going down).
func (s *Server) Crash(ctx context.Context) error {
	if s.kind != kindLocal {
		return fmt.Errorf("pgtest: Crash needs a server started from local binaries, this is %s: %w", s.kind, errors.ErrUnsupported)
	}
	return s.local.crash(ctx)
}

// Restart starts the server again on the same data directory, port and settings after
// [Server.Crash], so crash recovery runs, and returns once it accepts connections (at most
// one minute, less if ctx ends first). Existing pools reconnect on their own; connections
// they held before the crash are broken.
//
// Errors: one wrapping [errors.ErrUnsupported] unless [Server.CanCrash]; an error if the
// server is closed or still running; the start error with the tail of the server log.
func (s *Server) Restart(ctx context.Context) error {
	if s.kind != kindLocal {
		return fmt.Errorf("pgtest: Restart needs a server started from local binaries, this is %s: %w", s.kind, errors.ErrUnsupported)
	}
	return s.local.restart(ctx)
}

// Close stops the server and removes its data directory (local server) or terminates its
// container. For the server of FENCELOCK_TEST_DATABASE_URL it does nothing. It waits until
// the server process has exited. Close is idempotent: later calls return the first call's
// result.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		switch s.kind {
		case kindLocal:
			s.closed.Store(true)
			s.closeErr = s.local.close()
		case kindContainer:
			s.closed.Store(true)
			s.closeErr = closeContainer(s.ctr)
		}
	})
	return s.closeErr
}

// running reports whether the server is expected to accept connections: not closed, and
// (local) not crashed without a restart.
func (s *Server) running() bool {
	if s.closed.Load() {
		return false
	}
	return s.kind != kindLocal || s.local.isRunning()
}

// TerminateBackend terminates the backend with process ID pid (pgconn.PgConn.PID) through
// pg_terminate_backend, as a fault injection: the victim's connection breaks and its next
// statement fails. On PostgreSQL 14 and later it waits (at most 5 s) until the backend has
// exited. Errors: a connection or query error, or one saying pg_terminate_backend returned
// false (no such backend, or it did not exit in time).
func (s *Server) TerminateBackend(ctx context.Context, pid uint32) error {
	conn, err := s.connect(ctx, s.maintDB)
	if err != nil {
		return fmt.Errorf("pgtest: terminate backend %d: %w", pid, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	q := `SELECT pg_terminate_backend($1::integer, 5000)`
	if serverMajor(conn.PgConn()) < 14 {
		q = `SELECT pg_terminate_backend($1::integer)`
	}
	var ok bool
	if err := conn.QueryRow(ctx, q, int64(pid)).Scan(&ok); err != nil {
		return fmt.Errorf("pgtest: terminate backend %d: %w", pid, err)
	}
	if !ok {
		return fmt.Errorf("pgtest: terminate backend %d: pg_terminate_backend returned false (no such backend, or it did not exit within 5s)", pid)
	}
	return nil
}

// serverMajor returns the major version of the server behind conn, or 0 if unknown.
func serverMajor(conn *pgconn.PgConn) int {
	v := conn.ParameterStatus("server_version") // e.g. "15.4 (Debian 15.4-1)" or "16beta1"
	end := strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(v)
	}
	n, _ := strconv.Atoi(v[:end])
	return n
}

// connect opens a single connection to database on the server.
func (s *Server) connect(ctx context.Context, database string) (*pgx.Conn, error) {
	return pgx.Connect(ctx, s.URL(database))
}

// dbCounter numbers the databases CreateDatabase makes in this process.
var dbCounter atomic.Uint64

// CreateDatabase creates a fresh database with fencelock's schema and returns its name and
// URL. The first call on a server creates the template database (fencelock_template, on the
// server of FENCELOCK_TEST_DATABASE_URL fencelock_template_<hash of the migrations>) and runs
// [fencelock.Migrate] on it; every call then clones it with CREATE DATABASE ... TEMPLATE,
// which costs tens of milliseconds. Names are t_<counter>_<random hex>, unique across
// processes sharing a server. The caller owns the database; [Server.NewDB] drops it at test
// cleanup. Safe for concurrent use (clones on one Server are serialised).
//
// Errors: connection and SQL errors, wrapped; for a role without CREATEDB, an error that
// says so; on a hot standby ([Server.StartStandby]), an error saying to create the database
// on the primary.
func (s *Server) CreateDatabase(ctx context.Context) (name, url string, err error) {
	if s.primary.Load() != nil {
		return "", "", errors.New("pgtest: create database: this server is a read-only hot standby; create the database on its primary (then WaitReplay)")
	}
	if err := s.ensureTemplate(ctx); err != nil {
		return "", "", err
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	name = fmt.Sprintf("t_%d_%s", dbCounter.Add(1), hex.EncodeToString(b[:]))

	s.createMu.Lock()
	defer s.createMu.Unlock()
	conn, err := s.connect(ctx, s.maintDB)
	if err != nil {
		return "", "", fmt.Errorf("pgtest: create database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+quoteIdent(name)+" TEMPLATE "+quoteIdent(s.tplName)); err != nil {
		return "", "", s.createError(conn, "create database "+name, err)
	}
	return name, s.URL(name), nil
}

// createError wraps err from CREATE DATABASE, explaining a missing CREATEDB privilege.
func (s *Server) createError(conn *pgx.Conn, what string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
		return fmt.Errorf("pgtest: %s: role %q cannot create databases on %s; grant it CREATEDB (each test needs its own database): %w",
			what, conn.Config().User, s.kind, err)
	}
	return fmt.Errorf("pgtest: %s: %w", what, err)
}

// templateLockKey is the session advisory lock key (in the maintenance database) that
// serialises template builds of processes sharing a server: "pgtestpl" in ASCII.
const templateLockKey int64 = 0x7067746573747066

// ensureTemplate creates and migrates the template database once per Server. Processes that
// share a server serialise on an advisory lock; a template left half-built by a killed
// process (not yet marked IS_TEMPLATE) is dropped and rebuilt. The finished template refuses
// connections, so no session can block the clones.
func (s *Server) ensureTemplate(ctx context.Context) error {
	s.tplMu.Lock()
	defer s.tplMu.Unlock()
	if s.tplDone {
		return nil
	}
	conn, err := s.connect(ctx, s.maintDB)
	if err != nil {
		return fmt.Errorf("pgtest: template database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx)) // also releases the advisory lock
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, templateLockKey); err != nil {
		return fmt.Errorf("pgtest: template database: lock: %w", err)
	}
	var isTemplate bool
	err = conn.QueryRow(ctx, `SELECT datistemplate FROM pg_database WHERE datname = $1`, s.tplName).Scan(&isTemplate)
	switch {
	case err == nil && isTemplate:
		s.tplDone = true
		return nil
	case err == nil: // half-built by a process that died
		if _, err := conn.Exec(ctx, "DROP DATABASE "+quoteIdent(s.tplName)+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("pgtest: template database: drop unfinished %s: %w", s.tplName, err)
		}
	case !errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("pgtest: template database: %w", err)
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+quoteIdent(s.tplName)); err != nil {
		return s.createError(conn, "template database", err)
	}
	pool, err := pgxpool.New(ctx, s.URL(s.tplName))
	if err != nil {
		return fmt.Errorf("pgtest: template database: %w", err)
	}
	err = fencelock.Migrate(ctx, pool)
	pool.Close()
	if err != nil {
		return fmt.Errorf("pgtest: template database: %w", err)
	}
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+quoteIdent(s.tplName)+" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false"); err != nil {
		return fmt.Errorf("pgtest: template database: %w", err)
	}
	s.tplDone = true
	return nil
}

// dropDatabase drops database name, terminating its sessions (PostgreSQL 13 or later).
func (s *Server) dropDatabase(ctx context.Context, name string) error {
	conn, err := s.connect(ctx, s.maintDB)
	if err != nil {
		return fmt.Errorf("pgtest: drop database %s: %w", name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+quoteIdent(name)+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("pgtest: drop database %s: %w", name, err)
	}
	return nil
}

// quoteIdent quotes an SQL identifier.
func quoteIdent(name string) string { return pgx.Identifier{name}.Sanitize() }

// migrationsHash returns a short hash of fencelock's migration files, so that processes with
// different migrations never share a template on an existing server.
func migrationsHash() (string, error) {
	h := sha256.New()
	err := fs.WalkDir(migrations.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(migrations.FS, path)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", path, len(b))
		h.Write(b)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("pgtest: hash migrations: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}

// loopbackURL returns the URL of the postgres database at host:port as user.
func loopbackURL(host string, port int, user *url.Userinfo) *url.URL {
	return &url.URL{
		Scheme:   "postgres",
		User:     user,
		Host:     net.JoinHostPort(host, strconv.Itoa(port)),
		Path:     "/postgres",
		RawQuery: "sslmode=disable",
	}
}

// errExited says a child process (postgres, pgbouncer) exited while pgtest waited for it to
// accept connections.
var errExited = errors.New("exited while starting")

// waitAccepting polls url until a connection succeeds (and closes it), backing off from 5 ms
// to 100 ms between attempts. It gives up when ctx ends or timeout passes, returning the last
// connection error too, or (errExited) when exited is closed; a nil exited never is. what
// names the program listening at url in errors ("postgres", "pgbouncer").
func waitAccepting(ctx context.Context, what, url string, timeout time.Duration, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	delay := 5 * time.Millisecond
	for {
		attemptCtx, cancelAttempt := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgconn.Connect(attemptCtx, url)
		cancelAttempt()
		if err == nil {
			_ = conn.Close(ctx)
			return nil
		}
		timer := time.NewTimer(delay)
		select {
		case <-exited:
			timer.Stop()
			return fmt.Errorf("pgtest: %s %w", what, errExited)
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("pgtest: %s did not accept connections within %s: %w (last attempt: %w)", what, timeout, ctx.Err(), err)
		case <-timer.C:
		}
		delay = min(2*delay, 100*time.Millisecond)
	}
}
