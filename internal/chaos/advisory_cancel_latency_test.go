package chaos

import (
	"context"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
)

// Issue 30: a blocking AdvisoryLocker.Lock whose ctx ends while the server's grant is on its
// way back must return only once nothing is held. Before the fix, Lock returned
// context.Canceled at once and the backend kept the lock until the closed connection reached
// it (about one one-way latency later, on a link with latency).
//
// A gate, not a latency, makes the moment: once the waiter is queued on the server, the test
// holds its connection at a proxy (gateProxy.hold), both ways, so the grant's reply, and after
// the cancel the waiter's close, stay in the proxy until the test lets them go. The test does
// that only once Lock has returned (then the lock must already be free: nothing of the close
// reached the server, so a Lock that did not wait for the server fails) or is seen waiting for
// its session's end on the server (awaitsSessionExit).
func TestAdvisoryLockCancelledWhileGrantInFlight(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{})
	proxy, wcfg := newGateProxy(t, e.db.URL)
	wpool, err := pgxpool.NewWithConfig(e.ctx, wcfg)
	require.NoError(t, err)
	t.Cleanup(wpool.Close) // before the proxy closes
	holderLocker, err := fencelock.NewAdvisoryLocker(e.db.Pool)
	require.NoError(t, err)
	waiterLocker, err := fencelock.NewAdvisoryLocker(wpool)
	require.NoError(t, err)
	require.NoError(t, wpool.Ping(e.ctx)) // the waiter's connection, the one the proxy holds

	held, err := holderLocker.TryLock(e.ctx, "k")
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	locked := make(chan error, 1)
	go func() {
		lk, err := waiterLocker.Lock(ctx, "k")
		if err == nil {
			_ = lk.Unlock(context.Background())
		}
		locked <- err
	}()
	// lockRows counts the sessions of this database other than the holder's that hold
	// (granted) or await advisory lock k, through the harness pool (not through the proxy).
	lockRows := func(granted bool) int {
		var n int
		require.NoError(t, e.db.Pool.QueryRow(e.ctx, `SELECT count(*) FROM pg_locks AS l
			JOIN pg_database AS d ON d.oid = l.database AND d.datname = current_database()
			WHERE l.locktype = 'advisory' AND l.granted = $1 AND l.pid <> $2`, granted, int32(held.BackendPID())).Scan(&n))
		return n
	}
	waitUntil(t, e.ctx, "the waiter queued for the lock", func() bool { return lockRows(false) == 1 })
	// The waiter's connection, alone (the one pinged): the grant's reply will wait in the
	// proxy, and Lock's cleanup, on connections of its own, will not.
	conns, release := proxy.hold()
	defer release()
	require.Equal(t, 1, conns, "connections through the proxy when the grant's reply is held")
	require.NoError(t, held.Unlock(e.ctx))
	waitUntil(t, e.ctx, "the server granted the waiter", func() bool { return lockRows(true) == 1 })
	cancel() // the grant's reply is held in the proxy

	cancelledAt := time.Now()
	waitUntil(t, e.ctx, "Lock returned, or waiting for its session's end", func() bool {
		return len(locked) == 1 || awaitsSessionExit(t, e)
	})
	select {
	case err := <-locked: // returned while nothing of its close had reached the server
		heldOnReturn := lockRows(true)
		release()
		require.ErrorIs(t, err, context.Canceled)
		require.Zero(t, heldOnReturn, "Lock returned while its session, whose close the proxy still held, held the lock")
	default:
		released := time.Now()
		release()
		require.ErrorIs(t, <-locked, context.Canceled)
		t.Logf("Lock waited for its session's end: it returned %v after the cancel, %v after the proxy let the close through", time.Since(cancelledAt), time.Since(released))
		require.Zero(t, lockRows(true), "Lock returned while its session still held the lock")
	}
	other, err := holderLocker.TryLock(e.ctx, "k")
	require.NoError(t, err, "another locker is refused after Lock gave up")
	require.NoError(t, other.Unlock(e.ctx))
}

// awaitsSessionExit reports whether a session of e's database polls pg_stat_activity for a
// backend's exit: the wait of a call that gave up on its session (fencelock's backendAliveSQL).
func awaitsSessionExit(t *testing.T, e *env) bool {
	t.Helper()
	var n int
	require.NoError(t, e.db.Pool.QueryRow(e.ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()
		AND query LIKE 'SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND datname = current_database()%'`).Scan(&n))
	return n > 0
}

// gateProxy is a TCP proxy in front of the test server that can hold back everything on the
// connections open at a moment, both ways, until the test lets it go (hold): a link that
// stops delivering for as long as the test wants, and loses nothing. It owns its connections:
// the test's cleanup opens every gate, closes them and waits for its goroutines.
type gateProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	conns  []net.Conn
	gates  []*testkit.Gate // both directions of every connection
	closed bool
	wg     sync.WaitGroup
}

// newGateProxy starts a gateProxy to the server of dbURL and returns it with a pool config that
// connects through it.
func newGateProxy(t *testing.T, dbURL string) (*gateProxy, *pgxpool.Config) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &gateProxy{ln: ln, target: net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))}
	t.Cleanup(p.close)
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Go(func() { p.handle(c) })
		}
	})
	addr := ln.Addr().(*net.TCPAddr)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = addr.IP.String(), uint16(addr.Port), nil
	return p, cfg
}

func (p *gateProxy) handle(client net.Conn) {
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = client.Close()
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		_ = client.Close()
		_ = server.Close()
		return
	}
	fwd, back := &testkit.Gate{}, &testkit.Gate{}
	p.conns = append(p.conns, client, server)
	p.gates = append(p.gates, fwd, back)
	p.mu.Unlock()
	p.wg.Go(func() { pipeGated(server, client, back) })
	pipeGated(client, server, fwd)
}

// hold shuts both directions of every connection made so far and returns how many there were,
// and what opens them again: until then, what the server sends those clients and what they
// send it (a close included) waits in the proxy. Connections made later pass freely.
func (p *gateProxy) hold() (n int, release func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	gates := append([]*testkit.Gate(nil), p.gates...)
	if !p.closed {
		for _, g := range gates {
			g.Shut()
		}
	}
	return len(gates) / 2, func() {
		for _, g := range gates {
			g.Open()
		}
	}
}

func (p *gateProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for _, g := range p.gates {
		g.Open()
	}
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// pipeGated copies from src to dst, each chunk read (and the end, as a close of dst) passed on
// once g is open. It returns once src ended or dst failed.
func pipeGated(src, dst net.Conn, g *testkit.Gate) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		g.Pass()
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				_ = dst.Close()
				_ = src.Close()
				return
			}
		}
		if err != nil {
			_ = dst.Close()
			return
		}
	}
}

// waitUntil polls cond every millisecond until it holds or ctx ends (failing the test).
func waitUntil(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %v", what, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}
