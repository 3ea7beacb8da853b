package liveview

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/fencelock/fencelock/internal/db"
)

// sinceMargin is how far before the previous poll's clock a poll reads ended grants: a
// release's expires_at is the clock of its statement, which may commit (and become visible)
// after a poll that ran later by the clock; a release whose commit came later than this is
// shown as "ended" instead of "released".
const sinceMargin = 10 * time.Second

// The timeline's bounds: names tracked, and grants kept per name (the oldest go first).
const (
	maxNames      = 10_000
	maxSpans      = 64
	maxTotalSpans = 100_000
)

// pollTimeout bounds one poll's statement.
const pollTimeout = 10 * time.Second

// View is one poll's result, shared by every page open: its fragments are rendered once per
// page (and name) and cached here.
type View struct {
	Snap  *Snapshot // the last good snapshot; nil before the first
	Err   error     // the last poll's error, if it failed (Snap is then older)
	At    time.Time // when the poll ended, on this process's clock
	Polls int64     // polls run so far, this one included

	mu    sync.Mutex
	cache map[string][]byte
}

// Poller reads one snapshot every interval while anyone looks (or always), folds it into the
// timeline and hands it to every page: the statements it sends do not grow with the pages open.
// Safe for concurrent use.
type Poller struct {
	q        db.DBTX
	interval time.Duration
	maxRows  int
	always   bool
	logger   *slog.Logger

	mu          sync.Mutex
	view        *View
	changed     chan struct{} // closed when view is replaced
	wake        chan struct{} // 1-buffered: someone looks
	timeline    *Timeline
	subscribers int
	failing     bool          // the last poll failed (logged once per run of failures)
	stopped     chan struct{} // closed when Run returns
}

// NewPoller returns a poller of q; Run polls.
func NewPoller(q db.DBTX, interval, window time.Duration, maxRows int, always bool, logger *slog.Logger) *Poller {
	return &Poller{
		q: q, interval: interval, maxRows: maxRows, always: always, logger: logger,
		view:     &View{cache: map[string][]byte{}},
		changed:  make(chan struct{}),
		wake:     make(chan struct{}, 1),
		timeline: newTimeline(window, maxNames, maxSpans, maxTotalSpans),
		stopped:  make(chan struct{}),
	}
}

// Run polls until ctx ends: every interval while a page is subscribed (or always), else it
// waits for one.
func (p *Poller) Run(ctx context.Context) {
	defer close(p.stopped)
	since := time.Now().Add(-sinceMargin)
	var polls int64
	for {
		if !p.await(ctx) {
			return
		}
		select { // a poke before this poll is answered by it
		case <-p.wake:
		default:
		}
		pctx, cancel := context.WithTimeout(ctx, pollTimeout)
		s, err := readSnapshot(pctx, p.q, since, p.maxRows)
		cancel()
		if ctx.Err() != nil {
			return
		}
		polls++
		p.mu.Lock()
		v := &View{Snap: s, Err: err, At: time.Now(), Polls: polls, cache: map[string][]byte{}}
		if err != nil {
			v.Snap = p.view.Snap
			if !p.failing {
				p.logger.WarnContext(ctx, "fencelock live view: poll failed; the pages show the last snapshot until a poll succeeds", slog.Any("error", err))
			}
		} else {
			if p.failing {
				p.logger.InfoContext(ctx, "fencelock live view: polls succeed again")
			}
			p.timeline.Observe(s)
			since = s.Now.Add(-sinceMargin)
		}
		p.failing = err != nil
		p.view = v
		close(p.changed)
		p.changed = make(chan struct{})
		p.mu.Unlock()

		t := time.NewTimer(p.interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// await returns once a poll is wanted: at once when polling always or while a page is
// subscribed, else when one subscribes or a page asks for a fresh view; false when ctx ends.
func (p *Poller) await(ctx context.Context) bool {
	p.mu.Lock()
	busy := p.always || p.subscribers > 0
	p.mu.Unlock()
	if busy {
		return ctx.Err() == nil
	}
	select {
	case <-ctx.Done():
		return false
	case <-p.wake:
		return true
	}
}

// Current returns the last view and a channel closed when a newer one replaces it.
func (p *Poller) Current() (*View, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.view, p.changed
}

// Subscribe counts a page open until the returned function is called, and wakes an idle poller.
func (p *Poller) Subscribe() (unsubscribe func()) {
	p.mu.Lock()
	p.subscribers++
	p.mu.Unlock()
	p.poke()
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			p.subscribers--
			p.mu.Unlock()
		})
	}
}

// Fresh returns a view no older than two intervals, waking the poller and waiting for its next
// poll (at most until ctx ends) when the last one is older.
func (p *Poller) Fresh(ctx context.Context) *View {
	v, changed := p.Current()
	if v.Polls > 0 && time.Since(v.At) < 2*p.interval {
		return v
	}
	p.poke()
	select {
	case <-changed:
		v, _ = p.Current()
	case <-ctx.Done():
	case <-p.stopped:
	}
	return v
}

func (p *Poller) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Spans returns the timeline's spans of name.
func (p *Poller) Spans(name string) []Span {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.timeline.Spans(name)
}

// Forced records a forced release made through the view in the timeline.
func (p *Poller) Forced(name string, oldToken, newToken int64, handedTo string, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.timeline.Forced(name, oldToken, newToken, handedTo, at)
}
