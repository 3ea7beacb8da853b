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

// observedConn is a silentConn (listener_silent_test.go) that remembers what it was used for:
// LISTEN (a notifier's listening connection) or the leader's read (an observer's session).
type observedConn struct {
	*silentConn
	listening, reading atomic.Bool
}

func (c *observedConn) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("LISTEN ")) {
		c.listening.Store(true)
	}
	if bytes.Contains(p, []byte("fencelock.election_values")) { // the text of ElectionLeader
		c.reading.Store(true)
	}
	return c.silentConn.Write(p)
}

// observedDialer dials observedConns and keeps them, to silence the open ones at once.
type observedDialer struct {
	mu    sync.Mutex
	conns []*observedConn
}

func (d *observedDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	oc := &observedConn{silentConn: &silentConn{Conn: c, listened: make(chan struct{}), closed: make(chan struct{})}}
	d.mu.Lock()
	d.conns = append(d.conns, oc)
	d.mu.Unlock()
	return oc, nil
}

// silence silences the open connections that listen or read the leader, as a half-open TCP
// flow would (bytes dropped both ways, no error, no close), and returns how many of each.
func (d *observedDialer) silence() (listening, reading int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.conns {
		select {
		case <-c.closed:
			continue
		default:
		}
		l, r := c.listening.Load(), c.reading.Load()
		if !l && !r {
			continue
		}
		c.silent.Store(true)
		if l {
			listening++
		}
		if r {
			reading++
		}
	}
	return listening, reading
}

// observeNoticeBound is Observe's documented bound: a silently dead listening connection or
// reading session is noticed within 4 s of its last sign of life.
const observeNoticeBound = 4 * time.Second

// An observer whose listening connection and reading session both go silent (a half-open TCP
// flow: a NAT or firewall that dropped them) notices within its documented bound, and the
// next leader reaches it without waiting out the TTL. Issue 39: with a TTL of 20 s it took 24 s
// (4 s for the notifier to notice, then a read on the dead session that waited max(TTL, 5 s)).
// That defect cannot deliver sooner than a TTL after the silence (its read starts after it and
// waits the TTL), so the bound is 15 s, under the TTL: it separates the defect, and leaves a
// loaded machine 11 s past the documented 4 s for the hand-off (a new session, a read).
func TestObserveSilentConnections(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := &observedDialer{}
	cfg, err := pgxpool.ParseConfig(b.DB.URL)
	require.NoError(t, err)
	cfg.ConnConfig.DialFunc = d.dial
	pool, err := pgxpool.NewWithConfig(b.Ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	const name, ttl = "election:silent", 20 * time.Second
	watcher := fencetest.NewElection(t, pool, "silent-watcher", name, ttl)
	a := fencetest.NewElection(t, b.Pool, "silent-a", name, ttl)
	c := fencetest.NewElection(t, b.Pool, "silent-c", name, ttl)

	octx, stop := context.WithCancel(b.Ctx)
	defer stop()
	states := watcher.Observe(octx)
	require.Equal(t, fencelock.LeaderInfo{}, fencetest.Next(t, states), "nobody leads yet")
	// The observer's pool listens (LISTEN done: its session idles after it), so what follows
	// reaches the observer by NOTIFY, as in the issue, not by its fallback poll.
	waitFor(t, b, "the observer's pool listens", func() bool {
		var n int
		require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'idle' AND query LIKE 'LISTEN %'`).Scan(&n))
		return n == 1
	})

	ta, err := a.Campaign(b.Ctx, "a")
	require.NoError(t, err)
	defer func() { _ = ta.Resign(context.Background()) }()
	got := fencetest.NextWhere(t, states, 0, func(i fencelock.LeaderInfo) bool { return i.Value == "a" })
	require.Equal(t, ta.Token(), got.Token)

	elected := make(chan *fencelock.Term, 1)
	go func() {
		tc, err := c.Campaign(b.Ctx, "c")
		if err != nil {
			t.Error(err)
		}
		elected <- tc
	}()
	awaitWaiters(t, b, name, 1)

	listening, reading := d.silence()
	silencedAt := time.Now()
	require.Equal(t, 1, listening, "the observer's pool has one listening connection")
	require.Equal(t, 1, reading, "the observer has one reading session")
	require.NoError(t, ta.Resign(b.Ctx)) // hands the term to c; its NOTIFY is lost in the silence
	resignedAt := time.Now()
	tc := <-elected
	require.NotNil(t, tc)
	defer func() { _ = tc.Resign(context.Background()) }()

	// The bound is under the TTL, which the defect waits out (see above): the documented 4 s
	// plus 11 s for the hand-off on a loaded machine (7 s, 4 s plus 3 s, was beaten there).
	// The wait is longer, to measure a miss.
	const bound = observeNoticeBound + 11*time.Second
	require.Less(t, bound, ttl, "the bound must stay under the TTL that the defect waits out")
	limit := time.NewTimer(2 * ttl)
	defer limit.Stop()
	last := ta.Token()
	for {
		select {
		case info, ok := <-states:
			require.True(t, ok, "the observer's channel closed")
			if info.Token != 0 {
				require.GreaterOrEqual(t, info.Token, last, "terms delivered out of order")
				last = info.Token
			}
			if info.Token != tc.Token() {
				continue
			}
			took := time.Since(silencedAt)
			t.Logf("the new leader reached the observer %v after the silence (%v after the resign)",
				took.Round(time.Millisecond), time.Since(resignedAt).Round(time.Millisecond))
			require.Equal(t, "silent-c", info.Holder)
			require.LessOrEqual(t, took, bound, "the new leader reached the observer later than its notice bound plus 11 s for a hand-off: it waited out the TTL?")
			return
		case <-limit.C:
			t.Fatalf("the observer delivered no new leader within %v of the silence", 2*ttl)
		}
	}
}
