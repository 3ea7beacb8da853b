package testkit

import "sync"

// Gate holds back what passes through it while it is shut: a caller of Pass waits until the
// gate opens, and Open lets every waiting caller go at once (order is kept where one reader
// passes each direction, as in a proxy's pipe). Tests put one on each direction of a proxied
// connection, to stall a statement or its reply at a chosen moment and let it go on later,
// with nothing lost. The zero Gate is open. Safe for concurrent use.
type Gate struct {
	mu   sync.Mutex
	open chan struct{} // nil while open; closed when a shut gate opens
}

// Shut shuts the gate (a shut gate stays shut).
func (g *Gate) Shut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.open == nil {
		g.open = make(chan struct{})
	}
}

// Open opens the gate, letting every caller of Pass waiting at it go on.
func (g *Gate) Open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.open != nil {
		close(g.open)
		g.open = nil
	}
}

// Pass returns once the gate is open.
func (g *Gate) Pass() {
	g.mu.Lock()
	open := g.open
	g.mu.Unlock()
	if open != nil {
		<-open
	}
}
