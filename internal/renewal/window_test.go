package renewal

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/timing"
)

// holdAt adds a lease of times lt, granted (or last renewed) at sent, to o's held set and to
// r's queue and trust watch, without arming anything.
func holdAt(o *owner, r *Renewer[*lease], name string, lt timing.Times, sent time.Time) *lease {
	x := &lease{name: name, slot: NewSlot(), times: lt}
	x.renewed(sent)
	o.mu.Lock()
	o.active[x] = true
	r.enqueueLocked(x)
	r.watchTrustLocked(x)
	o.mu.Unlock()
	return x
}

// names returns the names of leases, for messages.
func names(leases []*lease) []string {
	out := make([]string, len(leases))
	for i, x := range leases {
		out[i] = x.name
	}
	return out
}

// A lease that comes due opens a window of a quarter of its heartbeat: every lease whose queue
// time falls inside it is renewed in the same statement, early. Not a lease queued past the
// window, not one whose last renewal failed (it waits for its retry time), and not one whose
// own heartbeat is so short that the window would renew it more than a quarter of that
// heartbeat early.
func TestRenewalWindow(t *testing.T) {
	clk, o, r := onManualClock()
	lt := threeSecondHeartbeat // queued 750 ms early; window 750 ms
	now := clk.Now()
	due := now.Add(-lt.Heartbeat + lt.Heartbeat/4) // sent then, its queue time is now
	a := holdAt(o, r, "due", lt, due)
	b := holdAt(o, r, "in-window", lt, due.Add(500*time.Millisecond))
	c := holdAt(o, r, "past-window", lt, due.Add(800*time.Millisecond))
	d := holdAt(o, r, "retrying", lt, due.Add(100*time.Millisecond))
	d.retrying = true
	short := timing.Times{TTL: 1200 * time.Millisecond, Heartbeat: 400 * time.Millisecond, Margin: 100 * time.Millisecond} // own bound: 100 ms early
	e := holdAt(o, r, "short-heartbeat", short, now.Add(-short.Heartbeat+short.Heartbeat/4+200*time.Millisecond))

	batches, next, ok := r.take(now)
	require.True(t, ok)
	require.Len(t, batches, 1)
	require.ElementsMatch(t, []string{"due", "in-window"}, names(batches[0].leases))
	require.Equal(t, b.state().TrustUntil, batches[0].deadline, "the statement's deadline is the latest trust window end of its leases")
	o.mu.Lock()
	for _, x := range []*lease{c, d, e} {
		require.True(t, r.queue.Queued(x), "%s is queued for later", x.name)
	}
	require.False(t, r.queue.Queued(a))
	o.mu.Unlock()
	require.Equal(t, now.Add(100*time.Millisecond), next, "the next round: the retrying lease's queue time")
}

// state returns x's State as the owner's hook does.
func (x *lease) state() State {
	x.mu.Lock()
	defer x.mu.Unlock()
	return State{Times: x.times, NextRenew: x.nextRenew, TrustUntil: x.trustUntil, Retrying: x.retrying}
}

// When the in-flight bound stops a round, the window stays open: the round that runs when a
// statement returns renews the leases left in it, though none of them is due yet.
func TestRenewalWindowOutlivesInFlightBound(t *testing.T) {
	clk, o, r := onManualClock()
	o.renew = true
	lt := threeSecondHeartbeat
	now := clk.Now()
	due := now.Add(-lt.Heartbeat + lt.Heartbeat/4)
	for i := range maxInFlight * maxBatch {
		holdAt(o, r, fmt.Sprintf("due:%d", i), lt, due)
	}
	late := holdAt(o, r, "in-window", lt, due.Add(500*time.Millisecond))

	batches, next, ok := r.take(now)
	require.True(t, ok)
	require.Len(t, batches, maxInFlight)
	require.Equal(t, now.Add(time.Hour), next, "every statement slot taken")
	clk.Set(now.Add(10 * time.Millisecond))
	r.renewBatch(batches[0]) // returns: its leases renewed now, queued a heartbeat on

	batches, _, ok = r.take(clk.Now())
	require.True(t, ok)
	require.Len(t, batches, 1)
	require.Equal(t, []*lease{late}, batches[0].leases, "the window opened by the due leases is still open")
}

// Leases granted one by one (1,000 over a heartbeat, 3 ms apart) fall into cohorts: a lease
// is renewed every three quarters of a heartbeat (at its queue time), and cohorts stay at
// least a window (a quarter heartbeat) apart, so after a few heartbeats each such period
// renews every lease once in at most 3 statements, each lease renewed no later than its queue
// time and at most a quarter heartbeat earlier. Renewed as they came due, the same leases took
// about 1,000 statements a period. The heartbeat is driven round by round on a manual clock,
// each statement returning at once.
func TestRenewalCohorts(t *testing.T) {
	clk, o, r := onManualClock()
	o.renew = true
	lt := threeSecondHeartbeat
	start := clk.Now()
	const n = 1000
	for i := range n {
		holdAt(o, r, fmt.Sprintf("lease:%d", i), lt, start.Add(time.Duration(i)*3*time.Millisecond))
	}
	end := start.Add(10 * lt.Heartbeat)
	period := lt.Heartbeat - lt.Heartbeat/4 // from one renewal to the next
	var rounds []int                        // leases renewed in each round of the last period
	for {
		o.mu.Lock()
		_, at, ok := r.queue.Head()
		o.mu.Unlock()
		require.True(t, ok)
		if at.After(end) {
			break
		}
		clk.Set(at)
		now := clk.Now()
		batches, _, ok := r.take(now)
		require.True(t, ok)
		renewed := 0
		for _, b := range batches {
			for _, x := range b.leases {
				q := lt.QueueAt(x.state().NextRenew)
				require.False(t, now.After(q), "%s renewed late", x.name)
				require.False(t, now.Before(q.Add(-lt.Heartbeat/4)), "%s renewed more than a quarter heartbeat early", x.name)
			}
			r.renewBatch(b)
			renewed += len(b.leases)
		}
		if now.After(end.Add(-period)) {
			rounds = append(rounds, renewed)
		}
	}
	require.LessOrEqual(t, len(rounds), 3, "rounds in the last period: %v", rounds)
	total := 0
	for _, k := range rounds {
		total += k
	}
	require.Equal(t, n, total, "every lease renewed once in the last period: %v", rounds)
	require.Len(t, o.expired, 0)
}

// A cohort of leases whose trust windows end together, larger than the trust watch's chunk,
// is handled whole across chunks: every lease not renewed is ended, every renewed one stays
// watched at its new window end, and the timer is set for it.
func TestTrustWatchCohortAcrossChunks(t *testing.T) {
	clk, o, r := onManualClock()
	lt := threeSecondHeartbeat
	start := clk.Now()
	const n = 3*trustChunk + 7
	leases := make([]*lease, n)
	for i := range leases {
		leases[i] = holdAt(o, r, fmt.Sprintf("lease:%d", i), lt, start)
	}
	o.mu.Lock()
	r.armTrustLocked()
	o.mu.Unlock()
	clk.Set(start.Add(time.Second))
	for _, x := range leases[:n/2] { // renewed a second in: windows end at 9 s
		x.renewed(clk.Now())
	}
	clk.Advance(lt.TTL - lt.Margin - time.Second) // to 8 s: the first windows are over
	o.mu.Lock()
	require.Equal(t, n-n/2, len(o.expired))
	for _, x := range leases[:n/2] {
		require.True(t, r.trust.Queued(x), "%s was renewed", x.name)
	}
	require.Equal(t, n/2, r.trust.Len())
	o.mu.Unlock()
	clk.Advance(time.Second) // to 9 s: the renewed windows are over
	o.mu.Lock()
	defer o.mu.Unlock()
	require.Equal(t, n, len(o.expired), "the timer was set for the renewed leases' windows")
	require.Zero(t, r.trust.Len())
}
