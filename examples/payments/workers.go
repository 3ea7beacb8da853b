package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock"
)

// events orders the paused workers against the regular ones with channels, not sleeps.
type events struct {
	paused chan struct{} // closed when every paused worker holds its lease

	mu       sync.Mutex
	captured map[int]chan struct{} // closed when the payment's capture has committed
}

func newEvents() *events {
	e := &events{paused: make(chan struct{}), captured: make(map[int]chan struct{})}
	for id := 1; id <= numPayments; id++ {
		e.captured[id] = make(chan struct{})
	}
	return e
}

func (e *events) markCaptured(id int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	select {
	case <-e.captured[id]:
	default:
		close(e.captured[id])
	}
}

func isPausedTarget(id int) bool {
	for _, p := range pausedWorkers {
		if p.payment == id {
			return true
		}
	}
	return false
}

// capturePayments runs the paused workers and the regular workers until every payment is
// captured, and returns the first unexpected error.
func capturePayments(ctx context.Context, pool *pgxpool.Pool) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	ev := newEvents()

	var wg sync.WaitGroup
	var errMu sync.Mutex
	var firstErr error
	fail := func(err error) {
		errMu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		errMu.Unlock()
		cancel(err)
	}

	// The paused workers take their leases first; the regular workers start once they all
	// hold them, so the takeovers below always happen.
	var acquired sync.WaitGroup
	for _, p := range pausedWorkers {
		acquired.Add(1)
		wg.Go(func() {
			if err := pausedWorker(ctx, pool, ev, &acquired, p.holder, p.payment); err != nil {
				fail(fmt.Errorf("%s: %w", p.holder, err))
			}
		})
	}
	go func() {
		acquired.Wait()
		logf("note: all lease names share one token sequence, so a name's tokens increase but skip values; the high bits hold the epoch (server timeline)")
		close(ev.paused)
	}()

	for i := 1; i <= numWorkers; i++ {
		holder := fmt.Sprintf("worker-%d", i)
		wg.Go(func() {
			select {
			case <-ev.paused:
			case <-ctx.Done():
				return
			}
			if err := regularWorker(ctx, pool, ev, holder); err != nil {
				fail(fmt.Errorf("%s: %w", holder, err))
			}
		})
	}
	wg.Wait()
	return firstErr
}

// regularWorker captures pending payments until none is left. It tries each pending payment
// with TryAcquire; when every one it tried was held by someone else, it waits for one with
// Acquire, which returns as soon as the holder releases it or its lease expires.
func regularWorker(ctx context.Context, pool *pgxpool.Pool, ev *events, holder string) error {
	lessor, err := fencelock.NewLessor(pool, fencelock.WithHolder(holder))
	if err != nil {
		return err
	}
	for {
		ids, err := pendingPayments(ctx, pool)
		if err != nil {
			return err
		}
		if len(ids) == 0 {
			return nil
		}
		rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		got := false
		for _, id := range ids {
			lease, err := lessor.TryAcquire(ctx, leaseName(id), leaseTTL)
			if errors.Is(err, fencelock.ErrNotAcquired) {
				continue
			}
			if err != nil {
				return err
			}
			got = true
			if err := captureAndRelease(ctx, pool, ev, lease, holder, id); err != nil {
				return err
			}
		}
		if got {
			continue
		}
		id := ids[0]
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		lease, err := lessor.Acquire(actx, leaseName(id), leaseTTL)
		cancel()
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				continue // still held; look again
			}
			return err
		}
		if err := captureAndRelease(ctx, pool, ev, lease, holder, id); err != nil {
			return err
		}
	}
}

func captureAndRelease(ctx context.Context, pool *pgxpool.Pool, ev *events, lease *fencelock.Lease, holder string, id int) error {
	captured, err := capture(ctx, pool, func(ctx context.Context, tx pgx.Tx) error { return lease.FenceTx(ctx, tx, lease.Name()) }, lease.Token(), holder, id)
	// Release even when ctx has ended, so an interrupted run leaves no lease held.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if rerr := lease.Release(rctx); rerr != nil && err == nil {
		err = rerr
	}
	if err != nil {
		return err
	}
	if captured {
		if isPausedTarget(id) {
			logf("%s: took %s over with token %d after the paused holder's lease expired, and captured it", holder, lease.Name(), lease.Token())
		}
		ev.markCaptured(id)
	}
	return nil
}
