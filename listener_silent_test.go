package fencelock_test

import (
	"bytes"
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
)

// silentConn is a connection that can go silent without an error, as a half-open TCP flow
// does (a NAT or firewall that dropped an idle flow, a peer that vanished): once silenced,
// every byte written is dropped and every byte read is discarded, and a read returns only at
// its deadline, with a timeout.
type silentConn struct {
	net.Conn
	silent   atomic.Bool
	listened chan struct{} // closed when a write carried LISTEN
	once     sync.Once
	closed   chan struct{}
	closing  sync.Once
}

func (c *silentConn) Write(p []byte) (int, error) {
	if c.silent.Load() {
		return len(p), nil
	}
	if bytes.Contains(p, []byte("LISTEN ")) {
		c.once.Do(func() { close(c.listened) })
	}
	return c.Conn.Write(p)
}

func (c *silentConn) Read(p []byte) (int, error) {
	for {
		n, err := c.Conn.Read(p)
		if !c.silent.Load() {
			return n, err
		}
		if err != nil {
			return 0, err // the deadline (a timeout) or a close: what a silent flow gives
		}
	}
}

func (c *silentConn) Close() error {
	c.closing.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// silentDialer dials silentConns and hands each one that sends LISTEN to the test.
type silentDialer struct{ listening chan *silentConn }

func (d *silentDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	sc := &silentConn{Conn: c, listened: make(chan struct{}), closed: make(chan struct{})}
	go func() {
		select {
		case <-sc.listened:
			d.listening <- sc
		case <-sc.closed:
		}
	}()
	return sc, nil
}

// A listening connection that dies silently is noticed within the notifier's bound (a probe
// after 2 s of quiet, answered within 2 s: package internal/notify), closed and replaced, so
// hand-offs reach their waiters by NOTIFY again; a waiter meanwhile still gets its permit (it
// polls). Before issue 30 the notifier kept the dead connection for as long as the kernel
// did, and every hand-off NOTIFY was lost.
func TestSilentListenerIsReplaced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := &silentDialer{listening: make(chan *silentConn, 4)}
	cfg, err := pgxpool.ParseConfig(b.DB.URL)
	require.NoError(t, err)
	cfg.ConnConfig.DialFunc = d.dial
	pool, err := pgxpool.NewWithConfig(b.Ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	holder := newLessor(t, b.Pool, "h")
	s, err := fencelock.NewSemaphore(holder, "sem", 1)
	require.NoError(t, err)
	w := newLessor(t, pool, "w")
	ws, err := fencelock.NewSemaphore(w, "sem", 1)
	require.NoError(t, err)
	keep, err := w.TryAcquire(b.Ctx, "keep", time.Minute) // the waiter's lessor holds a lease throughout
	require.NoError(t, err)
	defer func() { _ = keep.Release(context.Background()) }()

	permit, err := s.TryAcquire(b.Ctx, time.Minute)
	require.NoError(t, err)
	got := fencetest.PermitAsync(b.Ctx, ws, time.Minute)
	var first *silentConn
	select {
	case first = <-d.listening:
	case <-b.Ctx.Done():
		t.Fatal("no listening connection")
	}
	waitQueued(t, b, ws, 1)

	first.silent.Store(true)
	silencedAt := time.Now()
	require.NoError(t, permit.Release(b.Ctx)) // its NOTIFY is lost in the silence
	a := <-got
	require.NoError(t, a.Err, "the waiter polls while its listener is deaf")

	// Noticed: a new connection listens within seconds (the bound is 4 s; 30 s leaves room for
	// a loaded machine, and is still not the minutes a kernel keeps a half-open flow), and the
	// dead one is closed.
	bound := time.NewTimer(30 * time.Second)
	defer bound.Stop()
	var second *silentConn
	select {
	case second = <-d.listening:
	case <-bound.C:
		t.Fatal("no new listening connection within 30 s of the silence")
	}
	t.Logf("a new connection listened %v after the old one went silent", time.Since(silencedAt))
	require.NotSame(t, first, second)
	closeBound := time.NewTimer(30 * time.Second)
	defer closeBound.Stop()
	select {
	case <-first.closed:
	case <-closeBound.C:
		t.Fatal("the silent listening connection was not closed within 30 s of its replacement")
	}

	// The new listener serves the waiter again: the next hand-off reaches it.
	require.NoError(t, a.Lease.Release(b.Ctx))
	permit, err = s.TryAcquire(b.Ctx, time.Minute)
	require.NoError(t, err)
	got = fencetest.PermitAsync(b.Ctx, ws, time.Minute)
	waitQueued(t, b, ws, 1)
	require.NoError(t, permit.Release(b.Ctx))
	a = <-got
	require.NoError(t, a.Err)
	require.NoError(t, a.Lease.Release(b.Ctx))
}
