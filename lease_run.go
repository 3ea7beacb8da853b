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

// RunLeased acquires the lease name for ttl with [Lessor.Acquire] (waiting in the name's queue
// until granted or ctx ends), runs fn under the lease's context ([Lease.Context], derived from
// ctx: cancelled, with the lease's error as cause, the moment the lease is lost), and releases
// the lease when fn returns, handing it to the next waiter: also when ctx has ended by then
// (the release is detached from ctx, bounded by 5 s of its own, as [Lease.Release]). Arguments
// are as for Acquire; fn must not be nil.
//
// Errors: fn is not called, and the error is returned, when Acquire fails (ctx's error, wrapped,
// when ctx ends first; see Acquire for the rest). Otherwise fn's error, as is, while the lease
// held to the end; when the lease was lost before fn returned, an error wrapping the lease's
// [*LeaseLostError] (matching [ErrLeaseLost]), and fn's error too when it returned one (often
// ctx's end, which the loss caused): part of fn's work may have run without the lease. The
// release's own error is not returned (the lease then expires within its TTL, and the heartbeat
// stopped renewing it: nothing is left held for longer). A panic in fn releases the lease and
// goes on. Safe for concurrent use, as the Lessor is.
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

// runLeased runs fn under lease's context and releases lease when fn returns, or panics (the
// panic goes on after the release).
func runLeased(ctx context.Context, lease *Lease, fn LeaseFunc) (err error) {
	lctx, cancel := lease.Context(ctx)
	var lost error
	defer func() {
		cancel()
		// Detached from ctx, which may have ended (often why fn returned), bounded by 5 s.
		_ = lease.Release(ctx) // ErrNotHeld after a loss; any other failure: expires by its TTL
	}()
	err = fn(lctx, lease)
	lost = lease.Err() // nil while held and trusted: the deferred release ends it
	if lost == nil || errors.Is(lost, ErrReleased) || errors.Is(err, ErrLeaseLost) {
		return err
	}
	if err == nil {
		return fmt.Errorf("run under lease %q: %w", lease.name, lost)
	}
	// fn's own error, often ctx's end caused by the loss: both are reported.
	return fmt.Errorf("run under lease %q: %w (fn returned: %w)", lease.name, lost, err)
}
