package integration

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// No amount of polling or waiting by other lessors (TryAcquire in tight loops, Acquire and
// RunLocked waiting) costs a healthy holder its lease: a refused grant never row-locks the
// holder's row, so renewals (which skip locked rows) never skip it.
// Before the pre-check ran on every attempt, each refused poll row-locked the holder's row
// (6 pollers made a holder with a 300 ms TTL lose its lease 1 to 3 times in 4 s). The
// invariant is checked directly, whatever the machine's speed: no renewal of the holder ever
// came back "locked" (its row locked by someone else); and the holder keeps its lease. The
// run ends on events, not after a fixed time a loaded machine would fill with fewer renewals
// and polls: once the holder has made 50 renewal attempts while the pollers polled (about 4 s
// on an idle machine, longer on a loaded one, with as many chances to meet a locked row) and
// the pollers have polled 100 times (a poll counts when the server refused it); not within
// 90 s (inside the bundle's two minutes) fails.
func TestPollersCannotCostHolderItsLease(t *testing.T) {
	// Not parallel: 18 goroutines against a short TTL on 2 cores.
	b := setup(t)
	// A 5 s TTL and a 100 ms heartbeat: about 45 renewal attempts in the trust window, so that
	// a loaded machine (the suite beside four busy loops) does not lose the lease by slowness;
	// the power to catch pollers that lock the row comes from the renewals' "locked" count,
	// which must stay 0 (with the old pollers, most renewals skipped).
	metrics := newMetricsReader(t)
	holder := newLessor(t, b.Pool, "holder", fencelock.WithHeartbeatInterval(100*time.Millisecond), fencelock.WithMeterProvider(metrics.mp))
	lease, err := holder.Acquire(b.Ctx, "hot", 5*time.Second)
	require.NoError(t, err)
	ctx, stop := context.WithCancel(b.Ctx)
	cfg, err := pgxpool.ParseConfig(b.DB.URL)
	require.NoError(t, err)
	cfg.MaxConns = 16 // the pollers' own pool: they never wait for the holder's connections
	pollers, err := pgxpool.NewWithConfig(b.Ctx, cfg)
	require.NoError(t, err)
	defer pollers.Close()
	var polls, granted atomic.Int64
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	for i := range 16 {
		poller := newLessor(t, pollers, fmt.Sprintf("poller%d", i))
		wg.Go(func() {
			for ctx.Err() == nil {
				got, err := poller.TryAcquire(ctx, "hot", 300*time.Millisecond)
				if errors.Is(err, fencelock.ErrNotAcquired) {
					polls.Add(1) // a poll the server answered: the lease is held
				}
				if err == nil {
					granted.Add(1)
					_ = got.Release(context.WithoutCancel(ctx))
				}
			}
		})
	}
	// Waiters too: Acquire and RunLocked, with a short backoff, until the end.
	waitBackoff := fencelock.WithBackoff(fencelock.ExponentialBackoff(time.Millisecond, 5*time.Millisecond))
	for i := range 2 {
		waiter := newLessor(t, pollers, fmt.Sprintf("waiter%d", i), waitBackoff)
		wg.Go(func() {
			if got, err := waiter.Acquire(ctx, "hot", 300*time.Millisecond); err == nil {
				granted.Add(1)
				_ = got.Release(context.WithoutCancel(ctx))
			}
		})
		wg.Go(func() {
			err := waiter.RunLocked(ctx, "hot", func(context.Context, pgx.Tx, fencelock.Token) error { return nil })
			if err == nil {
				granted.Add(1)
			}
		})
	}
	const attempts, minPolls = 50, 100
	renewals := func() int64 { return metrics.value("fencelock.lease.renewals") } // every outcome
	start := time.Now()
	base := int64(-1)                     // the renewal attempts made before the pollers' first poll
	limit := time.After(90 * time.Second) // inside the bundle's two minutes, so that polls end refused, not on its end
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-lease.Done():
			t.Fatalf("the holder lost its lease to pollers: %v", lease.Err())
		case <-limit:
			t.Fatalf("in 90 s: %d renewal attempts while polling, %d polls (want %d and %d)", renewals()-max(base, 0), polls.Load(), attempts, minPolls)
		case <-tick.C:
		}
		if base < 0 {
			if polls.Load() > 0 {
				base = renewals()
			}
			continue
		}
		if renewals()-base >= attempts && polls.Load() >= minPolls {
			break
		}
	}
	stop()
	wg.Wait()
	took := time.Since(start)
	require.NoError(t, lease.Err())
	require.Zero(t, granted.Load(), "a poller or waiter was granted a held lease")
	renewed := metrics.value("fencelock.lease.renewals", outcome("renewed"))
	require.Positive(t, renewed, "the holder never renewed")
	require.Zero(t, metrics.value("fencelock.lease.renewals", outcome("locked")), "a renewal found the holder's row locked by a poller or waiter")
	require.NoError(t, lease.Release(b.Ctx))
	t.Logf("%d refused polls in %v; the holder kept its lease (%d renewals, none locked)", polls.Load(), took, renewed)
}
