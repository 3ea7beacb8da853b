package fencelock

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/pgserver"
	"github.com/fencelock/fencelock/internal/testkit"
)

// The helpers of the internal tests (package fencelock), which drive what the public API does
// not reach: a grant's reply made late, the cleanup of an abandoned grant, a held session, the
// count of wake-ups. Those that need no library are internal/testkit's, shared with every test
// package; internal/testkit/fencetest, which imports the library, is out of these files' reach,
// so what they need of it is here, on the package's own names. The server is the shared one
// of pgserver.Main, which the package's TestMain (main_test.go) runs for both.

// bundle is what most server tests need: a fresh migrated database, its pool (b.Pool) and a
// context (b.Ctx) that ends at test cleanup or after two minutes (testkit.Bundle).
type bundle = testkit.Bundle[*pgserver.DB]

// setup returns a bundle on a fresh database of the shared server.
var setup = testkit.Setup

// testLessor returns a lessor on pool with holder id holder and opts, failing the test on
// error. (newLessor, its name in the external tests, is the package's constructor here.)
func testLessor(t *testing.T, pool *pgxpool.Pool, holder string, opts ...LessorOption) *Lessor {
	t.Helper()
	l, err := NewLessor(pool, append([]LessorOption{WithHolder(holder)}, opts...)...)
	require.NoError(t, err)
	return l
}

// newPool returns a pool on url, closed at test cleanup.
var newPool = testkit.NewPool

// leaseExpired reports whether the row of lease name has expired, failing the test if there
// is none.
func leaseExpired(t *testing.T, ctx context.Context, pool *pgxpool.Pool, name string) bool {
	t.Helper()
	return testkit.ReadLease(t, ctx, pool, name).Expired
}

// acquired is the result of an Acquire run by acquireAsync.
type acquired struct {
	lease *Lease
	err   error
}

// acquireAsync runs l.Acquire in a goroutine; the result arrives on the channel.
func acquireAsync(ctx context.Context, l *Lessor, name string, ttl time.Duration) <-chan acquired {
	return testkit.Async(func() acquired {
		lease, err := l.Acquire(ctx, name, ttl)
		return acquired{lease, err}
	})
}

// receive waits for an acquire's result, failing the test after limit.
func receive(t *testing.T, ch <-chan acquired, limit time.Duration) acquired {
	t.Helper()
	return testkit.Receive(t, ch, limit, "grant")
}

// queued is one row of the view fencelock.lease_queue; awaitQueue waits until the queue of a
// lease is exactly the holders given, in that order (and, with notify, each of them woken by
// NOTIFY rather than polling), failing the test after 10 s.
type queued = testkit.Queued

var awaitQueue = testkit.AwaitQueue
