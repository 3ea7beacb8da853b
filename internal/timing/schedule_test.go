package timing_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/timing"
)

// The schedule, table-tested on fixed times: no server, no wall clock.

func TestSchedule(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	ms := time.Millisecond
	lt := timing.Times{TTL: 9 * time.Second, Heartbeat: 3 * time.Second, Margin: 900 * ms}
	short := timing.Times{TTL: 30 * ms, Heartbeat: 12 * ms, Margin: 3 * ms}
	none := timing.Times{TTL: 9 * time.Second, Margin: 900 * ms}

	t.Run("TrustEnd", func(t *testing.T) {
		require.Equal(t, t0.Add(8100*ms), lt.TrustEnd(t0), "sent + TTL - margin")
		require.Equal(t, t0.Add(27*ms), short.TrustEnd(t0))
	})
	t.Run("NextRenewal", func(t *testing.T) {
		require.Equal(t, t0.Add(3*time.Second), lt.NextRenewal(t0), "one heartbeat after the send")
		require.True(t, none.NextRenewal(t0).IsZero(), "no heartbeat, no renewal")
	})
	t.Run("QueueAt", func(t *testing.T) {
		require.Equal(t, t0.Add(-750*ms), lt.QueueAt(t0), "a quarter heartbeat early")
	})
	t.Run("RetryAt", func(t *testing.T) {
		require.Equal(t, t0.Add(1500*ms), lt.RetryAt(t0), "half a heartbeat")
		require.Equal(t, t0.Add(8*ms), short.RetryAt(t0), "at least a quarter heartbeat plus 5ms: 3ms + 5ms > 6ms")
		require.True(t, none.RetryAt(t0).IsZero())
	})
	t.Run("Verdict", func(t *testing.T) {
		for _, tc := range []struct {
			desc                  string
			lt                    timing.Times
			now, next, trustUntil time.Time
			want                  timing.Verdict
		}{
			{"Due", lt, t0, t0.Add(750 * ms), t0.Add(5 * time.Second), timing.RenewNow},
			{"Overdue", lt, t0, t0.Add(-time.Second), t0.Add(5 * time.Second), timing.RenewNow},
			{"MovedLater", lt, t0, t0.Add(751 * ms), t0.Add(5 * time.Second), timing.RenewLater},
			{"WindowEndsWithinHeartbeatEighth", lt, t0, t0, t0.Add(375 * ms), timing.RenewLapse},
			{"WindowEndsJustPastHeartbeatEighth", lt, t0, t0, t0.Add(376 * ms), timing.RenewNow},
			{"WindowEndsWithinSlack", short, t0, t0, t0.Add(5 * ms), timing.RenewLapse},
			{"WindowEndsPastSlack", short, t0, t0, t0.Add(6 * ms), timing.RenewNow},
			{"WindowOver", lt, t0, t0, t0.Add(-time.Second), timing.RenewLapse},
		} {
			t.Run(tc.desc, func(t *testing.T) {
				require.Equal(t, tc.want, tc.lt.Verdict(tc.now, tc.next, tc.trustUntil))
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
				require.Equal(t, tc.want, timing.QueueWait(tc.listening, tc.ahead, tc.remaining, live, 100*ms, 2*ms))
			})
		}
	})
	t.Run("HandedGrantSent", func(t *testing.T) {
		// The waiter's statement: sent at t0 on the local clock; the database clock read S
		// during it. The database clock runs d ahead of the local one, and the statement
		// reached the server r after it was sent, so S = t0 + r + d.
		const ttl, margin = 10 * time.Second, time.Second
		lt := timing.Times{TTL: ttl, Margin: margin}
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
				sent, ok := timing.HandedGrantSent(t0, serverNow, expires, ttl, now)
				require.True(t, ok)
				// The server expires the grant at local time expires - d: the window must end
				// a margin before that, and by no more than the statement's transit.
				localExpiry := expires.Add(-tc.ahead)
				end := lt.TrustEnd(sent)
				require.False(t, end.After(localExpiry.Add(-margin)), "window ends %v after the local expiry minus the margin", end.Sub(localExpiry.Add(-margin)))
				if !sent.Equal(now) {
					require.Equal(t, tc.transit, localExpiry.Add(-margin).Sub(end), "the window is shortened by the transit only")
				}
				require.False(t, sent.After(now))
			})
		}
		_, ok := timing.HandedGrantSent(time.Time{}, time.Now(), time.Now(), time.Second, time.Now())
		require.False(t, ok, "no statement to map through")
	})
	t.Run("QueueLiveness", func(t *testing.T) {
		require.Equal(t, 250*ms, timing.QueueLiveness(0), "RunLocked")
		require.Equal(t, 250*ms, timing.QueueLiveness(10*ms))
		require.Equal(t, 2*time.Second, timing.QueueLiveness(2*time.Second))
		require.Equal(t, 5*time.Second, timing.QueueLiveness(time.Minute))
	})
}
