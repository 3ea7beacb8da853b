package fencelock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// Sixteen lessors contend for one name, each re-queuing after a hold of up to 2 ms, for 160
// grants in all: each is served within 0.5x-1.5x of its fair share (the queue serves in
// arrival order; before it, one lessor could take most grants), and a holder is granted again
// right after its own release only when nobody else waited.
func TestQueueShares(t *testing.T) {
	// Not parallel: sixteen busy contenders would starve the short-TTL holders of other
	// tests (TestPollersCannotCostHolderItsLease renews a 300 ms lease every 200 ms).
	b := setup(t)
	const n, total = 16, 160
	var mu sync.Mutex
	grants := map[string]int{}
	last, regrants, left := "", 0, total
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		l := newLessor(t, b.Pool, fmt.Sprintf("c%d", i))
		wg.Go(func() {
			for {
				lease, err := l.Acquire(b.Ctx, "shares", time.Minute)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				done := left <= 0
				if !done {
					left--
					grants[lease.Holder()]++
					if last == lease.Holder() {
						regrants++
					}
					last = lease.Holder()
				}
				mu.Unlock()
				if !done {
					time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
				}
				if err := lease.Release(b.Ctx); err != nil {
					errs <- err
					return
				}
				if done {
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	fair := float64(total) / n
	for i := range n {
		h := fmt.Sprintf("c%d", i)
		share := float64(grants[h]) / fair
		require.True(t, share >= 0.5 && share <= 1.5, "%s got %d grants, %.2fx its fair share", h, grants[h], share)
	}
	require.LessOrEqual(t, regrants, 1, "holders were granted again while others waited")
}

// Goroutines that share a lessor share its place in a queue. Two lessors with four goroutines
// each contend for one name for 2 s and 21 grants (hold up to 1 ms, release, ask again): a goroutine is told
// ErrAlreadyHeld while its lessor holds the name, never two goroutines hold it at once, and
// each grant's token is larger than the one before. (A hand-off left over for a goroutine of
// the same wait once let a second goroutine trust a released grant: review of issue 10.)
func TestQueueSharedLessorsNeverHoldTwice(t *testing.T) {
	// Not parallel: eight busy goroutines would starve the short-TTL holders of other
	// tests (TestPollersCannotCostHolderItsLease renews a 300 ms lease every 200 ms).
	b := setup(t)
	// 2 s and at least 21 grants, within a deadline no machine needs (a fixed 2 s window
	// asserted a throughput).
	const minGrants = 21
	ctx, cancel := context.WithTimeout(b.Ctx, 60*time.Second)
	defer cancel()
	var mu sync.Mutex
	holding, grants := 0, 0
	until := time.Now().Add(2 * time.Second)
	atMinRun := time.AfterFunc(2*time.Second, func() {
		mu.Lock()
		defer mu.Unlock()
		if grants >= minGrants {
			cancel()
		}
	})
	defer atMinRun.Stop()
	var last fencelock.Token
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	for i := range 2 {
		l := newLessor(t, b.Pool, fmt.Sprintf("l%d", i))
		for range 4 {
			wg.Go(func() {
				for ctx.Err() == nil {
					lease, err := l.Acquire(ctx, "shared", time.Minute)
					switch {
					case errors.Is(err, fencelock.ErrAlreadyHeld):
						time.Sleep(200 * time.Microsecond)
						continue
					case ctx.Err() != nil:
						return
					case err != nil:
						errs <- err
						return
					}
					mu.Lock()
					holding++
					grants++
					bad := holding > 1 || lease.Token() <= last
					last = max(last, lease.Token())
					if grants >= minGrants && !time.Now().Before(until) {
						cancel()
					}
					mu.Unlock()
					if bad {
						errs <- fmt.Errorf("token %d granted to %s while another grant was held, or not above the last one", lease.Token(), lease.Holder())
					}
					time.Sleep(time.Duration(rand.IntN(1000)) * time.Microsecond)
					mu.Lock()
					holding--
					mu.Unlock()
					if err := lease.Release(context.WithoutCancel(ctx)); err != nil {
						errs <- err
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	require.GreaterOrEqual(t, grants, minGrants)
	t.Logf("%d grants", grants)
}
