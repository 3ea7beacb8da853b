package fencelock_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
)

// The cleanup of a grant statement of unknown outcome ends only what that statement may have
// granted: never a grant a release handed to a waiting Acquire of the same lessor, which that
// Acquire then trusts (issue 21, defect 1). Lessor L waits for x at the head of its queue
// while a sibling's attempt on x is cut short by the end of its ctx with the reply held up on
// the network; the holder's release hands x to L's wait in between (the test ends the
// sibling's ctx once it sees the hand-off in L's queue row, so no step races a deadline; the
// 10 s bounds are hang bounds), and the sibling's cleanup runs before the waiting Acquire
// claims the grant (both hold the name's gate). The Acquire returns the grant handed to its
// wait, current on the server, excluding everyone else.
// A sibling that is an Acquire shares the wait: after its abandoned attempt the wait keeps
// its id, so the grant is still claimed (under a new id it was held by nobody for its TTL).
func TestSiblingCleanupSparesHandedGrant(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// The bytes whose write holds the replies of the sibling's connection back: the sqlc
		// name that starts its statement's text (sent in the Parse of a connection's first use
		// of it), or, for an Acquire, whose statement the waiting Acquire has prepared already,
		// its TTL as a bound parameter (int8, binary).
		hold []byte
		try  func(ctx context.Context, l *fencelock.Lessor) error
	}{
		{"TryAcquire", []byte("-- name: LeaseGrant :one"), func(ctx context.Context, l *fencelock.Lessor) error {
			_, err := l.TryAcquire(ctx, "x", 20*time.Second)
			return err
		}},
		{"TryAcquireAll", []byte("-- name: LeaseGrantAll :many"), func(ctx context.Context, l *fencelock.Lessor) error {
			_, err := l.TryAcquireAll(ctx, []string{"x", "y"}, 20*time.Second)
			return err
		}},
		{"Acquire", binary.BigEndian.AppendUint64(nil, uint64((19 * time.Second).Microseconds())), func(ctx context.Context, l *fencelock.Lessor) error {
			_, err := l.Acquire(ctx, "x", 19*time.Second)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			h := newLessor(t, b.Pool, "h")
			held, err := h.TryAcquire(b.Ctx, "x", 20*time.Second)
			require.NoError(t, err)

			written := make(chan struct{}, 1)
			l := newLessor(t, poolHoldingReplies(t, b, tc.hold, written), "l")
			got := fencetest.AcquireAsync(b.Ctx, l, "x", 20*time.Second)
			awaitQueue(t, b.Ctx, b.Pool, "x", true, "l") // the head, woken by NOTIFY

			// The sibling gives up (its ctx ends) once the hand-off has happened, whenever
			// that is: a deadline would have to cover the dial, the write, the release and
			// the read of the queue row below, which a loaded machine may not beat.
			tryCtx, giveUp := context.WithCancel(b.Ctx)
			defer giveUp()
			tried := make(chan error, 1)
			go func() { tried <- tc.try(tryCtx, l) }()
			select {
			case <-written:
			case <-time.After(10 * time.Second):
				t.Fatal("the sibling's statement was not written")
			}
			require.NoError(t, held.Release(b.Ctx))
			var handed int64
			require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT granted_token FROM fencelock.lease_waiters WHERE name = 'x' AND holder = 'l'`).Scan(&handed))
			require.NotZero(t, handed, "the release handed x to L's wait")
			select {
			case err := <-tried:
				t.Fatalf("the sibling returned (%v) before the hand-off: the scenario did not happen", err)
			default:
			}
			giveUp()
			select {
			case err := <-tried:
				require.ErrorIs(t, err, context.Canceled, "the sibling's outcome is unknown: its reply never came")
			case <-time.After(10 * time.Second): // a hang bound
				t.Fatal("the sibling did not return")
			}

			a := fencetest.Receive(t, got, 10*time.Second)
			require.NoError(t, a.Err)
			require.Equal(t, handed, int64(a.Lease.Token()), "the Acquire claimed the grant handed to its wait")
			require.NoError(t, a.Lease.Err(), "the Acquire trusts its grant")
			var holder string
			var token int64
			var live bool
			require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT holder, token, expires_at > clock_timestamp() FROM fencelock.leases WHERE name = $1`, "x").
				Scan(&holder, &token, &live))
			require.Equal(t, "l", holder)
			require.Equal(t, handed, token)
			require.True(t, live, "the grant L trusts (token %d) was ended on the server by its sibling's cleanup", handed)
			_, err = newLessor(t, b.Pool, "third").TryAcquire(b.Ctx, "x", time.Second)
			require.ErrorIs(t, err, fencelock.ErrNotAcquired, "x was granted to a third lessor while L trusts it")
			require.NoError(t, a.Lease.Err())
			require.NoError(t, a.Lease.Release(b.Ctx))
		})
	}
}

// poolHoldingReplies returns a pool on b's database where the first connection to write bytes
// containing hold holds back its reads from then on, until a read deadline passes: the
// statement's reply is held up on the network until the client gives up (pgx interrupts a
// read by setting a deadline in the past when ctx ends, and then closes the connection: the
// statement's outcome is unknown to the client). written receives once, after that write.
func poolHoldingReplies(t *testing.T, b *bundle, hold []byte, written chan<- struct{}) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.DB.URL)
	require.NoError(t, err)
	var d net.Dialer
	var armed atomic.Bool // one connection of the pool holds
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &holdingConn{Conn: c, hold: hold, armed: &armed, written: written, changed: make(chan struct{})}, nil
	}
	pool, err := pgxpool.NewWithConfig(b.Ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// holdingConn is a net.Conn that, once it has written bytes containing hold (the first of its
// pool to), holds back its reads until its read deadline passes (os.ErrDeadlineExceeded) or
// it is closed (net.ErrClosed). Reads after that deadline pass through: pgx's close of the
// connection drains it at once.
type holdingConn struct {
	net.Conn
	hold    []byte
	armed   *atomic.Bool // set by the pool's first connection to write hold
	written chan<- struct{}

	mu       sync.Mutex
	holding  bool // hold written, and no read deadline has passed since
	closed   bool
	deadline time.Time     // the read deadline
	changed  chan struct{} // closed, and replaced, when deadline or closed change
}

func (c *holdingConn) Write(p []byte) (int, error) {
	arm := bytes.Contains(p, c.hold) && c.armed.CompareAndSwap(false, true)
	if arm {
		c.mu.Lock()
		c.holding = true // before the write: no reply slips through
		c.mu.Unlock()
	}
	n, err := c.Conn.Write(p)
	if arm {
		c.written <- struct{}{}
	}
	return n, err
}

func (c *holdingConn) Read(p []byte) (int, error) {
	for {
		c.mu.Lock()
		holding, closed, deadline, changed := c.holding, c.closed, c.deadline, c.changed
		c.mu.Unlock()
		switch {
		case !holding:
			return c.Conn.Read(p)
		case closed:
			return 0, net.ErrClosed
		}
		if deadline.IsZero() {
			<-changed
			continue
		}
		left := time.Until(deadline)
		if left <= 0 {
			c.mu.Lock()
			c.holding = false
			c.mu.Unlock()
			return 0, os.ErrDeadlineExceeded
		}
		timer := time.NewTimer(left)
		select {
		case <-changed:
		case <-timer.C:
		}
		timer.Stop()
	}
}

func (c *holdingConn) SetDeadline(t time.Time) error {
	c.setReadDeadline(t)
	return c.Conn.SetDeadline(t)
}

func (c *holdingConn) SetReadDeadline(t time.Time) error {
	c.setReadDeadline(t)
	return c.Conn.SetReadDeadline(t)
}

func (c *holdingConn) setReadDeadline(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deadline = t
	close(c.changed)
	c.changed = make(chan struct{})
}

func (c *holdingConn) Close() error {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		close(c.changed)
		c.changed = make(chan struct{})
	}
	c.mu.Unlock()
	return c.Conn.Close()
}
