package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock"
)

// pausedWorker acquires the lease of payment id, checks it is valid, pauses for its TTL and
// until its lease is taken over (without heartbeat, as a paused process renews nothing), then
// writes. By then a regular
// worker has taken the lease over with a larger token and captured the payment, so the fenced
// write must be rejected. The rejection is recorded in stale_rejections.
func pausedWorker(ctx context.Context, pool *pgxpool.Pool, ev *events, acquired *sync.WaitGroup, holder string, id int) (err error) {
	signalled := false
	defer func() {
		if !signalled {
			acquired.Done()
		}
	}()
	lessor, err := fencelock.NewLessor(pool, fencelock.WithHolder(holder), fencelock.WithoutHeartbeat())
	if err != nil {
		return err
	}
	name := leaseName(id)
	// Acquire, not TryAcquire: on a reused DATABASE_URL a lease of an interrupted earlier run
	// may still be live for a few seconds.
	actx, cancel := context.WithTimeout(ctx, 2*leaseTTL)
	lease, err := lessor.Acquire(actx, name, pausedTTL)
	granted := time.Now()
	cancel()
	if err != nil {
		return err
	}
	defer func() {
		// The lease was lost during the pause, so Release finds nothing to end.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if rerr := lease.Release(rctx); rerr != nil && !errors.Is(rerr, fencelock.ErrNotHeld) && err == nil {
			err = rerr
		}
	}()
	select {
	case <-lease.Done():
		return fmt.Errorf("lease %s ended right after the grant: %w", name, lease.Err())
	default:
	}
	logf("%s: acquired %s (token %d, TTL %v, no heartbeat); lease.Done() is open, so it goes to capture, and pauses for %v on the way",
		holder, name, lease.Token(), pausedTTL, pauseFor)
	acquired.Done()
	signalled = true

	// The pause. The sleep is real and lasts as long as the TTL. So that the demo shows a
	// rejection on every run, the pause also lasts until the takeover has committed, which
	// comes only once the lease has expired on the database clock.
	select {
	case <-time.After(pauseFor):
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	select {
	case <-ev.captured[id]:
	case <-ctx.Done():
		return context.Cause(ctx)
	}

	logf("%s: wakes up and writes payment %d with lease.FenceTx", holder, id)
	_, err = capture(ctx, pool, func(ctx context.Context, tx pgx.Tx) error { return lease.FenceTx(ctx, tx, name) }, lease.Token(), holder, id)
	if !errors.Is(err, fencelock.ErrLeaseLost) {
		return fmt.Errorf("payment %d: lease.FenceTx after the pause: %v, want fencelock.ErrLeaseLost", id, err)
	}
	logf("%s: refused: %v", holder, err)
	// A holder paused between its check and its write gets no second look at its lease: its
	// statement carries only its token. The fence is what stops it.
	logf("%s: writes payment %d anyway with its bare token %d, as a holder paused after its check would", holder, id, lease.Token())
	captured, err := capture(ctx, pool, func(ctx context.Context, tx pgx.Tx) error { return fencelock.FenceTx(ctx, tx, name, lease.Token()) }, lease.Token(), holder, id)
	var stale *fencelock.StaleTokenError
	switch {
	case errors.As(err, &stale):
		logf("%s: REJECTED: %v", holder, err)
		if err := recordRejection(ctx, pool, id, holder, stale); err != nil {
			return err
		}
	case err != nil:
		return err
	case captured:
		return fmt.Errorf("payment %d: the write with token %d after the pause was accepted", id, lease.Token())
	default:
		return fmt.Errorf("payment %d: the write with token %d after the pause was not rejected as stale", id, lease.Token())
	}

	select {
	case <-lease.Done():
		logf("%s: and lease.Done() had closed meanwhile: %v", holder, lease.Err())
	default:
		return fmt.Errorf("lease %s: Done() still open %v after the grant, past its TTL of %v", name, time.Since(granted).Round(time.Millisecond), pausedTTL)
	}
	if !errors.Is(lease.Err(), fencelock.ErrLeaseLost) {
		return fmt.Errorf("lease %s: Err() = %v, want fencelock.ErrLeaseLost", name, lease.Err())
	}
	return nil
}
