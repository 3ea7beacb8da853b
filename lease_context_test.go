package fencelock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// awaitCtx waits for ctx to end, failing the test when b's context ends first.
func awaitCtx(t *testing.T, b *bundle, ctx context.Context, what string) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-b.Ctx.Done():
		t.Fatalf("%s: the lease's context was never cancelled", what)
	}
}

// A lease's context ends with the lease, with the lease's error as its cause: at the end of the
// trust window (no heartbeat), at a renewal that finds the lease gone (released by force), and
// at Release. Its parent's end and its CancelFunc end it without ending the lease.
func TestLeaseContext(t *testing.T) {
	t.Parallel()
	b := setup(t)

	t.Run("TrustWindowEnds", func(t *testing.T) {
		l := newLessor(t, b.Pool, "ctx-trust", fencelock.WithoutHeartbeat())
		lease, err := l.TryAcquire(b.Ctx, "ctx:trust", time.Second)
		require.NoError(t, err)
		ctx, cancel := lease.Context(b.Ctx)
		defer cancel()
		awaitCtx(t, b, ctx, "trust window")
		require.False(t, time.Now().Before(lease.TrustedUntil()), "cancelled before the trust window ended")
		require.Error(t, lease.Err())
		require.ErrorIs(t, context.Cause(ctx), fencelock.ErrTrustWindowExpired)
		var lost *fencelock.LeaseLostError
		require.ErrorAs(t, context.Cause(ctx), &lost)
		require.Equal(t, lease.Token(), lost.Token)
	})

	t.Run("GoneOnServer", func(t *testing.T) {
		l := newLessor(t, b.Pool, "ctx-gone", fencelock.WithHeartbeatInterval(200*time.Millisecond))
		lease, err := l.TryAcquire(b.Ctx, "ctx:gone", 5*time.Second)
		require.NoError(t, err)
		ctx, cancel := lease.Context(b.Ctx)
		defer cancel()
		_, err = b.Pool.Exec(b.Ctx, `SELECT * FROM fencelock.force_release('ctx:gone', '{}')`)
		require.NoError(t, err)
		awaitCtx(t, b, ctx, "renewal verdict")
		require.ErrorIs(t, context.Cause(ctx), fencelock.ErrLeaseLost)
		require.NotErrorIs(t, context.Cause(ctx), fencelock.ErrTrustWindowExpired, "the renewal's verdict, well inside the 5 s TTL")
	})

	t.Run("Released", func(t *testing.T) {
		l := newLessor(t, b.Pool, "ctx-released")
		lease, err := l.TryAcquire(b.Ctx, "ctx:released", 5*time.Second)
		require.NoError(t, err)
		ctx, cancel := lease.Context(b.Ctx)
		defer cancel()
		other, cancelOther := lease.Context(b.Ctx)
		defer cancelOther()
		require.NoError(t, lease.Release(b.Ctx))
		// Cancelled by the call that ended the lease, before it returned: no wait.
		require.ErrorIs(t, context.Cause(ctx), fencelock.ErrReleased)
		require.ErrorIs(t, context.Cause(other), fencelock.ErrReleased)
		late, cancelLate := lease.Context(b.Ctx) // taken after the end: cancelled at once
		defer cancelLate()
		require.ErrorIs(t, context.Cause(late), fencelock.ErrReleased)
	})

	t.Run("ParentAndCancelFunc", func(t *testing.T) {
		l := newLessor(t, b.Pool, "ctx-parent")
		lease, err := l.TryAcquire(b.Ctx, "ctx:parent", 5*time.Second)
		require.NoError(t, err)
		parent, stopParent := context.WithCancelCause(b.Ctx)
		ctx, cancel := lease.Context(parent)
		defer cancel()
		stopParent(errors.New("shutting down"))
		awaitCtx(t, b, ctx, "parent")
		require.EqualError(t, context.Cause(ctx), "shutting down")
		own, cancelOwn := lease.Context(b.Ctx)
		cancelOwn()
		require.ErrorIs(t, context.Cause(own), context.Canceled)
		require.NoError(t, lease.Err(), "neither ends the lease")
		require.NoError(t, lease.Release(b.Ctx))
	})
}

// RunLeased runs fn under the lease and releases it when fn returns (the next waiter gets it at
// once); a loss cancels fn's context with the lease's error, and RunLeased reports it even
// when fn returns nil. TryRunLeased refuses without calling fn while the lease is held.
func TestRunLeased(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := newLessor(t, b.Pool, "run-a")
	o := newLessor(t, b.Pool, "run-b")

	var token fencelock.Token
	err := a.RunLeased(b.Ctx, "run:job", 5*time.Second, func(ctx context.Context, lease *fencelock.Lease) error {
		token = lease.Token()
		require.ErrorIs(t, o.TryRunLeased(b.Ctx, "run:job", time.Second, func(context.Context, *fencelock.Lease) error {
			t.Error("TryRunLeased ran fn while the lease was held")
			return nil
		}), fencelock.ErrNotAcquired)
		return pgx.BeginFunc(ctx, b.Pool, func(tx pgx.Tx) error { return lease.FenceTx(ctx, tx, "run:job") })
	})
	require.NoError(t, err)
	require.True(t, readLease(t, b.Ctx, b.Pool, "run:job").Expired, "released when fn returned")
	next, err := o.TryAcquire(b.Ctx, "run:job", time.Second)
	require.NoError(t, err)
	require.Greater(t, next.Token(), token)
	require.NoError(t, next.Release(b.Ctx))

	// fn's error is returned as is, after the release.
	boom := errors.New("boom")
	require.Equal(t, boom, a.RunLeased(b.Ctx, "run:job", 5*time.Second, func(context.Context, *fencelock.Lease) error { return boom }))
	require.True(t, readLease(t, b.Ctx, b.Pool, "run:job").Expired)

	// A loss mid-run: fn sees its context end with the lease's error and returns nil anyway;
	// RunLeased says the lease was lost. When fn returns ctx's error, as it usually does, both
	// are reported.
	z := newLessor(t, b.Pool, "run-z", fencelock.WithoutHeartbeat())
	err = z.RunLeased(b.Ctx, "run:lost", time.Second, func(ctx context.Context, _ *fencelock.Lease) error {
		<-ctx.Done()
		require.ErrorIs(t, context.Cause(ctx), fencelock.ErrLeaseLost)
		return nil
	})
	require.ErrorIs(t, err, fencelock.ErrLeaseLost)
	err = z.RunLeased(b.Ctx, "run:lost", time.Second, func(ctx context.Context, _ *fencelock.Lease) error {
		<-ctx.Done()
		return ctx.Err()
	})
	require.ErrorIs(t, err, fencelock.ErrLeaseLost)
	require.ErrorIs(t, err, context.Canceled)

	// A panic in fn releases the lease, and goes on.
	func() {
		defer func() { require.Equal(t, "boom", recover()) }()
		_ = a.RunLeased(b.Ctx, "run:panic", time.Minute, func(context.Context, *fencelock.Lease) error { panic("boom") })
	}()
	require.True(t, readLease(t, b.Ctx, b.Pool, "run:panic").Expired, "released after the panic")

	// Bad input, before any SQL.
	require.ErrorIs(t, a.RunLeased(b.Ctx, "run:job", time.Second, nil), fencelock.ErrInvalidArgument)
	require.ErrorIs(t, a.TryRunLeased(b.Ctx, "", time.Second, func(context.Context, *fencelock.Lease) error { return nil }), fencelock.ErrInvalidArgument)
}
