package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"gorm.io/gorm"

	"github.com/fencelock/fencelock"
)

// pausedPod acquires the lease of sku, checks that it is valid and that sku is in stock, pauses
// past its TTL (without heartbeat, as a paused process renews nothing), then writes. By then
// regular pods have taken the lease over with larger tokens and sold sku out, so its write
// must be refused: by lease.FenceSQLTx, and, when it writes anyway with its old token, by the
// inventory's trigger. The trigger's rejection is recorded in inventory_stale_rejections.
func pausedPod(ctx context.Context, pool *pgxpool.Pool, gdb *gorm.DB, acquired *sync.WaitGroup, holder, sku string) (err error) {
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
	name := leaseName(sku)
	// Acquire, not TryAcquire: on a reused DATABASE_URL a lease of an interrupted earlier run
	// may still be live for a few seconds.
	actx, cancel := context.WithTimeout(ctx, 2*leaseTTL)
	lease, err := lessor.Acquire(actx, name, pausedTTL)
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
	token := int64(lease.Token())

	// The check, made while the lease is valid: sku is in stock.
	var seen item
	if err := gdb.WithContext(ctx).Where("sku = ?", sku).Take(&seen).Error; err != nil {
		return fmt.Errorf("read %s: %w", sku, err)
	}
	if seen.Stock <= 0 {
		return fmt.Errorf("%s is out of stock before any sale", sku)
	}
	select {
	case <-lease.Done():
		return fmt.Errorf("lease %s ended right after the grant: %w", name, lease.Err())
	default:
	}
	logf("%s: acquired %s (token %d, TTL %v, no heartbeat) and sees %s in stock; lease.Done() is open, so it goes to sell one, and pauses for %v on the way",
		holder, name, token, pausedTTL, plural(seen.Stock, "unit"), pauseFor)
	acquired.Done()
	signalled = true

	// The pause. The sleep is real and lasts more than three TTLs. So that the demo shows a
	// rejection on every run, however loaded the machine, the pause also lasts until the
	// database shows the takeover: sku sold out by writers with newer tokens.
	select {
	case <-time.After(pauseFor):
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	now, err := awaitSoldOut(ctx, gdb, sku, token)
	if err != nil {
		return err
	}

	logf("%s: wakes up and sells a unit of %s with lease.FenceSQLTx", holder, sku)
	_, err = placeOrder(ctx, gdb, lease, holder, sku)
	if !errors.Is(err, fencelock.ErrLeaseLost) {
		return fmt.Errorf("%s: lease.FenceSQLTx after the pause: %v, want fencelock.ErrLeaseLost", sku, err)
	}
	logf("%s: refused: %v", holder, err)
	// A pod paused between its check and its write gets no second look at its lease: its
	// write carries only its token. The trigger is what stops it.
	logf("%s: writes anyway through GORM, as a pod paused after its check would: SELECT fencelock.set_token(%d), then UPDATE inventory SET stock = stock - 1 (stock is %d, the row's token %d)",
		holder, token, now.Stock, *now.FenceToken)
	err = writeStale(ctx, gdb, token, holder, sku)
	switch {
	case errors.Is(fencelock.WrapSQLError(err), fencelock.ErrStaleToken):
		logf("%s: REJECTED by inventory's trigger: %v", holder, err)
		if err := recordRejection(ctx, gdb, holder, sku, token, err); err != nil {
			return err
		}
	case err != nil:
		return err
	default:
		return fmt.Errorf("%s: the write with token %d after the pause was accepted", sku, token)
	}

	select {
	case <-lease.Done():
		logf("%s: and lease.Done() had closed meanwhile: %v", holder, lease.Err())
	default:
		return fmt.Errorf("lease %s: Done() still open %v after the grant, past its TTL of %v", name, pauseFor, pausedTTL)
	}
	if !errors.Is(lease.Err(), fencelock.ErrLeaseLost) {
		return fmt.Errorf("lease %s: Err() = %v, want fencelock.ErrLeaseLost", name, lease.Err())
	}
	return nil
}

// awaitSoldOut polls sku's row until the database shows it taken over and sold out: stock 0,
// written by a token newer than token. It returns the row as then read.
func awaitSoldOut(ctx context.Context, gdb *gorm.DB, sku string, token int64) (item, error) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var it item
		if err := gdb.WithContext(ctx).Where("sku = ?", sku).Take(&it).Error; err != nil {
			return it, fmt.Errorf("read %s: %w", sku, err)
		}
		if it.Stock == 0 && it.FenceToken != nil && *it.FenceToken > token {
			return it, nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return it, context.Cause(ctx)
		}
	}
}
