package ui_test

// The timeline's names for how grants end, from real lessors' behaviour.

import (
	"fmt"
	"html"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
	"github.com/fencelock/fencelock/ui"
)

var grantRow = regexp.MustCompile(`<tr[^>]*><td>[0-9:.]+</td><td class="holder">([^<]*)</td><td class="token">([0-9]+)</td><td>[0-9:.]*</td><td>([a-z ]+)</td></tr>`)

type grantSeen struct {
	Holder string
	Token  int64
	How    string
}

func grantsOf(data string) []grantSeen {
	var out []grantSeen
	for _, m := range grantRow.FindAllStringSubmatch(data, -1) {
		var tok int64
		fmt.Sscan(m[2], &tok)
		out = append(out, grantSeen{html.UnescapeString(m[1]), tok, m[3]})
	}
	return out
}

// rvAwaitGrants waits for the name page's stream to show want (in order), and returns the last
// grants seen when it does not within limit.
func awaitGrants(t *testing.T, ch <-chan string, limit time.Duration, want []grantSeen) []grantSeen {
	t.Helper()
	deadline := time.After(limit)
	var last []grantSeen
	for {
		select {
		case d, ok := <-ch:
			if !ok {
				return last
			}
			last = grantsOf(d)
			if fmt.Sprint(last) == fmt.Sprint(want) {
				return last
			}
		case <-deadline:
			return last
		}
	}
}

func checkGrants(t *testing.T, label string, got, want []grantSeen) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%s:\n got  %v\n want %v", label, got, want)
	} else {
		t.Logf("ok %s: %v", label, got)
	}
}

// TestTimelineNamesHowGrantsEnd: release, expiry, hand-off by release, hand-off after expiry,
// forced release (SQL, no waiter), forced release (SQL, handed on), forced release by the view,
// a row deleted while held, many grants.
func TestTimelineNamesHowGrantsEnd(t *testing.T) {
	t.Parallel()
	b := testkit.Setup(t)
	base, good := doorOpen(t, b, ui.WithPollAlways())
	a := fencetest.NewLessor(t, b.Pool, "A")
	bl := fencetest.NewLessor(t, b.Pool, "B")
	sleepy := fencetest.NewLessor(t, b.Pool, "S", fencelock.WithoutHeartbeat())
	ctx := b.Ctx
	tok := func(l *fencelock.Lease) int64 { return int64(l.Token()) }
	// open opens the event stream of name's page, then grants name to lessor for ttl.
	open := func(t *testing.T, lessor *fencelock.Lessor, name string, ttl time.Duration) (<-chan string, *fencelock.Lease) {
		t.Helper()
		s := events(t, ctx, base, "name", name)
		l, err := lessor.TryAcquire(ctx, name, ttl)
		require.NoError(t, err)
		return s, l
	}
	// settle waits until the name's page shows the grant held: a poll saw it.
	settle := func(s <-chan string, holder string, l *fencelock.Lease) {
		awaitGrants(t, s, 10*time.Second, []grantSeen{{holder, tok(l), "held"}})
	}
	// grantToB has B wait for name; the channel delivers B's grant.
	grantToB := func(name string) <-chan *fencelock.Lease {
		return testkit.Async(func() *fencelock.Lease { l2, _ := bl.Acquire(ctx, name, time.Minute); return l2 })
	}
	// expect checks that the name's page shows want within 5 s.
	expect := func(t *testing.T, s <-chan string, label string, want ...grantSeen) {
		t.Helper()
		checkGrants(t, label, awaitGrants(t, s, 5*time.Second, want), want)
	}

	t.Run("Release", func(t *testing.T) {
		s, l := open(t, a, "n:rel", time.Minute)
		settle(s, "A", l)
		require.NoError(t, l.Release(ctx))
		expect(t, s, "release", grantSeen{"A", tok(l), "released"})
	})
	t.Run("Expiry", func(t *testing.T) {
		s, l := open(t, sleepy, "n:exp", time.Second)
		expect(t, s, "expiry", grantSeen{"S", tok(l), "expired"})
	})
	t.Run("HandOffByRelease", func(t *testing.T) {
		s, l := open(t, a, "n:ho", time.Minute)
		got := grantToB("n:ho")
		testkit.AwaitWaiters(t, ctx, b.Pool, "n:ho", 1)
		settle(s, "A", l)
		require.NoError(t, l.Release(ctx))
		l2 := testkit.Receive(t, got, 10*time.Second, "B's grant")
		expect(t, s, "hand-off by release", grantSeen{"A", tok(l), "released"}, grantSeen{"B", tok(l2), "held"})
		require.NoError(t, l2.Release(ctx))
	})
	t.Run("HandOffAfterExpiry", func(t *testing.T) {
		s, l := open(t, sleepy, "n:hx", time.Second)
		l2 := testkit.Receive(t, grantToB("n:hx"), 10*time.Second, "B's grant")
		// "expired" when a poll saw S's row lapse before B's grant replaced it, else "ended":
		// the rows cannot tell a lapse from a renewal and a release then.
		var seen []grantSeen
		awaitEvent(t, s, 10*time.Second, "B's grant after S's", func(d string) bool {
			seen = grantsOf(d)
			return len(seen) == 2 && seen[1] == grantSeen{"B", tok(l2), "held"}
		})
		require.Equal(t, []any{"S", tok(l)}, []any{seen[0].Holder, seen[0].Token})
		require.Contains(t, []string{"expired", "ended"}, seen[0].How)
		require.NoError(t, l2.Release(ctx))
	})
	t.Run("ForcedSQLNoWaiter", func(t *testing.T) {
		s, l := open(t, a, "n:fs", time.Minute)
		settle(s, "A", l)
		var nt int64
		require.NoError(t, b.Pool.QueryRow(ctx, `SELECT new_token FROM fencelock.force_release('n:fs', '{}', $1)`, tok(l)).Scan(&nt))
		expect(t, s, "forced (SQL, no waiter)", grantSeen{"A", tok(l), "forced release"}, grantSeen{"fencelock force-release", nt, "fenced"})
	})
	t.Run("ForcedSQLHandedOn", func(t *testing.T) {
		s, l := open(t, a, "n:fh", time.Minute)
		got := grantToB("n:fh")
		testkit.AwaitWaiters(t, ctx, b.Pool, "n:fh", 1)
		settle(s, "A", l)
		_, err := b.Pool.Exec(ctx, `SELECT fencelock.force_release('n:fh', '{}', $1)`, tok(l))
		require.NoError(t, err)
		l2 := testkit.Receive(t, got, 10*time.Second, "B's grant")
		expect(t, s, "forced (SQL, handed on)", grantSeen{"A", tok(l), "released"}, grantSeen{"B", tok(l2), "held"}) // documented: shows as a release
		require.NoError(t, l2.Release(ctx))
	})
	t.Run("ForcedByView", func(t *testing.T) {
		s, l := open(t, a, "n:fv", time.Minute)
		settle(s, "A", l)
		code, msg := releaseForm(t, ctx, base, good, "n:fv", "A", tok(l))
		require.Equal(t, 200, code, msg)
		var nt int64
		require.NoError(t, b.Pool.QueryRow(ctx, `SELECT token FROM fencelock.leases WHERE name='n:fv'`).Scan(&nt))
		expect(t, s, "forced by the view", grantSeen{"A", tok(l), "forced release"}, grantSeen{"fencelock force-release", nt, "fenced"})
	})
	t.Run("RowDeletedWhileHeld", func(t *testing.T) {
		s, l := open(t, bl, "n:del", time.Minute)
		settle(s, "B", l)
		_, err := b.Pool.Exec(ctx, `DELETE FROM fencelock.leases WHERE name='n:del'`)
		require.NoError(t, err)
		_, err = fencelock.SweepLeases(ctx, b.Pool, fencelock.MinSweepGrace)
		require.NoError(t, err)
		expect(t, s, "row deleted", grantSeen{"B", tok(l), "ended"})
	})
}

// TestTimelineNeverCallsARenewedReleaseExpired: a holder whose heartbeat renewed after the
// last poll and then released, followed by another holder, may be named "released" or
// "ended" (the polls cannot tell), never "expired".
func TestTimelineNeverCallsARenewedReleaseExpired(t *testing.T) {
	t.Parallel()
	b := testkit.Setup(t)
	h, err := ui.New(b.Pool, ui.WithInterval(3*time.Second), ui.WithPollAlways())
	require.NoError(t, err)
	base := serve(t, h)
	s := events(t, b.Ctx, base, "name", "n:long")
	// TTL 2 s renewed every 1/3 s: the poll's expiry (at most 2 s ahead) is passed before its
	// next poll 3 s later, and a renewal may come 1.5 s late on a loaded machine without the
	// lease being lost (with a 1 s TTL, 0.6 s late lost it and failed the Release).
	l, err := fencetest.NewLessor(t, b.Pool, "A", fencelock.WithHeartbeatInterval(time.Second/3)).TryAcquire(b.Ctx, "n:long", 2*time.Second)
	require.NoError(t, err)
	renewed := regexp.MustCompile(`(?:ok|late) \(([0-9]+) renewals\)`)
	var seenRenewals int64
	awaitEvent(t, s, 10*time.Second, "A held", func(d string) bool {
		m := renewed.FindStringSubmatch(d)
		if m == nil || fmt.Sprint(grantsOf(d)) != fmt.Sprint([]grantSeen{{"A", int64(l.Token()), "held"}}) {
			return false
		}
		seenRenewals, err = strconv.ParseInt(m[1], 10, 64)
		return err == nil
	})
	testkit.WaitFor(t, b.Ctx, "A's expiry renewed past the one the poll saw", func() bool {
		var renewals int64
		require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT renewals FROM fencelock.leases WHERE name = 'n:long'`).Scan(&renewals))
		return renewals >= seenRenewals+7 // seven renewals a third of a second apart: past the expiry seen
	})
	require.NoError(t, l.Release(b.Ctx))
	l2, err := fencetest.NewLessor(t, b.Pool, "C").TryAcquire(b.Ctx, "n:long", time.Minute)
	require.NoError(t, err)
	var got []grantSeen
	awaitEvent(t, s, 10*time.Second, "C's grant", func(d string) bool {
		got = grantsOf(d)
		return len(got) == 2 && got[1] == grantSeen{"C", int64(l2.Token()), "held"}
	})
	require.Equal(t, "A", got[0].Holder)
	require.Contains(t, []string{"released", "ended"}, got[0].How, "%v", got)
}
