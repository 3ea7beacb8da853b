package fencelock

import "sync"

// grantEnd is how a grant ends, shared by [Lease] and [AdvisoryLock]: once, with a cause,
// closing the Done channel. Each owner has one end path that every way its grants end goes
// through (release, unlock, renewal verdict, trust window, guard check, watchdog), and that
// orders the steps one way per owner: Lease.end takes the lease out of its lessor's held set,
// then closes Done (a release's statement follows); AdvisoryLock.end closes Done first on
// unlock (its statement may hang) and last on a lost session (nothing is held by then). Safe
// for concurrent use.
type grantEnd struct {
	done chan struct{}

	mu    sync.Mutex
	err   error           // nil while held; set once, when done closes
	after map[*int]func() // run once done has closed (afterFunc), by registration
}

func newGrantEnd() grantEnd { return grantEnd{done: make(chan struct{})} }

// finish closes done with cause, once, and reports whether this call did; later calls
// change nothing. cause must not be nil.
func (g *grantEnd) finish(cause error) bool { return g.finishWith(cause, nil) }

// finishWith is finish that first runs before, if not nil, when this call ends the grant: what
// before records (a metric) is there by the time anyone sees done closed.
func (g *grantEnd) finishWith(cause error, before func()) bool {
	g.mu.Lock()
	if g.err != nil {
		g.mu.Unlock()
		return false
	}
	if before != nil {
		before()
	}
	g.err = cause
	close(g.done)
	after := g.after
	g.after = nil
	g.mu.Unlock()
	for _, f := range after {
		f() // outside g.mu: f may read the cause
	}
	return true
}

// afterFunc arranges for f to run once the grant has ended: in the goroutine that ends it,
// right after done closes (so f has run when the call that ended the grant returns), or at
// once, in the caller's goroutine, when it has ended already. f must not block (a context's
// cancel). The returned stop unregisters f and reports whether it did so before f ran. It is
// [context.AfterFunc] for a grant, with no goroutine at all.
func (g *grantEnd) afterFunc(f func()) (stop func() bool) {
	g.mu.Lock()
	if g.err != nil {
		g.mu.Unlock()
		f()
		return func() bool { return false }
	}
	key := new(int)
	if g.after == nil {
		g.after = make(map[*int]func())
	}
	g.after[key] = f
	g.mu.Unlock()
	return func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		_, ok := g.after[key]
		delete(g.after, key)
		return ok
	}
}

// cause returns nil while the grant is held, else why it ended.
func (g *grantEnd) cause() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// ended reports whether the grant has ended.
func (g *grantEnd) ended() bool { return g.cause() != nil }
