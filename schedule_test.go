package fencelock

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The timing core, table-tested on fixed times: no server, no wall clock.

func TestLeaseTimesFromOptions(t *testing.T) {
	for _, tc := range []struct {
		desc    string
		opts    []LessorOption
		ttl     time.Duration
		want    leaseTimes
		wantArg string // the ArgumentError's argument, when the TTL does not fit the options
	}{
		{"Defaults", nil, 9 * time.Second, leaseTimes{ttl: 9 * time.Second, heartbeat: 3 * time.Second, margin: 900 * time.Millisecond}, ""},
		{"FixedHeartbeat", []LessorOption{WithHeartbeatInterval(time.Second)}, 9 * time.Second, leaseTimes{ttl: 9 * time.Second, heartbeat: time.Second, margin: 900 * time.Millisecond}, ""},
		{"NoHeartbeat", []LessorOption{WithoutHeartbeat()}, 9 * time.Second, leaseTimes{ttl: 9 * time.Second, margin: 900 * time.Millisecond}, ""},
		{"FixedMargin", []LessorOption{WithSafetyMargin(0)}, 9 * time.Second, leaseTimes{ttl: 9 * time.Second, heartbeat: 3 * time.Second}, ""},
		{"MarginNotUnderTTL", []LessorOption{WithSafetyMargin(time.Second)}, time.Second, leaseTimes{}, "WithSafetyMargin"},
		{"MarginLeavesNoRoomForDefaultHeartbeat", []LessorOption{WithSafetyMargin(700 * time.Millisecond)}, time.Second, leaseTimes{}, "WithSafetyMargin"},
		{"HeartbeatNotUnderTTLLessMargin", []LessorOption{WithHeartbeatInterval(time.Second)}, 1050 * time.Millisecond, leaseTimes{}, "WithHeartbeatInterval"},
		{"TTLTooShort", nil, MinTTL - 1, leaseTimes{}, "ttl"},
		{"TTLTooLong", nil, MaxTTL + 1, leaseTimes{}, "ttl"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			cfg, err := newLessorConfig(tc.opts)
			require.NoError(t, err)
			got, err := cfg.times(tc.ttl)
			if tc.wantArg != "" {
				var ae *ArgumentError
				require.ErrorAs(t, err, &ae)
				require.Equal(t, tc.wantArg, ae.Arg)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestSchedule(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	ms := time.Millisecond
	lt := leaseTimes{ttl: 9 * time.Second, heartbeat: 3 * time.Second, margin: 900 * ms}
	short := leaseTimes{ttl: 30 * ms, heartbeat: 12 * ms, margin: 3 * ms}
	none := leaseTimes{ttl: 9 * time.Second, margin: 900 * ms}

	t.Run("TrustEnd", func(t *testing.T) {
		require.Equal(t, t0.Add(8100*ms), lt.trustEnd(t0), "sent + TTL - margin")
		require.Equal(t, t0.Add(27*ms), short.trustEnd(t0))
	})
	t.Run("NextRenewal", func(t *testing.T) {
		require.Equal(t, t0.Add(3*time.Second), lt.nextRenewal(t0), "one heartbeat after the send")
		require.True(t, none.nextRenewal(t0).IsZero(), "no heartbeat, no renewal")
	})
	t.Run("QueueAt", func(t *testing.T) {
		require.Equal(t, t0.Add(-750*ms), lt.queueAt(t0), "a quarter heartbeat early")
	})
	t.Run("RetryAt", func(t *testing.T) {
		require.Equal(t, t0.Add(1500*ms), lt.retryAt(t0), "half a heartbeat")
		require.Equal(t, t0.Add(8*ms), short.retryAt(t0), "at least a quarter heartbeat plus 5ms: 3ms + 5ms > 6ms")
		require.True(t, none.retryAt(t0).IsZero())
	})
	t.Run("Verdict", func(t *testing.T) {
		for _, tc := range []struct {
			desc                  string
			lt                    leaseTimes
			now, next, trustUntil time.Time
			want                  renewVerdict
		}{
			{"Due", lt, t0, t0.Add(750 * ms), t0.Add(5 * time.Second), renewNow},
			{"Overdue", lt, t0, t0.Add(-time.Second), t0.Add(5 * time.Second), renewNow},
			{"MovedLater", lt, t0, t0.Add(751 * ms), t0.Add(5 * time.Second), renewLater},
			{"WindowEndsWithinHeartbeatEighth", lt, t0, t0, t0.Add(375 * ms), renewLapse},
			{"WindowEndsJustPastHeartbeatEighth", lt, t0, t0, t0.Add(376 * ms), renewNow},
			{"WindowEndsWithinSlack", short, t0, t0, t0.Add(5 * ms), renewLapse},
			{"WindowEndsPastSlack", short, t0, t0, t0.Add(6 * ms), renewNow},
			{"WindowOver", lt, t0, t0, t0.Add(-time.Second), renewLapse},
		} {
			t.Run(tc.desc, func(t *testing.T) {
				require.Equal(t, tc.want, tc.lt.verdict(tc.now, tc.next, tc.trustUntil))
			})
		}
	})
	t.Run("QueueWait", func(t *testing.T) {
		const live = 3 * time.Second // a third: 1 s
		for _, tc := range []struct {
			desc      string
			listening bool
			ahead     int64
			remaining time.Duration
			want      time.Duration
		}{
			{"PollingHolderUnknown", false, 0, 0, 100 * ms},
			{"PollingHolderExpiresSooner", false, 3, 30 * ms, 30*ms + 2*ms},
			{"PollingHolderExpiresLater", false, 0, 200 * ms, 100 * ms},
			{"ListeningBehindOthers", true, 2, 30 * ms, time.Second},
			{"ListeningHeadHolderExpiresSooner", true, 0, 30 * ms, 30*ms + 2*ms},
			{"ListeningHeadHolderExpiresLater", true, 0, 5 * time.Second, time.Second},
			{"ListeningHeadFreeButLocked", true, 0, 0, 100 * ms},
		} {
			t.Run(tc.desc, func(t *testing.T) {
				require.Equal(t, tc.want, queueWait(tc.listening, tc.ahead, tc.remaining, live, 100*ms, 2*ms))
			})
		}
	})
	t.Run("HandedGrantSent", func(t *testing.T) {
		// The waiter's statement: sent at t0 on the local clock; the database clock read S
		// during it. The database clock runs d ahead of the local one, and the statement
		// reached the server r after it was sent, so S = t0 + r + d.
		const ttl, margin = 10 * time.Second, time.Second
		lt := leaseTimes{ttl: ttl, margin: margin}
		for _, tc := range []struct {
			desc     string
			ahead    time.Duration // d: database clock minus local clock
			transit  time.Duration // r: send to the server's reading
			grantLag time.Duration // the hand-off's start, after S on the database clock
			now      time.Duration // local now, after t0
		}{
			{"SameClocks", 0, ms, 50 * ms, 100 * ms},
			{"DatabaseAhead", 5 * time.Second, 2 * ms, 0, 20 * ms},
			{"DatabaseBehind", -5 * time.Second, 2 * ms, 300 * ms, 400 * ms},
			{"SlowStatement", 0, 800 * ms, 10 * ms, 900 * ms},
			{"GrantBeforeTheStatement", 0, ms, -2 * time.Second, 10 * ms},
		} {
			t.Run(tc.desc, func(t *testing.T) {
				t0 := time.Now()
				serverNow := t0.Add(tc.transit + tc.ahead)
				grantStart := serverNow.Add(tc.grantLag) // database clock
				expires := grantStart.Add(ttl)
				now := t0.Add(tc.now)
				sent, ok := handedGrantSent(t0, serverNow, expires, ttl, now)
				require.True(t, ok)
				// The server expires the grant at local time expires - d: the window must end
				// a margin before that, and by no more than the statement's transit.
				localExpiry := expires.Add(-tc.ahead)
				end := lt.trustEnd(sent)
				require.False(t, end.After(localExpiry.Add(-margin)), "window ends %v after the local expiry minus the margin", end.Sub(localExpiry.Add(-margin)))
				if !sent.Equal(now) {
					require.Equal(t, tc.transit, localExpiry.Add(-margin).Sub(end), "the window is shortened by the transit only")
				}
				require.False(t, sent.After(now))
			})
		}
		_, ok := handedGrantSent(time.Time{}, time.Now(), time.Now(), time.Second, time.Now())
		require.False(t, ok, "no statement to map through")
	})
	t.Run("QueueLiveness", func(t *testing.T) {
		require.Equal(t, 250*ms, queueLiveness(0), "RunLocked")
		require.Equal(t, 250*ms, queueLiveness(10*ms))
		require.Equal(t, 2*time.Second, queueLiveness(2*time.Second))
		require.Equal(t, 5*time.Second, queueLiveness(time.Minute))
	})
}

// The trust watch ends each lease at the end of its trust window on the lessor's clock, and
// follows a renewal's extension; Err ends a lease past its window on its own. Driven by a
// manual clock: no server, no waiting.
func TestTrustWatchOnManualClock(t *testing.T) {
	clk := newManualClock()
	cfg, err := newLessorConfig([]LessorOption{WithoutHeartbeat()})
	require.NoError(t, err)
	cfg.clock = clk
	l := newLessor(nil, cfg)
	lt, err := cfg.times(time.Second) // trust window 900ms
	require.NoError(t, err)
	grant := func(name string) *Lease {
		lease := newLease(l, name, 1, lt, clk.Now(), time.Time{})
		l.add(lease)
		return lease
	}
	a, b := grant("a"), grant("b")
	clk.advance(899 * time.Millisecond)
	require.NoError(t, a.Err())
	b.renewed(clk.Now(), time.Time{}) // b's window now ends at 1799ms
	clk.advance(time.Millisecond)
	select {
	case <-a.Done():
	default:
		t.Fatal("a's Done is open at the end of its trust window")
	}
	require.ErrorIs(t, a.Err(), ErrTrustWindowExpired)
	require.NoError(t, b.Err(), "b was renewed: its window moved on")
	clk.advance(898 * time.Millisecond)
	require.NoError(t, b.Err())
	clk.advance(time.Millisecond)
	require.ErrorIs(t, b.Err(), ErrTrustWindowExpired)

	c := grant("c")
	clk.mu.Lock()
	clk.now = clk.now.Add(time.Second) // past c's window, no timer run yet
	clk.mu.Unlock()
	var lost *LeaseLostError
	require.ErrorAs(t, c.Err(), &lost, "Err reads the clock itself")
	require.ErrorIs(t, lost.Cause, ErrTrustWindowExpired)
	l.mu.Lock()
	require.Empty(t, l.active, "every lease that ended left the held set")
	require.False(t, l.heartbeat.running, "a lessor that holds nothing kept its heartbeat running")
	l.mu.Unlock()
	require.False(t, l.heartbeat.armed, "a lessor that holds nothing kept a heartbeat timer armed")
}

// The loop idiom, on a manual clock (its timers run inside advance, so every round here runs
// synchronously): a round runs at the time asked, the next at the time the step returned, an
// earlier request moves it, a later one does not; a round asked for while one runs follows it;
// stopping, by the owner or by a step that finds nothing held, leaves no round armed, and the
// loop can be armed again.
func TestLoopOnManualClock(t *testing.T) {
	clk := newManualClock()
	t0 := clk.Now()
	var mu sync.Mutex // the owner's
	held := true
	var steps []time.Duration // when each round ran, since t0
	var during func()         // runs inside the next step, as a grant added meanwhile would
	var lp *loop
	lp = newLoop(clk, func(now time.Time) (time.Time, bool) {
		if f := during; f != nil {
			during = nil
			f()
		}
		mu.Lock()
		defer mu.Unlock()
		if !held {
			lp.stopLocked()
			return now, false
		}
		steps = append(steps, now.Sub(t0))
		return now.Add(time.Second), true
	})
	start := func(at time.Duration) {
		mu.Lock()
		require.True(t, lp.startLocked())
		require.False(t, lp.startLocked(), "a running loop is not started twice")
		mu.Unlock()
		lp.wakeAt(t0.Add(at))
	}
	ms := time.Millisecond

	start(time.Second)
	clk.advance(999 * ms)
	require.Empty(t, steps, "a round ran before its time")
	clk.advance(ms)
	require.Equal(t, []time.Duration{time.Second}, steps)
	clk.advance(time.Second)
	require.Equal(t, []time.Duration{time.Second, 2 * time.Second}, steps, "the next round runs when the step asked")

	lp.wakeAt(t0.Add(2100 * ms)) // earlier than the armed 3 s
	lp.wakeAt(t0.Add(2900 * ms)) // later than that: no change
	clk.advance(200 * ms)
	require.Equal(t, 2100*ms, steps[2], "an earlier round asked for moved the next one")

	during = func() { lp.wakeAt(clk.Now()) } // asked for while a round runs
	clk.advance(time.Second)
	require.Equal(t, []time.Duration{3100 * ms, 3100 * ms}, steps[3:], "a round asked for during a round runs right after it")

	mu.Lock()
	held = false
	lp.stopLocked() // the owner's last grant ended
	mu.Unlock()
	require.False(t, lp.armed, "a stopped loop left its timer armed")
	clk.advance(10 * time.Second)
	require.Len(t, steps, 5, "a stopped loop ran a round")

	held = true
	start(14 * time.Second)
	clk.advance(time.Second)
	require.Len(t, steps, 6, "a loop armed again runs")
	mu.Lock()
	held = false // the next step finds nothing held and stops the loop itself
	mu.Unlock()
	clk.advance(time.Second)
	clk.advance(10 * time.Second)
	require.Len(t, steps, 6)
	mu.Lock()
	require.False(t, lp.running)
	mu.Unlock()
	require.False(t, lp.armed, "a loop stopped by its step left its timer armed")
}

// Options are typed per constructor: an option of one does not satisfy the other's option
// type, so passing it does not compile; WithLogger satisfies both.
func TestOptionsTypedPerConstructor(t *testing.T) {
	lessorOnly := map[string]any{
		"WithHolder": WithHolder("h"), "WithHeartbeatInterval": WithHeartbeatInterval(time.Second),
		"WithoutHeartbeat": WithoutHeartbeat(), "WithSafetyMargin": WithSafetyMargin(0),
		"WithBackoff": WithBackoff(ExponentialBackoff(time.Millisecond, time.Second)),
	}
	advisoryOnly := map[string]any{
		"WithNamespace": WithNamespace("n"), "WithKeyHash": WithKeyHash(SHA256KeyHash),
		"WithWatchdogInterval": WithWatchdogInterval(time.Second), "WithMaxSessionLocks": WithMaxSessionLocks(1),
		"WithFencingTokens": WithFencingTokens(),
	}
	for name, o := range lessorOnly {
		_, isAdvisory := o.(AdvisoryOption)
		require.False(t, isAdvisory, "%s is an AdvisoryOption", name)
		_, isLessor := o.(LessorOption)
		require.True(t, isLessor, name)
	}
	for name, o := range advisoryOnly {
		_, isLessor := o.(LessorOption)
		require.False(t, isLessor, "%s is a LessorOption", name)
		_, isAdvisory := o.(AdvisoryOption)
		require.True(t, isAdvisory, name)
	}
	var both any = WithLogger(nil)
	_, isLessor := both.(LessorOption)
	_, isAdvisory := both.(AdvisoryOption)
	require.True(t, isLessor && isAdvisory, "WithLogger applies to both")
}

// The loop on the system clock under concurrent grants and ends: rounds never overlap, a
// stopped loop is armed again by the next grant, and a grant held at the end gets its round.
func TestLoopConcurrentStartStop(t *testing.T) {
	var mu sync.Mutex // the owner's
	held := 0
	var inRound atomic.Int32
	rounds := make(chan struct{}, 1)
	var lp *loop
	lp = newLoop(systemClock{}, func(now time.Time) (time.Time, bool) {
		if inRound.Add(1) != 1 {
			t.Error("two rounds ran at once")
		}
		defer inRound.Add(-1)
		mu.Lock()
		defer mu.Unlock()
		if held == 0 {
			lp.stopLocked()
			return now, false
		}
		select {
		case rounds <- struct{}{}:
		default:
		}
		return now.Add(time.Millisecond), true
	})
	grant := func() {
		mu.Lock()
		held++
		start := lp.startLocked()
		mu.Unlock()
		if start {
			lp.wakeAt(time.Now())
		}
	}
	end := func() {
		mu.Lock()
		defer mu.Unlock()
		if held--; held == 0 {
			lp.stopLocked()
		}
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 2000 {
				grant()
				end()
			}
		})
	}
	wg.Wait()
	mu.Lock()
	require.Zero(t, held)
	mu.Unlock()
	for len(rounds) > 0 {
		<-rounds
	}
	grant()
	select {
	case <-rounds:
	case <-time.After(5 * time.Second):
		t.Fatal("a grant held after the churn got no round")
	}
	end()
}

// The heartbeat's loop is armed, for the first renewal, by the first lease held, and disarmed
// when the last one ends: a lessor that holds nothing keeps no timer (no server: the lease ends
// before its renewal is due).
func TestHeartbeatArmedWhileHeld(t *testing.T) {
	clk := newManualClock()
	cfg, err := newLessorConfig(nil)
	require.NoError(t, err)
	cfg.clock = clk
	l := newLessor(nil, cfg)
	lt, err := cfg.times(9 * time.Second) // heartbeat 3 s, queued 750 ms early
	require.NoError(t, err)
	lease := newLease(l, "a", 1, lt, clk.Now(), time.Time{})
	l.add(lease)
	l.heartbeat.mu.Lock()
	armed, at := l.heartbeat.armed, l.heartbeat.at
	l.heartbeat.mu.Unlock()
	require.True(t, armed)
	require.Equal(t, clk.Now().Add(2250*time.Millisecond), at, "armed for the first renewal")
	require.True(t, lease.end(ErrReleased))
	l.heartbeat.mu.Lock()
	defer l.heartbeat.mu.Unlock()
	require.False(t, l.heartbeat.armed, "the heartbeat's timer stayed armed with nothing held")
}
