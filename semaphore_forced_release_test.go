package fencelock_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/forcedrelease"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
)

// TestForcedReleaseOfPermitGoesToTheHead: a forced release of a held permit (fencelock release
// --force, the live view's) gives it to the head of the semaphore's queue, as its holder's
// release does, and says so (handed_to, the new token, which the fences get); the old holder
// loses it. Before migration 00018, force_release looked only at the lease queue of the
// permit's name, which is empty: handed_to was NULL and the head waited for its own next look.
func TestForcedReleaseOfPermitGoesToTheHead(t *testing.T) {
	b, _, held := permitHeld(t, "sem-fr-a", "sem:fr", 1, time.Minute)
	ctx := b.Ctx
	waiter := newSemaphore(t, b, "sem-fr-b", "sem:fr", 1)
	ch := fencetest.PermitAsync(ctx, waiter, time.Minute)
	fencetest.WaitQueued(t, ctx, waiter, 1)

	var res forcedrelease.Result
	require.NoError(t, pgx.BeginFunc(ctx, b.Pool, func(tx pgx.Tx) error {
		var err error
		res, err = forcedrelease.Run(ctx, tx, held.Name(), []string{"fr:resource"}, nil)
		return err
	}))
	require.NotNil(t, res.HandedTo, "the forced release named nobody it went to")
	require.Equal(t, "sem-fr-b", *res.HandedTo)
	require.NotNil(t, res.NewToken)
	require.Greater(t, *res.NewToken, int64(held.Token()))

	got := fencetest.Receive(t, ch, 10*time.Second)
	require.NoError(t, got.Err)
	require.Equal(t, held.Name(), got.Lease.Name())
	require.Equal(t, fencelock.Token(*res.NewToken), got.Lease.Token(), "the head holds the permit the release gave it")
	require.Equal(t, *res.NewToken, fenceOf(t, b, "fr:resource"))
	require.ErrorIs(t, held.Renew(ctx), fencelock.ErrLeaseLost, "the old holder lost it")
	require.NoError(t, got.Lease.Release(ctx))
}

// fenceOf returns the high-water mark of resource.
func fenceOf(t *testing.T, b *bundle, resource string) int64 {
	t.Helper()
	var tok int64
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT token FROM fencelock.fences WHERE resource = $1`, resource).Scan(&tok))
	return tok
}
