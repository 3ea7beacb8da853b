package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/fencelock/fencelock"

	"github.com/fencelock/fencelock/internal/pgserver"
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
	EnvPGBin = pgserver.EnvPGBin
)

// templateName is the migrated template database on servers pgtest starts itself.
const templateName = pgserver.TemplateName

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

	local *pgserver.Local               // kindLocal only
	ctr   *tcpostgres.PostgresContainer // kindContainer only
	// primary is the server this one is a hot standby of (see StartStandby); nil otherwise,
	// and nil again once [Server.Promote] has promoted it.
	primary atomic.Pointer[Server]

	clonerOnce sync.Once
	cloner     *pgserver.Cloner // makes the databases of CreateDatabase; see clones

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
	return pgserver.Addr{Base: s.base, KV: s.kv}.URL(database)
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
	return s.local.Crash(ctx)
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
	return s.local.Restart(ctx)
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
			s.closeErr = s.local.Close()
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
	return s.kind != kindLocal || s.local.IsRunning()
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
	if name, err = s.clones().CreateDatabase(ctx); err != nil {
		return "", "", err
	}
	return name, s.URL(name), nil
}

// clones returns the Cloner of the server's databases, made at the first call.
func (s *Server) clones() *pgserver.Cloner {
	s.clonerOnce.Do(func() {
		s.cloner = pgserver.NewCloner(pgserver.Addr{Base: s.base, KV: s.kv}, s.maintDB, s.tplName, s.kind.String(), fencelock.Migrate)
	})
	return s.cloner
}

// dropDatabase drops database name, terminating its sessions (PostgreSQL 13 or later).
func (s *Server) dropDatabase(ctx context.Context, name string) error {
	return s.clones().DropDatabase(ctx, name)
}
