package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/internal/pgserver"
)

const (
	// serverStartTimeout bounds starting a server for a test, an image pull included.
	serverStartTimeout = 5 * time.Minute
	// dbTimeout bounds creating (the first time: migrating the template too) or dropping a
	// test database.
	dbTimeout = 2 * time.Minute
	// skipReason is what every constructor passes to t.Skip under go test -short.
	skipReason = "needs PostgreSQL"
)

// startOrSkip is the body of the constructors that give a test something started and stop
// it at test cleanup ([NewServer], [Server.NewStandby], [NewPgBouncer], [NewPatroni], and
// the databases of [Server.NewDB] and [PatroniCluster.NewDB]). With go test -short it calls
// t.Skip(skipReason). Otherwise it calls start with a context that ends after timeout, fails
// the test with t.Fatal(err) if start returns an error, and else registers a cleanup that
// calls stop on start's result and reports stop's error with t.Error. Cleanups run last
// registered first, so what a test starts later (a standby, a database) is stopped before
// what it started earlier (the server).
func startOrSkip[T any](t testing.TB, timeout time.Duration, start func(ctx context.Context) (T, error), stop func(T) error) T {
	t.Helper()
	if testing.Short() {
		t.Skip(skipReason)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	v, err := start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stop(v); err != nil {
			t.Error(err)
		}
	})
	return v
}

// newDB is [Server.NewDB] and [PatroniCluster.NewDB]: with [startOrSkip] and [dbTimeout], it
// makes a database with create, and at test cleanup closes the DB's pool and, unless gone
// reports the server or cluster gone, drops the database with drop (a fresh dbTimeout
// context). Then it opens the pool, failing the test with t.Fatalf if it cannot (the cleanup
// still drops the database). srv becomes the DB's Server.
func newDB(t testing.TB, srv *Server, create func(ctx context.Context) (name, url string, err error), gone func() bool, drop func(ctx context.Context, name string) error) *DB {
	t.Helper()
	db := startOrSkip(t, dbTimeout, func(ctx context.Context) (*DB, error) {
		name, url, err := create(ctx)
		return &DB{URL: url, Name: name, Server: srv}, err
	}, func(db *DB) error {
		if db.Pool != nil {
			db.Pool.Close()
		}
		if gone() {
			return nil // nothing to drop: the server and its data are gone or down
		}
		ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
		defer cancel()
		return drop(ctx, db.Name)
	})
	// pgxpool.New ignores its context's deadline and, with default settings, connects to
	// nothing yet.
	var err error
	if db.Pool, err = pgxpool.New(context.Background(), db.URL); err != nil {
		t.Fatalf("pgtest: pool for %s: %v", db.Name, err)
	}
	return db
}

// DB is a fresh database with fencelock's schema, for one test.
type DB struct {
	// Pool is a pgxpool (default settings) connected to the database. It is closed at test
	// cleanup, before the database is dropped.
	Pool *pgxpool.Pool
	// URL is the database's connection string, for child processes and extra pools.
	URL string
	// Name is the database's name (t_<counter>_<random hex>).
	Name string
	// Server is the server the database lives on.
	Server *Server
}

// shared is the process-wide server of NewDB: started (or, for FENCELOCK_TEST_DATABASE_URL,
// set up) by the first NewDB, stopped by Main.
var shared struct {
	mu   sync.Mutex
	srv  *Server
	err  error
	done bool // srv and err are final
}

// mainRunning is true while Main runs the tests.
var mainRunning atomic.Bool

// NewDB returns a fresh database, cloned from the migrated template, on the process-wide
// shared server: the server of FENCELOCK_TEST_DATABASE_URL if it is set, else one server
// started by [Start] at the first call and stopped by [Main] (so TestMain must call Main).
// The database is dropped (WITH (FORCE)) at test cleanup. Safe to call from parallel tests.
//
// With go test -short it calls t.Skip("needs PostgreSQL"). Otherwise it never skips: when no
// server can be had, or the database cannot be created, it fails the test with t.Fatal and
// the reason (the shared server's start error is reported to every test that needs it).
func NewDB(t testing.TB) *DB {
	t.Helper()
	if testing.Short() {
		t.Skip(skipReason)
	}
	s, err := sharedServer()
	if err != nil {
		t.Fatal(err)
	}
	return s.NewDB(t)
}

// sharedServer returns the shared server, getting it on the first call.
func sharedServer() (*Server, error) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.done {
		return shared.srv, shared.err
	}
	if raw := os.Getenv(EnvDatabaseURL); raw != "" {
		shared.srv, shared.err = newExternal(raw)
	} else {
		if !mainRunning.Load() {
			return nil, errors.New("pgtest: NewDB needs the package's TestMain to call pgtest.Main(m), which stops the shared server after the tests")
		}
		ctx, cancel := context.WithTimeout(context.Background(), serverStartTimeout)
		defer cancel()
		shared.srv, shared.err = Start(ctx)
		if shared.err != nil {
			shared.err = fmt.Errorf("%w\n(or set %s to use an existing server)", shared.err, EnvDatabaseURL)
		}
	}
	shared.done = true
	return shared.srv, shared.err
}

// NewServer starts a server dedicated to the calling test, with [Start] and opts, and closes
// it at test cleanup. A fault test may crash and restart it (see [Server.CanCrash]). Databases
// made on it with [Server.NewDB] are dropped before it closes.
//
// With go test -short it calls t.Skip("needs PostgreSQL"); otherwise a start error (invalid
// options included) fails the test with t.Fatal.
func NewServer(t testing.TB, opts ...Option) *Server {
	t.Helper()
	return startOrSkip(t, serverStartTimeout, func(ctx context.Context) (*Server, error) {
		return Start(ctx, opts...)
	}, (*Server).Close)
}

// NewDB returns a fresh database on s, cloned from the migrated template (see
// [Server.CreateDatabase]). At test cleanup it closes the pool and drops the database, unless
// the server is closed or crashed by then. Safe to call from parallel tests.
//
// With go test -short it calls t.Skip("needs PostgreSQL"); otherwise an error fails the test
// with t.Fatal.
func (s *Server) NewDB(t testing.TB) *DB {
	t.Helper()
	return newDB(t, s, s.CreateDatabase, func() bool { return !s.running() }, s.dropDatabase)
}

// Main runs the tests of m, then stops the shared server of [NewDB] and removes the cluster
// local servers are copied from, then exits with m's code (1 if the tests passed but the
// stopping failed, the error printed to stderr). Call it from TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// With go test -short it skips the package's examples (it adds ^Example to -skip, see
// [pgserver.SkipExamplesIfShort]): an example cannot call t.Skip, and one that needs
// PostgreSQL would fail where none can be started.
func Main(m *testing.M) {
	if err := pgserver.SkipExamplesIfShort(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	mainRunning.Store(true)
	_ = pgserver.HoldPristine(true)
	code := m.Run()
	mainRunning.Store(false)

	var errs []error
	shared.mu.Lock()
	if shared.srv != nil {
		errs = append(errs, shared.srv.Close())
	}
	shared.srv, shared.err, shared.done = nil, errors.New("pgtest: the shared server is stopped: Main has returned"), true
	shared.mu.Unlock()
	errs = append(errs, pgserver.HoldPristine(false))
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}
