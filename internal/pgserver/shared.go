package pgserver

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// EnvDatabaseURL names the variable holding the URL (or keyword/value string) of an existing
// server for [NewDB]; the role needs CREATEDB. When it is empty, [NewDB] starts a local server.
const EnvDatabaseURL = "FENCELOCK_TEST_DATABASE_URL"

const (
	// serverStartTimeout bounds starting the shared server.
	serverStartTimeout = 5 * time.Minute
	// dbTimeout bounds creating (the first time: migrating the template too) or dropping a
	// test database.
	dbTimeout = 2 * time.Minute
	// skipReason is what NewDB passes to t.Skip under go test -short.
	skipReason = "needs PostgreSQL"
)

// shared is the process-wide server of NewDB: started (or, for FENCELOCK_TEST_DATABASE_URL,
// set up) by the first NewDB, stopped by Main.
var shared struct {
	mu      sync.Mutex
	migrate MigrateFunc // set by Main
	local   *Local      // nil for the server of FENCELOCK_TEST_DATABASE_URL
	addr    Addr
	cloner  *Cloner
	err     error
	done    bool // local, cloner and err are final
}

// mainRunning is true while Main runs the tests.
var mainRunning atomic.Bool

// DB is a fresh database with fencelock's schema, for one test or example.
type DB struct {
	// Pool is a pgxpool (default settings) connected to the database. [DB.Close] closes it.
	Pool *pgxpool.Pool
	// URL is the database's connection string, for extra pools and connections.
	URL string
	// Name is the database's name (t_<counter>_<random hex>).
	Name string
}

// Main runs the tests of m with migrate building the template database, then stops the
// shared server of [NewDB] and removes the cluster local servers are copied from, then exits
// with m's code (1 if the tests passed but the stopping failed, the error printed to stderr).
// Call it from TestMain:
//
//	func TestMain(m *testing.M) { pgserver.Main(m, fencelock.Migrate) }
//
// With go test -short it skips the package's examples (see [SkipExamplesIfShort]).
func Main(m *testing.M, migrate MigrateFunc) {
	if err := SkipExamplesIfShort(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	shared.mu.Lock()
	shared.migrate = migrate
	shared.mu.Unlock()
	mainRunning.Store(true)
	_ = HoldPristine(true)
	code := m.Run()
	mainRunning.Store(false)

	var errs []error
	shared.mu.Lock()
	if shared.local != nil {
		errs = append(errs, shared.local.Close())
	}
	shared.local, shared.cloner, shared.done = nil, nil, true
	shared.err = errors.New("pgserver: the shared server is stopped: Main has returned")
	shared.mu.Unlock()
	errs = append(errs, HoldPristine(false))
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// sharedCloner returns the Cloner of the shared server, getting the server on the first
// call: the server of FENCELOCK_TEST_DATABASE_URL if it is set, else a local one
// ([StartLocal] with [DefaultSettings]).
func sharedCloner() (*Cloner, Addr, error) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.done {
		return shared.cloner, shared.addr, shared.err
	}
	if !mainRunning.Load() {
		return nil, Addr{}, errors.New("pgserver: NewDB needs the package's TestMain to call pgserver.Main(m, fencelock.Migrate)")
	}
	shared.done = true
	if raw := os.Getenv(EnvDatabaseURL); raw != "" {
		addr, maintDB, err := ParseAddr(raw)
		if err != nil {
			shared.err = fmt.Errorf("pgserver: %s: %w", EnvDatabaseURL, err)
			return nil, Addr{}, shared.err
		}
		hash, err := MigrationsHash()
		if err != nil {
			shared.err = err
			return nil, Addr{}, err
		}
		shared.addr = addr
		shared.cloner = NewCloner(addr, maintDB, TemplateName+"_"+hash, "the existing server of "+EnvDatabaseURL, shared.migrate)
		return shared.cloner, shared.addr, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), serverStartTimeout)
	defer cancel()
	l, base, err := StartLocal(ctx, slices.Clone(DefaultSettings), false)
	if err != nil {
		shared.err = fmt.Errorf("%w\n(or set %s to use an existing server)", err, EnvDatabaseURL)
		return nil, Addr{}, shared.err
	}
	shared.local, shared.addr = l, Addr{Base: base}
	shared.cloner = NewCloner(shared.addr, "postgres", TemplateName, "a local server", shared.migrate)
	return shared.cloner, shared.addr, nil
}

// Open returns a fresh database, cloned from the migrated template, on the process-wide
// shared server (see [NewDB]), for code without a testing.TB (an example); the caller must
// [DB.Close] it. ctx bounds getting the server (the first call) and the clone. Safe for
// concurrent use. Errors: no server, or the database cannot be created.
func Open(ctx context.Context) (*DB, error) {
	c, addr, err := sharedCloner()
	if err != nil {
		return nil, err
	}
	name, err := c.CreateDatabase(ctx)
	if err != nil {
		return nil, err
	}
	db := &DB{URL: addr.URL(name), Name: name}
	// pgxpool.New ignores its context's deadline and, with default settings, connects to
	// nothing yet.
	if db.Pool, err = pgxpool.New(context.Background(), db.URL); err != nil {
		return nil, errors.Join(fmt.Errorf("pgserver: pool for %s: %w", name, err), db.Close())
	}
	return db, nil
}

// ExamplePool is [Open] for an Example function, which has no testing.TB: it returns the
// fresh database's pool and a func that closes it and drops the database, and ends the
// process with log.Fatal when either fails (an example's output check cannot report an
// error). Safe for concurrent use.
func ExamplePool(ctx context.Context) (pool *pgxpool.Pool, stop func()) {
	db, err := Open(ctx)
	if err != nil {
		log.Fatal(err)
	}
	return db.Pool, func() {
		if err := db.Close(); err != nil {
			log.Fatal(err)
		}
	}
}

// Close closes the database's pool and drops the database (WITH (FORCE)), within two
// minutes. Errors: the drop's.
func (db *DB) Close() error {
	if db.Pool != nil {
		db.Pool.Close()
	}
	c, _, err := sharedCloner()
	if err != nil {
		return nil // the shared server is gone, and its databases with it
	}
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	return c.DropDatabase(ctx, db.Name)
}

// NewDB returns a fresh database, cloned from the migrated template, on the process-wide
// shared server: the server of FENCELOCK_TEST_DATABASE_URL if it is set, else one local
// server started at the first call and stopped by [Main] (so TestMain must call Main). The
// database is dropped at test cleanup. Safe to call from parallel tests.
//
// With go test -short it calls t.Skip("needs PostgreSQL"). Otherwise it never skips: when no
// server can be had, or the database cannot be created, it fails the test with t.Fatal and
// the reason.
func NewDB(t testing.TB) *DB {
	t.Helper()
	if testing.Short() {
		t.Skip(skipReason)
	}
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	db, err := Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	})
	return db
}

// SkipExamplesIfShort adds ^Example to the -test.skip pattern under -short, keeping the
// user's own pattern, since an example cannot call t.Skip and one that needs PostgreSQL would
// fail where none can be started. A pattern with a slash is left alone (go test splits it
// per level of subtest), with a note on stderr. It parses the flags if they are not yet.
// Errors: the flag cannot be set.
func SkipExamplesIfShort() error {
	if !flag.Parsed() {
		flag.Parse()
	}
	if !testing.Short() {
		return nil
	}
	pattern := "^Example"
	if f := flag.Lookup("test.skip"); f != nil && f.Value.String() != "" {
		if strings.Contains(f.Value.String(), "/") {
			// go test splits -skip at slashes into one pattern per level of subtest: an
			// alternative appended to the last level would not match examples, and one
			// put in the first would change what the user's pattern skips.
			fmt.Fprintln(os.Stderr, "pgserver: -short with a -skip pattern that has a slash: the examples are not skipped; add ^Example to it")
			return nil
		}
		pattern = f.Value.String() + "|" + pattern
	}
	if err := flag.Set("test.skip", pattern); err != nil {
		return fmt.Errorf("pgserver: skip examples under -short: %w", err)
	}
	fmt.Fprintln(os.Stderr, "pgserver: -short: skipping the examples, which need PostgreSQL")
	return nil
}
