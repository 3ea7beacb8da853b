package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"gorm.io/gorm"

	"github.com/fencelock/fencelock"
)

// events orders the paused pods against the regular ones with channels, not sleeps.
type events struct {
	paused chan struct{} // closed when every paused pod holds its lease

	mu        sync.Mutex
	takenOver map[string]bool // paused SKUs a regular pod has sold a unit of
}

// markTakenOver reports whether sku is a paused pod's SKU sold by a regular pod for the first
// time.
func (e *events) markTakenOver(sku string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !isPausedTarget(sku) || e.takenOver[sku] {
		return false
	}
	e.takenOver[sku] = true
	return true
}

func isPausedTarget(sku string) bool {
	for _, p := range pausedPods {
		if p.sku == sku {
			return true
		}
	}
	return false
}

// sell runs the paused pods and the regular pods until every SKU is sold out, and returns the
// first unexpected error.
func sell(ctx context.Context, pool *pgxpool.Pool, gdb *gorm.DB) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	ev := &events{paused: make(chan struct{}), takenOver: make(map[string]bool)}

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

	// The paused pods take their leases first; the regular pods start once they all hold
	// them, so the takeovers below always happen.
	var acquired sync.WaitGroup
	for _, p := range pausedPods {
		acquired.Add(1)
		wg.Go(func() {
			if err := pausedPod(ctx, pool, gdb, &acquired, p.holder, p.sku); err != nil {
				fail(fmt.Errorf("%s: %w", p.holder, err))
			}
		})
	}
	go func() {
		acquired.Wait()
		close(ev.paused)
	}()

	for i := 1; i <= numPods; i++ {
		holder := fmt.Sprintf("pod-%d", i)
		wg.Go(func() {
			select {
			case <-ev.paused:
			case <-ctx.Done():
				return
			}
			if err := regularPod(ctx, pool, gdb, ev, holder); err != nil {
				fail(fmt.Errorf("%s: %w", holder, err))
			}
		})
	}
	wg.Wait()
	return firstErr
}

// regularPod sells units of the SKUs in stock until none is left, one order per grant of a
// SKU's lease. It tries each SKU in stock with TryAcquire; when every one it tried was held by
// someone else, it waits for one with Acquire, which returns as soon as the holder releases it
// or its lease expires.
func regularPod(ctx context.Context, pool *pgxpool.Pool, gdb *gorm.DB, ev *events, holder string) error {
	lessor, err := fencelock.NewLessor(pool, fencelock.WithHolder(holder))
	if err != nil {
		return err
	}
	for {
		skus, err := inStock(ctx, gdb)
		if err != nil {
			return err
		}
		if len(skus) == 0 {
			return nil
		}
		rand.Shuffle(len(skus), func(i, j int) { skus[i], skus[j] = skus[j], skus[i] })
		got := false
		for _, sku := range skus {
			lease, err := lessor.TryAcquire(ctx, leaseName(sku), leaseTTL)
			if errors.Is(err, fencelock.ErrNotAcquired) {
				continue
			}
			if err != nil {
				return err
			}
			got = true
			if err := orderAndRelease(ctx, gdb, ev, lease, holder, sku); err != nil {
				return err
			}
		}
		if got {
			continue
		}
		sku := skus[0]
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		lease, err := lessor.Acquire(actx, leaseName(sku), leaseTTL)
		cancel()
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				continue // still held; look again
			}
			return err
		}
		if err := orderAndRelease(ctx, gdb, ev, lease, holder, sku); err != nil {
			return err
		}
	}
}

func orderAndRelease(ctx context.Context, gdb *gorm.DB, ev *events, lease *fencelock.Lease, holder, sku string) error {
	sold, err := placeOrder(ctx, gdb, lease, holder, sku)
	// Release even when ctx has ended, so an interrupted run leaves no lease held.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if rerr := lease.Release(rctx); rerr != nil && err == nil {
		err = rerr
	}
	if err != nil {
		return err
	}
	if sold && ev.markTakenOver(sku) {
		logf("%s: took %s over with token %d after the paused holder's lease expired, and sold a unit", holder, lease.Name(), lease.Token())
	}
	return nil
}
