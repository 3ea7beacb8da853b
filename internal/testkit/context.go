package testkit

import (
	"context"
	"testing"
	"time"
)

// Timeout bounds the context of [Context]: a hung test fails instead of stalling the suite.
const Timeout = 2 * time.Minute

// Context returns a context that ends at test cleanup or after [Timeout], whichever comes
// first.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	t.Cleanup(cancel)
	return ctx
}

// EndedContext returns a copy of parent that has already ended, as a caller's context has when
// its deadline passed or its request was cancelled just before a release.
func EndedContext(parent context.Context) context.Context {
	ctx, cancel := context.WithCancel(parent)
	cancel()
	return ctx
}
