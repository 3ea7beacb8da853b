package fencelock

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/timing/timingtest"
)

// The lessor's timing: the durations its options give a lease, and its heartbeat and trust
// watch on a manual clock (the schedule itself is tested in internal/timing).

func TestLeaseTimesFromOptions(t *testing.T) {
	for _, tc := range []struct {
		desc    string
		opts    []LessorOption
		ttl     time.Duration
		want    leaseTimes
		wantArg string // the ArgumentError's argument, when the TTL does not fit the options
	}{
		{"Defaults", nil, 9 * time.Second, leaseTimes{TTL: 9 * time.Second, Heartbeat: 3 * time.Second, Margin: 900 * time.Millisecond}, ""},
		{"FixedHeartbeat", []LessorOption{WithHeartbeatInterval(time.Second)}, 9 * time.Second, leaseTimes{TTL: 9 * time.Second, Heartbeat: time.Second, Margin: 900 * time.Millisecond}, ""},
		{"NoHeartbeat", []LessorOption{WithoutHeartbeat()}, 9 * time.Second, leaseTimes{TTL: 9 * time.Second, Margin: 900 * time.Millisecond}, ""},
		{"FixedMargin", []LessorOption{WithSafetyMargin(0)}, 9 * time.Second, leaseTimes{TTL: 9 * time.Second, Heartbeat: 3 * time.Second}, ""},
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

// The trust watch ends each lease at the end of its trust window on the lessor's clock, and
// follows a renewal's extension; Err ends a lease past its window on its own. Driven by a
// manual clock: no server, no waiting.
func TestTrustWatchOnManualClock(t *testing.T) {
	clk := timingtest.NewManualClock()
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
	clk.Advance(899 * time.Millisecond)
	require.NoError(t, a.Err())
	b.renewed(clk.Now(), time.Time{}) // b's window now ends at 1799ms
	clk.Advance(time.Millisecond)
	select {
	case <-a.Done():
	default:
		t.Fatal("a's Done is open at the end of its trust window")
	}
	require.ErrorIs(t, a.Err(), ErrTrustWindowExpired)
	require.NoError(t, b.Err(), "b was renewed: its window moved on")
	clk.Advance(898 * time.Millisecond)
	require.NoError(t, b.Err())
	clk.Advance(time.Millisecond)
	require.ErrorIs(t, b.Err(), ErrTrustWindowExpired)

	c := grant("c")
	clk.Set(clk.Now().Add(time.Second)) // past c's window, no timer run yet
	var lost *LeaseLostError
	require.ErrorAs(t, c.Err(), &lost, "Err reads the clock itself")
	require.ErrorIs(t, lost.Cause, ErrTrustWindowExpired)
	l.mu.Lock()
	require.Empty(t, l.active, "every lease that ended left the held set")
	require.False(t, l.renewer.Heartbeat().RunningLocked(), "a lessor that holds nothing kept its heartbeat running")
	l.mu.Unlock()
	_, armed := l.renewer.Heartbeat().Armed()
	require.False(t, armed, "a lessor that holds nothing kept a heartbeat timer armed")
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

// The heartbeat's loop is armed, for the first renewal, by the first lease held, and disarmed
// when the last one ends: a lessor that holds nothing keeps no timer (no server: the lease ends
// before its renewal is due).
func TestHeartbeatArmedWhileHeld(t *testing.T) {
	clk := timingtest.NewManualClock()
	cfg, err := newLessorConfig(nil)
	require.NoError(t, err)
	cfg.clock = clk
	l := newLessor(nil, cfg)
	lt, err := cfg.times(9 * time.Second) // heartbeat 3 s, queued 750 ms early
	require.NoError(t, err)
	lease := newLease(l, "a", 1, lt, clk.Now(), time.Time{})
	l.add(lease)
	at, armed := l.renewer.Heartbeat().Armed()
	require.True(t, armed)
	require.Equal(t, clk.Now().Add(2250*time.Millisecond), at, "armed for the first renewal")
	require.True(t, lease.end(ErrReleased))
	_, armed = l.renewer.Heartbeat().Armed()
	require.False(t, armed, "the heartbeat's timer stayed armed with nothing held")
}
