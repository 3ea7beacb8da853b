package fencelock

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// LeaseFunc is the work [Lessor.RunLeased] runs under a lease: ctx is the lease's context
// ([Lease.Context]), cancelled with the lease's error as its cause the moment the lease is
// lost; lease gives the fencing token for the writes ([Lease.FenceTx], [Lease.Token]).
type LeaseFunc func(ctx context.Context, lease *Lease) error

// releaseTimeout bounds the release that ends a RunLeased, detached from the caller's ctx (which
// may have ended: the lease must not stay held for a TTL because of it).
const releaseTimeout = 5 * time.Second

// RunLeased acquires the lease name for ttl with [Lessor.Acquire] (waiting in the name's queue
// until granted or ctx ends), runs fn under the lease's context ([Lease.Context], derived from
// ctx: cancelled, with the lease's error as cause, the moment the lease is lost), and releases
// the lease when fn returns, handing it to the next waiter. Arguments are as for Acquire; fn
// must not be nil.
//
// Errors: fn is not called, and the error is returned, when Acquire fails (ctx's error, wrapped,
// when ctx ends first; see Acquire for the rest). Otherwise fn's error, as is; and when fn
// returns nil although the lease ended before it returned, the lease's [*LeaseLostError]
// (matching [ErrLeaseLost]): part of fn's work may have run without the lease. The release's own
// error is not returned (the lease then expires within its TTL, and the heartbeat stopped
// renewing it: nothing is left held for longer). Safe for concurrent use, as the Lessor is.
//
// This is the "run while holding the lock" of ShedLock's executeWithLock and etcd's
// concurrency.Mutex, with the loss signalled through ctx as client-go's leader election does.
func (l *Lessor) RunLeased(ctx context.Context, name string, ttl time.Duration, fn LeaseFunc) error {
	if fn == nil {
		return argError("fn", "must not be nil")
	}
	lease, err := l.Acquire(ctx, name, ttl)
	if err != nil {
		return err
	}
	return runLeased(ctx, lease, fn)
}

// TryRunLeased is [Lessor.RunLeased] with [Lessor.TryAcquire]: it does not wait, and returns
// [ErrNotAcquired] without calling fn while another holder has the lease or anyone waits for it.
func (l *Lessor) TryRunLeased(ctx context.Context, name string, ttl time.Duration, fn LeaseFunc) error {
	if fn == nil {
		return argError("fn", "must not be nil")
	}
	lease, err := l.TryAcquire(ctx, name, ttl)
	if err != nil {
		return err
	}
	return runLeased(ctx, lease, fn)
}

// runLeased runs fn under lease's context and releases lease when fn returns.
func runLeased(ctx context.Context, lease *Lease, fn LeaseFunc) error {
	lctx, cancel := lease.Context(ctx)
	err := fn(lctx, lease)
	cancel()
	lost := lease.Err() // nil while held and trusted: the release below ends it
	rctx, stop := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	_ = lease.Release(rctx) // ErrNotHeld after a loss; any other failure: expires by its TTL
	stop()
	if err == nil && lost != nil && !errors.Is(lost, ErrReleased) {
		return fmt.Errorf("run under lease %q: %w", lease.name, lost)
	}
	return err
}
