package fencetest

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// NewLocker returns an advisory locker on pool with opts, failing the test on error.
func NewLocker(t testing.TB, pool *pgxpool.Pool, opts ...fencelock.AdvisoryOption) *fencelock.AdvisoryLocker {
	t.Helper()
	a, err := fencelock.NewAdvisoryLocker(pool, opts...)
	require.NoError(t, err)
	return a
}

// KeyOf returns the int64 advisory lock key that a derives for name, failing the test if a
// derives a pair of int32 keys.
func KeyOf(t testing.TB, a *fencelock.AdvisoryLocker, name string) int64 {
	t.Helper()
	k, err := a.Key(name)
	require.NoError(t, err)
	v, ok := k.Int64()
	require.True(t, ok)
	return v
}
