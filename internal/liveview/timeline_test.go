package liveview

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 11, 27, 4, 0, 0, 0, time.UTC)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

// grant is a lease row: name held by holder with token, granted at from, expiring at until.
func grant(name, holder string, token int64, from, until float64) Lease {
	return Lease{Name: name, Holder: holder, Token: token, AcquiredAt: at(from), ExpiresAt: at(until)}
}

func snap(now float64, rows ...Lease) *Snapshot {
	return &Snapshot{Now: at(now), Leases: rows, Cut: map[string]bool{}}
}

// ended is what a test expects of a span: holder, token, how it ended ("" while held), when.
type ended struct {
	holder string
	token  int64
	how    string
	end    float64
	mark   bool
}

func requireSpans(t *testing.T, tl *Timeline, name string, want ...ended) {
	t.Helper()
	var got []ended
	for _, s := range tl.Spans(name) {
		e := ended{holder: s.Holder, token: s.Token, how: s.Ended, mark: s.Mark}
		if !s.End.IsZero() {
			e.end = s.End.Sub(t0).Seconds()
		}
		got = append(got, e)
	}
	require.Equal(t, want, got)
}

func TestTimeline(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		polls []*Snapshot
		want  []ended
	}{
		{"HeldThenReleased", []*Snapshot{
			snap(1, grant("a", "w1", 10, 0, 10)),
			snap(2, grant("a", "w1", 10, 0, 1.5)), // release: expires_at moved back to its clock
		}, []ended{{"w1", 10, endReleased, 1.5, false}}},
		{"HeldThenExpired", []*Snapshot{
			snap(1, grant("a", "w1", 10, 0, 10)),
			snap(11, grant("a", "w1", 10, 0, 10)),
		}, []ended{{"w1", 10, endExpired, 10, false}}},
		{"RenewedThenExpired", []*Snapshot{
			snap(1, grant("a", "w1", 10, 0, 10)),
			snap(6, func() Lease { l := grant("a", "w1", 10, 0, 15); r := at(5); l.RenewedAt, l.Renewals = &r, 1; return l }()),
			snap(16, func() Lease { l := grant("a", "w1", 10, 0, 15); r := at(5); l.RenewedAt, l.Renewals = &r, 1; return l }()),
		}, []ended{{"w1", 10, endExpired, 15, false}}},
		{"HandedOnBetweenPolls", []*Snapshot{
			snap(1, grant("a", "w1", 10, 0, 10)),
			snap(2, grant("a", "w2", 11, 1.5, 11.5)),
		}, []ended{{"w1", 10, endReleased, 1.5, false}, {"w2", 11, "", 0, false}}},
		{"LateThenTakenAfterItsExpiry", []*Snapshot{ // late at the last poll, but it may have renewed and released since
			snap(6, grant("a", "w1", 10, 0, 10)),
			snap(12, grant("a", "w2", 11, 10.5, 20.5)),
		}, []ended{{"w1", 10, endEnded, 10, false}, {"w2", 11, "", 0, false}}},
		{"TakenAfterTheExpirySeenWithoutALateHeartbeat", []*Snapshot{ // renewed and released, or expired: unknown
			snap(1, grant("a", "w1", 10, 0, 10)),
			snap(12, grant("a", "w2", 11, 10.5, 20.5)),
		}, []ended{{"w1", 10, endEnded, 10, false}, {"w2", 11, "", 0, false}}},
		{"HandedOnAfterTheExpirySeen", []*Snapshot{ // renewed, then released to a waiter
			snap(1, grant("a", "w1", 10, 0, 10)),
			snap(12, func() Lease { l := grant("a", "w2", 11, 10.5, 20.5); l.Handed = true; return l }()),
		}, []ended{{"w1", 10, endReleased, 10.5, false}, {"w2", 11, "", 0, false}}},
		{"ForcedRelease", []*Snapshot{
			snap(1, grant("a", "w1", 10, 0, 10)),
			snap(2, grant("a", forceReleaseHolder, 12, 0, 1.7)),
			snap(3, grant("a", forceReleaseHolder, 12, 0, 1.7)), // read again within the margin
		}, []ended{{"w1", 10, endForced, 1.7, false}, {forceReleaseHolder, 12, endForced, 1.7, true}}},
		{"GrantedAndEndedBetweenPolls", []*Snapshot{
			snap(1),
			snap(2, grant("a", "w1", 10, 1.2, 1.4)),
			snap(3, grant("a", "w1", 10, 1.2, 1.4)),
		}, []ended{{"w1", 10, endEnded, 1.4, false}}},
		{"RowGone", []*Snapshot{
			snap(1, grant("a", "w1", 10, 0, 10)),
			snap(2),
		}, []ended{{"w1", 10, endEnded, 2, false}}},
		{"PrunedAfterTheWindow", []*Snapshot{
			snap(1, grant("a", "w1", 10, 0, 1.5)),
			snap(2, grant("a", "w1", 10, 0, 1.5)),
			snap(100),
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tl := newTimeline(time.Minute, 100, 10, 1000)
			for _, s := range tc.polls {
				tl.Observe(s)
			}
			requireSpans(t, tl, "a", tc.want...)
		})
	}
}

// TestTimelineCutList: a name after the last row of a cut list keeps its grant.
func TestTimelineCutList(t *testing.T) {
	t.Parallel()
	tl := newTimeline(time.Minute, 100, 10, 1000)
	tl.Observe(snap(1, grant("a", "w1", 10, 0, 10), grant("b", "w2", 11, 0, 10)))
	cut := snap(2, grant("a", "w1", 10, 0, 10))
	cut.Cut["leases"] = true
	tl.Observe(cut)
	requireSpans(t, tl, "b", ended{"w2", 11, "", 0, false})
}

// TestTimelineForcedHere: a forced release made through the view is named so even when the
// lease was handed on (which the rows alone show as a release).
func TestTimelineForcedHere(t *testing.T) {
	t.Parallel()
	tl := newTimeline(time.Minute, 100, 10, 1000)
	tl.Observe(snap(1, grant("a", "w1", 10, 0, 10)))
	tl.Forced("a", 10, 12, "w2", at(1.5))
	tl.Observe(snap(2, grant("a", "w2", 12, 1.5, 11.5)))
	requireSpans(t, tl, "a", ended{"w1", 10, endForced, 1.5, false}, ended{"w2", 12, "", 0, false})
}

// TestTimelineBounds: at most maxSpans per name, maxNames names, maxTotal spans.
func TestTimelineBounds(t *testing.T) {
	t.Parallel()
	total := newTimeline(time.Hour, 100, 100, 5)
	for i := range 10 {
		total.Observe(snap(float64(i)+0.5, grant(fmt.Sprint(i), "w", int64(10+i), 0, 100)))
	}
	require.Equal(t, 5, total.total)
	require.Len(t, total.names, 5)
	tl := newTimeline(time.Hour, 2, 3, 1000)
	for i := range 5 {
		tl.Observe(snap(float64(i)+0.5, grant("a", "w", int64(10+i), float64(i), float64(i)+0.2), grant("b", "w", 100, 0, 1000), grant("c", "w", 200, 0, 1000)))
	}
	require.Len(t, tl.Spans("a"), 3)
	require.Equal(t, int64(14), tl.Spans("a")[2].Token)
	require.Empty(t, tl.Spans("c"), "a third name is not tracked")
}
