package fencetest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// NewSemaphore returns semaphore name with limit on a lessor of its own on pool, with holder
// id holder and opts.
func NewSemaphore(t testing.TB, pool *pgxpool.Pool, holder, name string, limit int, opts ...fencelock.LessorOption) *fencelock.Semaphore {
	t.Helper()
	s, err := fencelock.NewSemaphore(NewLessor(t, pool, holder, opts...), name, limit)
	require.NoError(t, err)
	return s
}

// SemState reads s's state, failing the test on error.
func SemState(t testing.TB, ctx context.Context, s *fencelock.Semaphore) fencelock.SemaphoreState {
	t.Helper()
	st, err := s.State(ctx)
	require.NoError(t, err)
	return st
}

// WaitQueued waits until s has n live waiters, failing the test after 10 s.
func WaitQueued(t testing.TB, ctx context.Context, s *fencelock.Semaphore, n int64) {
	t.Helper()
	require.Eventually(t, func() bool { return SemState(t, ctx, s).Waiting == n }, 10*time.Second, 2*time.Millisecond)
}
