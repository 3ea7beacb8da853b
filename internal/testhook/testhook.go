// Package testhook lets fencelock's test modules (internal/integration, internal/chaos) reach
// the few internals a test must drive from outside: the root package sets these functions when
// it is initialised (testhook.go at the root). They are not part of the API; nothing but tests
// calls them. Each takes the root package's type as any, since this package cannot import it.
package testhook

import "context"

var (
	// ExecOnSession runs sql on the session that holds lock (a *fencelock.AdvisoryLock), for
	// tests that must break a session's state from inside (pg_advisory_unlock_all, say).
	ExecOnSession func(ctx context.Context, lock any, sql string) error
	// SetAfterGrant makes lessor (a *fencelock.Lessor) run f after each grant statement
	// returns, before its reply is used: tests use it to make a reply arrive late.
	SetAfterGrant func(lessor any, f func())
	// EndAbandonedGrant runs lessor's cleanup of a grant abandoned on the backend with pid.
	EndAbandonedGrant func(ctx context.Context, lessor any, pid uint32) error
	// Wakeups returns how many NOTIFYs this process's lease releases have sent (one per
	// hand-off to a listening waiter).
	Wakeups func() int64
)
