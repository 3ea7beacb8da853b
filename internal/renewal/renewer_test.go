package renewal

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/timing"
	"github.com/fencelock/fencelock/internal/timing/timingtest"
)

// lease is a stand-in for a held lease: its schedule, as a lessor's Lease keeps it.
type lease struct {
	name  string
	slot  Slot
	times timing.Times

	mu                    sync.Mutex
	nextRenew, trustUntil time.Time
	ended                 bool
	retrying              bool // its last renewal failed
}

// renewed records a grant or renewal sent at sent, as Lease.renewed does.
func (x *lease) renewed(sent time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.trustUntil = x.times.TrustEnd(sent)
	x.nextRenew = x.times.NextRenewal(sent)
}

// owner is a stand-in for a Lessor: a held set under its mutex, and hooks that record what
// the Renewer asks of it.
type owner struct {
	mu      sync.Mutex
	active  map[*lease]bool
	expired []*lease // guarded by mu

	renewMu sync.Mutex
	renews  [][]*lease // the batches given to the renewal statement

	clk   timing.Clock
	renew bool // the renewal statement renews every lease of its batch, sent at clk.Now(); set before use
}

// batches returns the batches given to the renewal statement so far.
func (o *owner) batches() [][]*lease {
	o.renewMu.Lock()
	defer o.renewMu.Unlock()
	return append([][]*lease(nil), o.renews...)
}

func newOwner(clk timing.Clock) (*owner, *Renewer[*lease]) {
	o := &owner{active: map[*lease]bool{}, clk: clk}
	var r *Renewer[*lease]
	r = New(Hooks[*lease]{
		Mu:    &o.mu,
		Clock: clk,
		Slot:  func(x *lease) *Slot { return &x.slot },
		State: (*lease).state,
		Ended: func(x *lease) bool {
			x.mu.Lock()
			defer x.mu.Unlock()
			return x.ended
		},
		Held:    func(x *lease) bool { return o.active[x] },
		Holding: func() bool { return len(o.active) > 0 },
		Renew: func(_ context.Context, batch []*lease) {
			if o.renew {
				sent := o.clk.Now()
				for _, x := range batch {
					x.renewed(sent)
				}
			}
			o.renewMu.Lock()
			defer o.renewMu.Unlock()
			o.renews = append(o.renews, batch)
		},
		Expire: func(x *lease) {
			x.mu.Lock()
			x.ended = true
			x.mu.Unlock()
			// As a Lease's end does: out of the held set and out of both heaps (ForgetLocked),
			// so a renewal that returned before the expiry and queued it again leaves nothing.
			o.mu.Lock()
			o.expired = append(o.expired, x)
			delete(o.active, x)
			r.ForgetLocked(x)
			o.mu.Unlock()
		},
	})
	return o, r
}

// threeSecondHeartbeat are the times of most leases here: renewed every 3 s, a TTL of 9 s and
// a margin of 1 s (queued 750 ms early; a window of 750 ms).
var threeSecondHeartbeat = timing.Times{TTL: 9 * time.Second, Heartbeat: 3 * time.Second, Margin: time.Second}

// onManualClock returns a new manual clock, and an owner and its renewer on it.
func onManualClock() (*timingtest.ManualClock, *owner, *Renewer[*lease]) {
	clk := timingtest.NewManualClock()
	o, r := newOwner(clk)
	return clk, o, r
}

// The heartbeat renews due leases in batches of at most maxBatch, with at most maxInFlight
// statements at a time: with 2,000 leases due beyond what two full batches take, one round
// takes two full batches and leaves 2,000 queued until a batch returns. A lease about to lapse is left to the trust
// watch, and one that its holder renewed is queued again at its new time. (No database: the
// renewal statements are never sent.) Moved from the root's heartbeat_internal_test.go.
func TestHeartbeatTakeBatches(t *testing.T) {
	clk, o, r := onManualClock()
	lt := threeSecondHeartbeat
	start := clk.Now()
	sent := start.Add(-3 * time.Second) // granted a heartbeat ago: due now
	add := func(name string, sent time.Time) *lease {
		x := &lease{name: name, slot: NewSlot(), times: lt}
		x.renewed(sent)
		o.mu.Lock()
		o.active[x] = true
		r.enqueueLocked(x)
		o.mu.Unlock()
		return x
	}
	for i := range maxInFlight*maxBatch + 2000 {
		add(fmt.Sprintf("due:%d", i), sent)
	}
	lapsing := add("lapsing", start.Add(-lt.TTL+lt.Margin+2*time.Millisecond)) // window ends in 2 ms
	moved := add("moved", sent)
	moved.renewed(start) // renewed by its holder since it was queued

	batches, next, ok := r.take(start)
	require.True(t, ok)
	require.Len(t, batches, maxInFlight)
	for _, batch := range batches {
		require.Len(t, batch.leases, maxBatch)
	}
	require.Equal(t, maxInFlight, r.inFlight)
	require.Equal(t, start.Add(time.Hour), next, "with every statement slot taken, the loop waits for a batch to return")
	o.mu.Lock()
	queued := r.queue.Len()
	o.mu.Unlock()
	// The 2,000 due leases left, and "moved" (re-queued at its new time); "lapsing" is not queued
	// unless it was popped after the slots were full.
	require.Contains(t, []int{2001, 2002}, queued)
	for _, batch := range batches {
		for _, x := range batch.leases {
			require.NotSame(t, lapsing, x)
			require.NotSame(t, moved, x)
		}
	}
	require.True(t, r.queue.Queued(moved), "a lease renewed by its holder was dropped from the heap")
}

// On a manual clock: the loop is armed for the first renewal by the first lease added, a due
// lease goes to the renewal statement and is queued again when the statement returns, the
// trust watch ends a lease whose window is over (Expire) and follows one a renewal extended,
// and with nothing held neither the heartbeat nor a round stays armed.
func TestRenewerOnManualClock(t *testing.T) {
	clk, o, r := onManualClock()
	lt := timing.Times{TTL: 9 * time.Second, Heartbeat: 3 * time.Second, Margin: 900 * time.Millisecond}
	hold := func(name string) *lease {
		x := &lease{name: name, slot: NewSlot(), times: lt}
		x.renewed(clk.Now())
		o.mu.Lock()
		o.active[x] = true
		at, wake := r.AddLocked(x)
		o.mu.Unlock()
		if wake {
			r.Wake(at)
		}
		return x
	}
	a := hold("a")
	at, armed := r.Heartbeat().Armed()
	require.True(t, armed)
	require.Equal(t, clk.Now().Add(2250*time.Millisecond), at, "armed a quarter heartbeat before the first renewal")

	clk.Advance(2250 * time.Millisecond)
	require.Eventually(t, func() bool { return len(o.batches()) > 0 }, 5*time.Second, time.Millisecond)
	require.Equal(t, []*lease{a}, o.batches()[0])

	// a is never renewed: the trust watch ends it at the end of its window (8.1 s after its
	// grant), after a second lease b, renewed meanwhile, has moved on.
	b := hold("b")
	clk.Advance(8100*time.Millisecond - 2250*time.Millisecond - time.Millisecond)
	o.mu.Lock()
	require.Empty(t, o.expired)
	o.mu.Unlock()
	b.renewed(clk.Now())
	clk.Advance(time.Millisecond)
	o.mu.Lock()
	require.Equal(t, []*lease{a}, o.expired, "a's window is over; b was renewed")
	require.False(t, r.trust.Queued(a))
	require.True(t, r.trust.Queued(b), "b's window moved on")
	delete(o.active, b)
	r.ForgetLocked(b)
	o.mu.Unlock()

	// Nothing held: once no renewal is in flight, a round stops the heartbeat, and nothing
	// stays armed.
	require.Eventually(t, func() bool {
		clk.Advance(time.Second)
		o.mu.Lock()
		running := r.Heartbeat().RunningLocked()
		o.mu.Unlock()
		_, armed := r.Heartbeat().Armed()
		return !running && !armed
	}, 5*time.Second, time.Millisecond)
	o.mu.Lock()
	defer o.mu.Unlock()
	require.Zero(t, r.trust.Len())
	require.Zero(t, r.queue.Len())
}
