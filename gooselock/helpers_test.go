package gooselock_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/internal/pgserver"
	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
)

// The helpers of the locker's server tests (goose_locker_test.go): the package's names for
// those every test package shares (internal/testkit, internal/testkit/fencetest).

// bundle is what a server test needs: a fresh migrated database and a context bounded so that
// a hung test fails instead of stalling the suite.
type bundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
	db   *pgserver.DB
}

// setup returns a bundle on a fresh database of the shared server of TestMain (main_test.go),
// its context ending at test cleanup or after two minutes.
func setup(t *testing.T) *bundle {
	t.Helper()
	db := pgserver.NewDB(t)
	return &bundle{ctx: testkit.Context(t), pool: db.Pool, db: db}
}

// newPool returns a pool on url, closed at test cleanup; newLessor returns a lessor on a pool
// with a holder id and options, failing the test on error.
var (
	newPool   = testkit.NewPool
	newLessor = fencetest.NewLessor
)

// queued is one row of the view fencelock.lease_queue: readQueue returns the live waiters of
// a lease, awaitQueue waits until they are exactly the holders given, and watchQueue records
// the longest queue of a lease until stopped.
type queued = testkit.Queued

var (
	readQueue  = testkit.ReadQueue
	awaitQueue = testkit.AwaitQueue
	watchQueue = testkit.WatchQueue
)
