package liveview

import (
	"sort"
	"time"
)

// How a span ended (Span.Ended).
const (
	endReleased = "released"       // its holder released it (expires_at moved back), or it was handed on before its expiry
	endExpired  = "expired"        // it reached its expiry unrenewed
	endForced   = "forced release" // fencelock.force_release ended it (fencelock release --force, or this view)
	endEnded    = "ended"          // released or expired, which the polls cannot tell; or the row went away
)

// Span is one grant of a lease name as the poller saw it, or (Mark) a forced release that
// fenced the name with Token without handing it on.
type Span struct {
	Holder  string
	Token   int64
	Start   time.Time     // the grant (acquired_at); for a Mark, the forced release
	End     time.Time     // zero while held
	Expires time.Time     // the last expiry seen
	TTL     time.Duration // the last TTL seen
	Ended   string        // how it ended (end* constants); "" while held
	Mark    bool
}

// Timeline keeps, in memory, the grants of each lease name seen over the last window, from
// what successive snapshots show: no table, no write per grant. A grant that begins and ends
// between two polls is seen only if its row is still the name's at the next poll. Not safe
// for concurrent use: the poller owns it.
type Timeline struct {
	window   time.Duration
	maxNames int // names tracked at the most; a new name beyond is not tracked
	maxSpans int // spans kept per name; the oldest go first
	maxTotal int // spans kept in all; a new span beyond is not kept
	total    int
	names    map[string][]Span
}

func newTimeline(window time.Duration, maxNames, maxSpans, maxTotal int) *Timeline {
	return &Timeline{window: window, maxNames: maxNames, maxSpans: maxSpans, maxTotal: maxTotal, names: map[string][]Span{}}
}

// ongoing returns the name's span still held, if any.
func ongoing(spans []Span) *Span {
	for i := len(spans) - 1; i >= 0; i-- {
		if !spans[i].Mark {
			if spans[i].End.IsZero() {
				return &spans[i]
			}
			return nil
		}
	}
	return nil
}

// has reports whether spans record token, as a grant (mark false) or a forced release's mark.
func has(spans []Span, token int64, mark bool) bool {
	for _, s := range spans {
		if s.Token == token && s.Mark == mark {
			return true
		}
	}
	return false
}

// Observe folds a snapshot into the timeline. When s.Leases was cut at its row limit
// (s.Cut["leases"]), the names it does not list are left as they were: the list is in the
// database's order of names, which this process cannot tell where a name falls in.
func (tl *Timeline) Observe(s *Snapshot) {
	listed := make(map[string]bool, len(s.Leases))
	for _, r := range s.Leases {
		listed[r.Name] = true
		tl.observeRow(s.Now, r)
	}
	for name, spans := range tl.names {
		if listed[name] || s.Cut["leases"] {
			continue
		}
		if cur := ongoing(spans); cur != nil { // its row is gone (swept) or ended before since
			cur.End, cur.Ended = minTime(cur.Expires, s.Now), endEnded
		}
	}
	tl.prune(s.Now)
}

func (tl *Timeline) observeRow(now time.Time, r Lease) {
	spans := tl.names[r.Name]
	if spans == nil && len(tl.names) >= tl.maxNames {
		return
	}
	held := r.ExpiresAt.After(now)
	forced := r.Holder == forceReleaseHolder
	cur := ongoing(spans)
	if cur != nil && cur.Token != r.Token {
		// The grant seen last ended between the polls, and another row replaced it.
		// Renewals between the polls may have moved its expiry past the one seen last (even a
		// holder late at the last poll may have renewed since, then released), so only what is
		// certain is named: a grant handed on by a release (hand_off), or one that began before
		// the expiry seen last (the old grant ended early: released). Else released or expired
		// cannot be told apart from the rows: "ended".
		switch {
		case forced: // force_release left the row with its fence token and the clock of the release
			cur.End, cur.Ended = r.ExpiresAt, endForced
		case r.Handed || r.AcquiredAt.Before(cur.Expires):
			cur.End, cur.Ended = r.AcquiredAt, endReleased
		default:
			cur.End, cur.Ended = minTime(cur.Expires, r.AcquiredAt), endEnded
		}
		cur = nil
	}
	switch {
	case cur != nil && held: // renewed, or not yet
		cur.Expires, cur.TTL = r.ExpiresAt, r.TTL()
	case cur != nil: // the same grant, ended: a release moves expires_at back, short of the TTL
		if r.TTL() < cur.TTL-time.Millisecond {
			cur.End, cur.Ended = r.ExpiresAt, endReleased
		} else {
			cur.End, cur.Ended = r.ExpiresAt, endExpired
		}
		cur.Expires = r.ExpiresAt
	case forced:
		if !has(spans, r.Token, true) {
			tl.add(r.Name, Span{Holder: r.Holder, Token: r.Token, Start: r.ExpiresAt, End: r.ExpiresAt, Ended: endForced, Mark: true})
		}
	case !has(spans, r.Token, false):
		sp := Span{Holder: r.Holder, Token: r.Token, Start: r.AcquiredAt, Expires: r.ExpiresAt, TTL: r.TTL()}
		if !held { // began and ended between two polls
			sp.End, sp.Ended = r.ExpiresAt, endEnded
		}
		tl.add(r.Name, sp)
	}
}

// add puts sp among name's spans in order of Start, keeping at most maxSpans.
func (tl *Timeline) add(name string, sp Span) {
	if tl.total >= tl.maxTotal || (tl.names[name] == nil && len(tl.names) >= tl.maxNames) {
		return
	}
	tl.total++
	spans := append(tl.names[name], sp)
	sort.SliceStable(spans, func(i, j int) bool { return spans[i].Start.Before(spans[j].Start) })
	if len(spans) > tl.maxSpans {
		tl.total -= len(spans) - tl.maxSpans
		spans = append([]Span(nil), spans[len(spans)-tl.maxSpans:]...)
	}
	tl.names[name] = spans
}

// Forced records a forced release made by this view: the grant with oldToken ended at at, and
// the name was fenced with newToken (and handed to the head of its queue when handedTo is not
// empty, which the next poll shows as a grant).
func (tl *Timeline) Forced(name string, oldToken, newToken int64, handedTo string, at time.Time) {
	spans := tl.names[name]
	for i := range spans {
		if spans[i].Token == oldToken && !spans[i].Mark {
			if spans[i].End.IsZero() {
				spans[i].End = at
			}
			spans[i].Ended = endForced
		}
	}
	if handedTo == "" && !has(spans, newToken, true) {
		tl.add(name, Span{Holder: forceReleaseHolder, Token: newToken, Start: at, End: at, Ended: endForced, Mark: true})
	}
}

// Spans returns a copy of the name's spans, oldest first.
func (tl *Timeline) Spans(name string) []Span {
	return append([]Span(nil), tl.names[name]...)
}

// prune drops what ended before the window and names left with nothing.
func (tl *Timeline) prune(now time.Time) {
	from := now.Add(-tl.window)
	for name, spans := range tl.names {
		kept := spans[:0]
		for _, s := range spans {
			if s.End.IsZero() || !s.End.Before(from) {
				kept = append(kept, s)
			}
		}
		tl.total -= len(spans) - len(kept)
		if len(kept) == 0 {
			delete(tl.names, name)
		} else {
			tl.names[name] = kept
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
