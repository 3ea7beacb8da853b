package gooselock_test

import (
	"github.com/fencelock/fencelock/internal/pgserver"
	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
)

// The helpers of the locker's server tests (goose_locker_test.go): the package's names for
// those every test package shares (internal/testkit, internal/testkit/fencetest).

// bundle is what most server tests need: a fresh migrated database, its pool (b.Pool) and a
// context (b.Ctx) that ends at test cleanup or after two minutes (testkit.Bundle).
type bundle = testkit.Bundle[*pgserver.DB]

// setup returns a bundle on a fresh database of the shared server.
var setup = testkit.Setup

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
