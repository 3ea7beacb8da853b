package fencelock_test

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
)

// The database/sql forms (TryRunLockedSQL, RunLockedSQL, LockSQLTx) when ctx ends, beside
// their pgx twins, over a slow link: DESIGN.md, a call that gave up returns only once nothing
// it asked for is held on the server, whatever the latency between client and server.

// latencyProxy is a TCP proxy in front of the test server that delays each direction by a
// one-way latency the test sets while it runs: a client far from its server. It can also hold
// back everything on the connections open at a moment, both ways, until the test lets it go
// (holdOpen): a gate rather than a latency, whatever the machine's speed. It owns its
// connections: the test's cleanup closes them (opening every gate) and waits for its
// goroutines.
type latencyProxy struct {
	ln     net.Listener
	target string
	delay  atomic.Int64 // client to server (data and the close), nanoseconds
	back   atomic.Int64 // server to client, nanoseconds

	mu     sync.Mutex
	conns  []net.Conn
	gates  []*testkit.Gate // both directions of every connection
	closed bool
	wg     sync.WaitGroup
}

// holdOpen shuts both directions of every connection made so far and returns how many there
// were, and what opens them again: until then, what the server sends those clients and what
// they send it (a close included) waits in the proxy. Connections made later pass freely.
func (p *latencyProxy) holdOpen() (n int, release func()) {
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

// newLatencyProxy starts a proxy to the server of dbURL, with no latency yet, and returns it
// with dbURL through it.
func newLatencyProxy(t *testing.T, dbURL string) (*latencyProxy, string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &latencyProxy{ln: ln, target: u.Host}
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
	u.Host = ln.Addr().String()
	return p, u.String()
}

func (p *latencyProxy) close() {
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

// jobRowMade returns the lessor of holder "a", whose first run (of nothing) has made the lease
// row of "job": a later run's grant locks that row rather than inserting it.
func jobRowMade(t *testing.T, b *bundle) *fencelock.Lessor {
	t.Helper()
	l := newLessor(t, b.Pool, "a")
	require.NoError(t, l.TryRunLocked(b.Ctx, "job", func(context.Context, pgx.Tx, fencelock.Token) error { return nil }))
	return l
}

// overSlowLink runs body as parallel subtests, one for the database/sql form ("SQL") and one
// for its pgx control (named control), each with a database of its own behind a latencyProxy:
// the "SQL" subtest gets a *sql.DB through the proxy (far nil), the other a pgx pool through
// it (sqlDB nil).
func overSlowLink(t *testing.T, control string, body func(t *testing.T, b *bundle, proxy *latencyProxy, sqlDB *sql.DB, far *pgxpool.Pool)) {
	t.Parallel()
	for _, form := range []string{"SQL", control} {
		t.Run(form, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			proxy, proxyURL := newLatencyProxy(t, b.DB.URL)
			if form != "SQL" {
				body(t, b, proxy, nil, newPool(t, b.Ctx, proxyURL))
				return
			}
			sqlDB, err := sql.Open("pgx", proxyURL)
			require.NoError(t, err)
			t.Cleanup(func() { _ = sqlDB.Close() })
			body(t, b, proxy, sqlDB, nil)
		})
	}
}

func (p *latencyProxy) handle(client net.Conn) {
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
	p.wg.Go(func() { pipeDelayed(server, client, &p.back, back) })
	pipeDelayed(client, server, &p.delay, fwd)
}

// delayedChunk is what pipeDelayed read from its source (data, or the end), and when to
// deliver it.
type delayedChunk struct {
	data []byte
	at   time.Time
	eof  bool
}

// pipeDelayed copies from src to dst, each chunk (and the end, as a close of dst) delivered
// *delay after it was read, and not before g is open. It returns once src ended and everything
// read was delivered or dst failed.
func pipeDelayed(src, dst net.Conn, delay *atomic.Int64, g *testkit.Gate) {
	q := make(chan delayedChunk, 1<<14)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		for c := range q {
			if d := time.Until(c.at); d > 0 {
				time.Sleep(d)
			}
			g.Pass()
			if c.eof {
				_ = dst.Close()
				continue
			}
			if _, err := dst.Write(c.data); err != nil {
				_ = dst.Close()
				_ = src.Close() // the reader's next Read fails, and it closes q
			}
		}
	})
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		at := time.Now().Add(time.Duration(delay.Load()))
		if n > 0 {
			q <- delayedChunk{data: append([]byte(nil), buf[:n]...), at: at}
		}
		if err != nil {
			q <- delayedChunk{eof: true, at: at}
			close(q)
			return
		}
	}
}

// leaseRowLocked reports whether some transaction holds the lease row of name locked.
func leaseRowLocked(t *testing.T, b *bundle, name string) bool {
	t.Helper()
	tx, err := b.Pool.Begin(b.Ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.Ctx) }()
	_, err = tx.Exec(b.Ctx, `SELECT 1 FROM fencelock.leases WHERE name = $1 FOR UPDATE NOWAIT`, name)
	if err == nil {
		return false
	}
	require.Equal(t, "55P03", sqlState(err), "%v", err)
	return true
}

// requireRowFreeOnReturn fails the test when the lease row of name is still locked now, just
// after a call that returned err at returned; the message says how much later it was free.
func requireRowFreeOnReturn(t *testing.T, b *bundle, name string, returned time.Time, err error) {
	t.Helper()
	if !leaseRowLocked(t, b, name) {
		return
	}
	waitFor(t, b, "the lease row is free", func() bool { return !leaseRowLocked(t, b, name) })
	t.Fatalf("the lease row is still locked after the call returned %v (free %v later)", err, time.Since(returned))
}

// TryRunLocked's doc (and RunLockedSQL's): when ctx ends while fn runs, the transaction is
// rolled back and the row is free when the call returns, whatever the latency. database/sql
// rolls the transaction back in a goroutine of its own when ctx ends, so the database/sql form
// must wait for that rollback on the server; the pgx form (control) waits for its ROLLBACK.
func TestRunLockedSQLCancelledInFnFreesRowOnReturn(t *testing.T) {
	const latency = 100 * time.Millisecond
	overSlowLink(t, "PgxControl", func(t *testing.T, b *bundle, proxy *latencyProxy, sqlDB *sql.DB, far *pgxpool.Pool) {
		l := jobRowMade(t, b)

		ctx, cancel := context.WithCancel(b.Ctx)
		defer cancel()
		inside := make(chan struct{})
		done := make(chan error, 1)
		if sqlDB != nil {
			go func() {
				done <- l.TryRunLockedSQL(ctx, sqlDB, "job", func(ctx context.Context, _ *sql.Tx, _ fencelock.Token) error {
					close(inside)
					<-ctx.Done()
					return ctx.Err()
				})
			}()
		} else {
			lf := newLessor(t, far, "a")
			go func() {
				done <- lf.TryRunLocked(ctx, "job", func(ctx context.Context, _ pgx.Tx, _ fencelock.Token) error {
					close(inside)
					<-ctx.Done()
					return ctx.Err()
				})
			}()
		}
		select {
		case <-inside:
		case err := <-done:
			t.Fatalf("returned before fn ran: %v", err)
		}
		require.True(t, leaseRowLocked(t, b, "job"), "fn runs with the row locked")
		proxy.delay.Store(int64(latency))
		cancel()
		err := <-done
		returned := time.Now()
		require.ErrorIs(t, err, context.Canceled)
		requireRowFreeOnReturn(t, b, "job", returned, err)
	})
}

// LockSQLTx (docs): "When ctx ends first the statement is cancelled and database/sql rolls tx
// back, which releases anything it held." DESIGN.md: a call that gave up returns only once
// nothing it asked for is held on the server, for advisory locks as for leases, whatever the
// latency. With 100 ms of one-way latency, the cancelled call returns while its backend still
// waits in the lock's queue (pgx closes the connection and sends the cancel request
// asynchronously); a holder that lets go just after hands the lock to that abandoned wait,
// and a TryLockTx that follows is refused by a lock nobody alive holds. The pgx twin LockTx
// (control, older than issue 29) does the same.
func TestLockTxCancelledLeavesNoAbandonedWait(t *testing.T) {
	overSlowLink(t, "PgxTwin", func(t *testing.T, b *bundle, proxy *latencyProxy, sqlDB *sql.DB, far *pgxpool.Pool) {
		a, err := fencelock.NewAdvisoryLocker(b.Pool)
		require.NoError(t, err)
		hold, err := b.Pool.Begin(b.Ctx)
		require.NoError(t, err)
		defer func() { _ = hold.Rollback(b.Ctx) }()
		_, err = a.TryLockTx(b.Ctx, hold, "report")
		require.NoError(t, err)

		ctx, cancel := context.WithCancel(b.Ctx)
		defer cancel()
		done := make(chan error, 1)
		if sqlDB != nil {
			go func() {
				tx, err := sqlDB.BeginTx(ctx, nil)
				if err != nil {
					done <- err
					return
				}
				defer func() { _ = tx.Rollback() }()
				_, err = a.LockSQLTx(ctx, tx, "report")
				done <- err
			}()
		} else {
			go func() {
				tx, err := far.Begin(ctx)
				if err != nil {
					done <- err
					return
				}
				defer func() { _ = tx.Rollback(context.Background()) }()
				_, err = a.LockTx(ctx, tx, "report")
				done <- err
			}()
		}
		waiting := func() int {
			var n int
			require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM pg_locks AS l JOIN pg_database AS d ON d.oid = l.database
				WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = current_database()`).Scan(&n))
			return n
		}
		waitFor(t, b, "the lock waiting", func() bool { return waiting() == 1 })
		proxy.delay.Store(int64(100 * time.Millisecond))
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
		stillWaiting := waiting()
		require.NoError(t, hold.Commit(b.Ctx)) // the holder lets go just after
		err = pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error {
			_, err := a.TryLockTx(b.Ctx, tx, "report")
			return err
		})
		require.NoError(t, err, "the lock is held by the wait of a call that returned ctx's error before (%d waiting when it returned)", stillWaiting)
	})
}

// TryRunLockedSQL whose ctx ends after its grant ran on the server but before the reply came
// back: the call gives up without running fn, and returns only once the abandoned transaction
// no longer holds the row, as the pgx form (control) does. Gates, not latencies, make the
// moment: the grant waits on the server at an advisory lock the test holds (grantGate) while
// the test shuts the call's connection at the proxy (holdOpen), so its reply, and after the
// cancel its close, stay in the proxy until the test opens it. The test opens it only once the
// call has returned (then the row must already be free: nothing of the close reached the
// server, so a call that did not wait for the server fails) or is seen waiting for the
// abandoned session on the server (awaitsAbandonedSession).
func TestTryRunLockedSQLCancelledAfterGrantFreesRowOnReturn(t *testing.T) {
	overSlowLink(t, "PgxControl", func(t *testing.T, b *bundle, proxy *latencyProxy, sqlDB *sql.DB, far *pgxpool.Pool) {
		l := jobRowMade(t, b)
		openGrants := grantGate(t, b)
		ctx, cancel := context.WithCancel(b.Ctx)
		defer cancel()
		ran := make(chan struct{}, 1)
		fn := func() { ran <- struct{}{} }
		done := make(chan error, 1)
		if sqlDB != nil {
			require.NoError(t, sqlDB.PingContext(b.Ctx)) // the connection the call takes
			go func() {
				done <- l.TryRunLockedSQL(ctx, sqlDB, "job", func(context.Context, *sql.Tx, fencelock.Token) error { fn(); return nil })
			}()
		} else {
			require.NoError(t, far.Ping(b.Ctx))
			lf := newLessor(t, far, "a")
			go func() {
				done <- lf.TryRunLocked(ctx, "job", func(context.Context, pgx.Tx, fencelock.Token) error { fn(); return nil })
			}()
		}
		grants := func(state string) int {
			var n int
			require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND state = $1 AND query LIKE '-- name: LeaseGrant%'
				AND (state <> 'active' OR wait_event = 'advisory')`, state).Scan(&n))
			return n
		}
		waitFor(t, b, "the grant waiting at the gate", func() bool { return grants("active") == 1 })
		// The call's connection, alone (the one pinged): the grant's reply will wait in the
		// proxy, and the call's cleanup, on connections of its own, will not.
		conns, release := proxy.holdOpen()
		defer release()
		require.Equal(t, 1, conns, "connections through the proxy when the grant's reply is held")
		openGrants()
		waitFor(t, b, "the grant done on the server, its reply held", func() bool { return grants("idle in transaction") == 1 })
		cancel()
		waitFor(t, b, "the call returned, or waiting for its abandoned session", func() bool {
			return len(done) == 1 || awaitsAbandonedSession(t, b)
		})
		var err error
		select {
		case err = <-done: // returned while nothing of its close had reached the server
			lockedOnReturn := leaseRowLocked(t, b, "job")
			release()
			require.ErrorIs(t, err, context.Canceled)
			require.Empty(t, ran, "fn ran")
			require.False(t, lockedOnReturn, "the call returned %v while its abandoned transaction, whose close the proxy still held, locked the row", err)
		default:
			released := time.Now()
			release()
			err = <-done
			returned := time.Now()
			t.Logf("the call waited for its abandoned session; it returned %v after the proxy let the session's close through", returned.Sub(released))
			require.ErrorIs(t, err, context.Canceled)
			require.Empty(t, ran, "fn ran")
			requireRowFreeOnReturn(t, b, "job", returned, err)
		}
	})
}

// grantGate makes every grant of b's database wait, inside its statement (a try-grant has
// locked the expired row by then: its FOR UPDATE SKIP LOCKED comes first), at an advisory lock the test holds (a trigger on fencelock.leases), and returns what
// lets them go on (it is also called at cleanup).
func grantGate(t *testing.T, b *bundle) (open func()) {
	t.Helper()
	const key = 0x7e57_6a7e
	conn, err := b.Pool.Acquire(b.Ctx)
	require.NoError(t, err)
	_, err = conn.Exec(b.Ctx, `SELECT pg_advisory_lock($1)`, int64(key))
	require.NoError(t, err)
	_, err = b.Pool.Exec(b.Ctx, fmt.Sprintf(`
		CREATE FUNCTION public.test_grant_gate() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_catalog.pg_advisory_xact_lock(%d); RETURN NEW; END $$;
		CREATE TRIGGER test_grant_gate BEFORE INSERT OR UPDATE ON fencelock.leases
			FOR EACH ROW EXECUTE FUNCTION public.test_grant_gate()`, key))
	require.NoError(t, err)
	var once sync.Once
	open = func() {
		once.Do(func() {
			_, err := conn.Exec(context.Background(), `SELECT pg_advisory_unlock($1)`, int64(key))
			if err != nil {
				t.Errorf("open the grant gate: %v", err)
			}
			conn.Release()
		})
	}
	t.Cleanup(open)
	return open
}

// awaitsAbandonedSession reports whether a session of b's database polls pg_stat_activity for
// a backend's exit or the end of its transaction: the wait of a call that gave up on a session
// (fencelock's backendAliveSQL and transactionRunningSQL).
func awaitsAbandonedSession(t *testing.T, b *bundle) bool {
	t.Helper()
	var n int
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()
		AND query LIKE 'SELECT EXISTS (SELECT 1 FROM pg_stat_activity%WHERE pid = $1 AND datname = current_database()%'`).Scan(&n))
	return n > 0
}

// RunLockedSQL and TryRunLockedSQL with a ctx that has already ended return ctx's error and
// run nothing; the same lessor then runs fn with a live ctx.
func TestRunLockedSQLEndedContextRunsNothing(t *testing.T) {
	forEachSQLWiring(t, func(t *testing.T, b *bundle, sqlDB *sql.DB) {
		l := newLessor(t, b.Pool, "a")
		ctx, cancel := context.WithCancel(b.Ctx)
		cancel()
		ran := false
		fn := func(context.Context, *sql.Tx, fencelock.Token) error { ran = true; return nil }
		require.ErrorIs(t, l.RunLockedSQL(ctx, sqlDB, "job", fn), context.Canceled)
		require.ErrorIs(t, l.TryRunLockedSQL(ctx, sqlDB, "job", fn), context.Canceled)
		require.False(t, ran)
		require.NoError(t, l.TryRunLockedSQL(b.Ctx, sqlDB, "job", fn))
		require.True(t, ran)
	})
}
