package fencelock_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// newSemaphore returns semaphore name with limit on a lessor of its own with holder id holder.
func newSemaphore(t *testing.T, b *bundle, holder, name string, limit int, opts ...fencelock.LessorOption) *fencelock.Semaphore {
	t.Helper()
	s, err := fencelock.NewSemaphore(newLessor(t, b.pool, holder, opts...), name, limit)
	require.NoError(t, err)
	return s
}

// semState reads a semaphore's state, failing the test on error.
func semState(t *testing.T, b *bundle, s *fencelock.Semaphore) fencelock.SemaphoreState {
	t.Helper()
	st, err := s.State(b.ctx)
	require.NoError(t, err)
	return st
}

// At most limit permits at once, each a lease named "<sem>#<slot>" with a token of its own; a
// try is refused at the limit and granted again after a release; one lessor may hold several.
func TestSemaphoreLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := newSemaphore(t, b, "sem-a", "sem:limit", 3)
	var permits []*fencelock.Lease
	for range 3 {
		p, err := s.TryAcquire(b.ctx, 10*time.Second)
		require.NoError(t, err)
		permits = append(permits, p)
	}
	names := map[string]bool{}
	tokens := map[fencelock.Token]bool{}
	for _, p := range permits {
		names[p.Name()] = true
		tokens[p.Token()] = true
		require.NoError(t, p.Err())
	}
	require.Equal(t, map[string]bool{"sem:limit#0": true, "sem:limit#1": true, "sem:limit#2": true}, names)
	require.Len(t, tokens, 3)
	other := newSemaphore(t, b, "sem-b", "sem:limit", 3)
	_, err := other.TryAcquire(b.ctx, 10*time.Second)
	require.ErrorIs(t, err, fencelock.ErrNotAcquired)
	require.Equal(t, fencelock.SemaphoreState{Limit: 3, Held: 3}, semState(t, b, s))

	require.NoError(t, permits[1].Release(b.ctx))
	p, err := other.TryAcquire(b.ctx, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, "sem:limit#1", p.Name(), "the lowest free slot")
	require.Greater(t, p.Token(), permits[1].Token(), "a new grant of a permit carries a larger token")
	require.Equal(t, "sem-b", readLease(t, b.ctx, b.pool, "sem:limit#1").Holder)
	// A permit is a lease: guarded and fenced like one.
	createWrites(t, b)
	require.NoError(t, fencedWrite(b.ctx, b.pool, "sem:limit#1", p.Token()))
	require.ErrorIs(t, fencedWrite(b.ctx, b.pool, "sem:limit#1", permits[1].Token()), fencelock.ErrStaleToken)
}

// Bad input is refused before any SQL with an ArgumentError.
func TestSemaphoreBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := newLessor(t, b.pool, "sem-bad")
	for _, tc := range []struct {
		name  string
		limit int
	}{{"", 1}, {"x\x00", 1}, {string(make([]byte, fencelock.MaxNameLength)), 1}, {"ok", 0}, {"ok", fencelock.MaxSemaphoreLimit + 1}} {
		_, err := fencelock.NewSemaphore(l, tc.name, tc.limit)
		var ae *fencelock.ArgumentError
		require.ErrorAs(t, err, &ae, "%q %d", tc.name, tc.limit)
	}
	_, err := fencelock.NewSemaphore(nil, "x", 1)
	require.ErrorIs(t, err, fencelock.ErrInvalidArgument)
	s, err := fencelock.NewSemaphore(l, "sem:bad", 1)
	require.NoError(t, err)
	_, err = s.TryAcquire(b.ctx, time.Millisecond)
	require.ErrorIs(t, err, fencelock.ErrInvalidArgument)
	_, err = s.Acquire(b.ctx, 0)
	require.ErrorIs(t, err, fencelock.ErrInvalidArgument)
	_, err = s.SetLimit(b.ctx, 0)
	require.ErrorIs(t, err, fencelock.ErrInvalidArgument)
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM fencelock.semaphores`).Scan(&n))
	require.Zero(t, n, "no SQL ran")
}

// waitQueued waits until sem has n live waiters.
func waitQueued(t *testing.T, b *bundle, s *fencelock.Semaphore, n int64) {
	t.Helper()
	require.Eventually(t, func() bool { return semState(t, b, s).Waiting == n }, 10*time.Second, 2*time.Millisecond)
}

// Waiters are served first come, first served, each woken by the release that frees a permit
// for it (within 1.2 s; its refresh, a third of its 5 s liveness, would find it at 1.67 s, and
// its polls are 5 s apart); a try never takes a permit someone waits for.
func TestSemaphoreWaitersInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	holder := newSemaphore(t, b, "sem-holder", "sem:fifo", 1)
	p, err := holder.TryAcquire(b.ctx, 10*time.Second)
	require.NoError(t, err)
	const n = 5
	got := make(chan int, n)
	permits := make([]*fencelock.Lease, n)
	var wg sync.WaitGroup
	for i := range n {
		// A slow backoff: only a wake-up serves a waiter quickly.
		s := newSemaphore(t, b, fmt.Sprintf("sem-w%d", i), "sem:fifo", 1, fencelock.WithBackoff(fencelock.ExponentialBackoff(5*time.Second, 5*time.Second)))
		wg.Go(func() {
			lp, err := s.Acquire(b.ctx, 10*time.Second)
			if err == nil {
				permits[i] = lp
				got <- i
			}
		})
		waitQueued(t, b, holder, int64(i+1)) // i joined before i+1 starts
	}
	_, err = newSemaphore(t, b, "sem-try", "sem:fifo", 1).TryAcquire(b.ctx, time.Second)
	require.ErrorIs(t, err, fencelock.ErrNotAcquired)
	require.NoError(t, p.Release(b.ctx))
	for want := range n {
		select {
		case i := <-got:
			require.Equal(t, want, i, "served in arrival order")
		case <-time.After(1200 * time.Millisecond): // a waiter not woken would find it at its refresh, 1.67 s
			t.Fatalf("waiter %d not woken within 1.2 s of the release", want)
		}
		// The try still cannot barge while others wait.
		if want < n-1 {
			_, err = newSemaphore(t, b, fmt.Sprintf("sem-try%d", want), "sem:fifo", 1).TryAcquire(b.ctx, time.Second)
			require.ErrorIs(t, err, fencelock.ErrNotAcquired)
		}
		require.NoError(t, permits[want].Release(b.ctx))
	}
	wg.Wait()
	require.Equal(t, fencelock.SemaphoreState{Limit: 1}, semState(t, b, holder))
}

// The limit changes at run time for everyone: a higher one lets a waiter in at once (woken),
// a lower one ends no permit but grants nothing until fewer are held.
func TestSemaphoreSetLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := newSemaphore(t, b, "sem-set", "sem:set", 1)
	p1, err := s.TryAcquire(b.ctx, 10*time.Second)
	require.NoError(t, err)
	w := newSemaphore(t, b, "sem-setw", "sem:set", 1, fencelock.WithBackoff(fencelock.ExponentialBackoff(5*time.Second, 5*time.Second)))
	granted := permitAsync(b.ctx, w, 10*time.Second)
	waitQueued(t, b, s, 1)
	prev, err := s.SetLimit(b.ctx, 2)
	require.NoError(t, err)
	require.Equal(t, 1, prev)
	// Not woken, the waiter would find the room at its refresh, 1.67 s.
	got := receive(t, granted, 1200*time.Millisecond)
	require.NoError(t, got.err)
	p2 := got.lease
	require.Equal(t, fencelock.SemaphoreState{Limit: 2, Held: 2}, semState(t, b, s))

	_, err = s.SetLimit(b.ctx, 1)
	require.NoError(t, err)
	require.NoError(t, p1.Err(), "a lowered limit ends no permit")
	require.NoError(t, p2.Err())
	require.NoError(t, p1.Release(b.ctx))
	_, err = s.TryAcquire(b.ctx, time.Second)
	require.ErrorIs(t, err, fencelock.ErrNotAcquired, "one held, limit 1")
	require.NoError(t, p2.Release(b.ctx))
	p3, err := s.TryAcquire(b.ctx, time.Second)
	require.NoError(t, err)
	require.NoError(t, p3.Release(b.ctx))
	// NewSemaphore's limit does not override the stored one.
	other := newSemaphore(t, b, "sem-set2", "sem:set", 5)
	require.Equal(t, 1, semState(t, b, other).Limit)
}

// A permit whose holder stops renewing is reclaimed when its TTL ends on the database clock:
// the head waiter gets it, and the old holder's Done has closed by then, its renewal refused.
func TestSemaphoreExpiredPermitReclaimed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := newSemaphore(t, b, "sem-dead", "sem:reclaim", 1, fencelock.WithoutHeartbeat())
	p, err := s.TryAcquire(b.ctx, 300*time.Millisecond)
	require.NoError(t, err)
	w := newSemaphore(t, b, "sem-next", "sem:reclaim", 1)
	start := time.Now()
	p2, err := w.Acquire(b.ctx, 10*time.Second)
	require.NoError(t, err)
	took := time.Since(start)
	require.Less(t, took, 3*time.Second)
	select {
	case <-p.Done():
	default:
		t.Fatal("the old holder's Done is still open after its permit was granted again")
	}
	require.ErrorIs(t, p.Renew(b.ctx), fencelock.ErrLeaseLost)
	require.Greater(t, p2.Token(), p.Token())
	require.Equal(t, p.Name(), p2.Name())
	require.ErrorIs(t, p.Release(b.ctx), fencelock.ErrNotHeld)
	require.NoError(t, p2.Err())
}

// A waiter whose ctx ends leaves the queue before Acquire returns, and holds nothing; several
// goroutines of one lessor wait for and hold several permits of one semaphore.
func TestSemaphoreCancelAndSameLessor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := newLessor(t, b.pool, "sem-same")
	s, err := fencelock.NewSemaphore(l, "sem:same", 2)
	require.NoError(t, err)
	p1, err := s.Acquire(b.ctx, 10*time.Second)
	require.NoError(t, err)
	p2, err := s.Acquire(b.ctx, 10*time.Second)
	require.NoError(t, err)
	require.NotEqual(t, p1.Name(), p2.Name())
	ctx, cancel := context.WithTimeout(b.ctx, 200*time.Millisecond)
	defer cancel()
	_, err = s.Acquire(ctx, 10*time.Second)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, fencelock.SemaphoreState{Limit: 2, Held: 2}, semState(t, b, s), "no place left in the queue")
	var rows int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM fencelock.semaphore_waiters`).Scan(&rows))
	require.Zero(t, rows)
	// Two goroutines of the lessor wait at once; each release lets one in.
	first, second := permitAsync(b.ctx, s, 10*time.Second), permitAsync(b.ctx, s, 10*time.Second)
	waitQueued(t, b, s, 2)
	require.NoError(t, p1.Release(b.ctx))
	require.NoError(t, p2.Release(b.ctx))
	for _, ch := range []<-chan acquired{first, second} {
		got := receive(t, ch, 10*time.Second)
		require.NoError(t, got.err)
		require.NoError(t, got.lease.Release(b.ctx))
	}
	require.Equal(t, fencelock.SemaphoreState{Limit: 2}, semState(t, b, s))
}

// A ctx that ends while the grant statement is in flight (here blocked on the semaphore's row,
// which a transaction holds), with the cancel request lost, leaves nothing held: the statement
// goes on once the row is free and grants a permit nobody will use, and the cleanup ends that
// permit after the backend has exited.
func TestSemaphoreCancelledMidGrantLeavesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, refuseNextDial := poolRefusingCancel(t, b)
	s, err := fencelock.NewSemaphore(newLessor(t, pool, "sem-mid"), "sem:mid", 1)
	require.NoError(t, err)
	_, err = s.SetLimit(b.ctx, 1) // the row to block on
	require.NoError(t, err)
	defer holdFor(t, b, 300*time.Millisecond, `SELECT 1 FROM fencelock.semaphores WHERE name = 'sem:mid' FOR UPDATE`)()
	ctx, cancel := context.WithTimeout(b.ctx, 100*time.Millisecond)
	defer cancel()
	refuseNextDial()
	_, err = s.TryAcquire(ctx, 10*time.Second)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	var held, ended int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FILTER (WHERE expires_at > clock_timestamp()), count(*) FILTER (WHERE expires_at <= clock_timestamp())
		FROM fencelock.leases WHERE holder = 'sem-mid'`).Scan(&held, &ended))
	require.Zero(t, held, "a permit granted after the caller gave up is still held")
	require.Equal(t, 1, ended, "the statement went on and granted a permit, which the cleanup ended")
	p, err := newSemaphore(t, b, "sem-mid2", "sem:mid", 1).TryAcquire(b.ctx, time.Second)
	require.NoError(t, err)
	require.NoError(t, p.Release(b.ctx))
}

// poolRefusingCancel returns a pool on b's database with three connections open, and a func
// after which the pool dials no more: pgx's cancel request (a dial of its own), when a ctx
// ends mid-statement, then fails; pgx closes the connection, the statement's outcome is
// unknown, and the statement goes on on the server. The cleanup uses the idle connections.
func poolRefusingCancel(t *testing.T, b *bundle) (*pgxpool.Pool, func()) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	var refuse atomic.Bool
	var d net.Dialer
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if refuse.Load() {
			return nil, errors.New("dial refused by the test")
		}
		return d.DialContext(ctx, network, addr)
	}
	cfg.MaxConns = 3
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var conns []*pgxpool.Conn
	for range 3 {
		c, err := pool.Acquire(b.ctx)
		require.NoError(t, err)
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	return pool, func() { refuse.Store(true) }
}

// An old holder's guarded transaction still open on its expired permit holds up no grant: the
// permit counts as held (it is not granted while that transaction is open), and the other
// permits are granted at once. (The grant locked every expired permit row and waited for that
// one, and every grant of the semaphore queued behind it.)
func TestSemaphoreGuardedExpiredPermitBlocksNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := newSemaphore(t, b, "sem-guard", "sem:guard", 2, fencelock.WithoutHeartbeat())
	p, err := s.TryAcquire(b.ctx, 200*time.Millisecond)
	require.NoError(t, err)
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	require.NoError(t, p.GuardTx(b.ctx, tx))
	require.Eventually(t, func() bool { return semState(t, b, s).Held == 0 }, 5*time.Second, 10*time.Millisecond, "the permit expires")
	other := newSemaphore(t, b, "sem-guard2", "sem:guard", 2)
	ctx, cancel := context.WithTimeout(b.ctx, 3*time.Second)
	defer cancel()
	q, err := other.TryAcquire(ctx, 10*time.Second)
	require.NoError(t, err, "a free permit was not granted while an expired one is guarded")
	require.Equal(t, "sem:guard#1", q.Name(), "the guarded permit is not granted while its transaction is open")
	_, err = other.TryAcquire(ctx, 10*time.Second)
	require.ErrorIs(t, err, fencelock.ErrNotAcquired, "refused at once, not held up")
	require.NoError(t, tx.Rollback(b.ctx))
	// Once the transaction has ended, the next reclaim (at most 100 ms after the last one, while
	// an expired permit's row stays locked) frees the permit.
	var r *fencelock.Lease
	require.Eventually(t, func() bool {
		r, err = other.TryAcquire(b.ctx, 10*time.Second)
		return err == nil
	}, 2*time.Second, 10*time.Millisecond, "the expired permit is not reclaimed once its guard ends: %v", err)
	require.Equal(t, "sem:guard#0", r.Name())
}

// An Acquire whose first attempt's outcome is unknown (its ctx ended mid-statement, the cancel
// request lost) leaves no place in the queue: a place left there would hold off every try and
// every waiter behind it for its liveness.
func TestSemaphoreAbandonedWaitLeavesNoPlace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := newSemaphore(t, b, "sem-ghost-h", "sem:ghost", 1)
	held, err := h.TryAcquire(b.ctx, 10*time.Second)
	require.NoError(t, err)
	pool, refuseNextDial := poolRefusingCancel(t, b)
	w, err := fencelock.NewSemaphore(newLessor(t, pool, "sem-ghost-w"), "sem:ghost", 1)
	require.NoError(t, err)
	defer holdFor(t, b, 300*time.Millisecond, `SELECT 1 FROM fencelock.semaphores WHERE name = 'sem:ghost' FOR UPDATE`)()
	ctx, cancel := context.WithTimeout(b.ctx, 100*time.Millisecond)
	defer cancel()
	refuseNextDial()
	_, err = w.Acquire(ctx, 10*time.Second)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Zero(t, semState(t, b, h).Waiting, "a place left in the queue")
	require.NoError(t, held.Release(b.ctx))
	p, err := newSemaphore(t, b, "sem-ghost-t", "sem:ghost", 1).TryAcquire(b.ctx, time.Second)
	require.NoError(t, err, "a try refused with the permit free")
	require.NoError(t, p.Release(b.ctx))
}

// A woken head waiter that gives up passes the wake-up on: the waiter behind it is granted
// well before its next refresh (a third of its liveness, 1.67 s here), at once.
func TestSemaphoreWaiterGivingUpWakesTheNext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := newSemaphore(t, b, "sem-gu-h", "sem:giveup", 1)
	held, err := h.TryAcquire(b.ctx, 15*time.Second)
	require.NoError(t, err)
	slow := fencelock.WithBackoff(fencelock.ExponentialBackoff(5*time.Second, 5*time.Second))
	w1 := newSemaphore(t, b, "sem-gu-1", "sem:giveup", 1, slow)
	w2 := newSemaphore(t, b, "sem-gu-2", "sem:giveup", 1, slow)
	ctx1, cancel1 := context.WithCancel(b.ctx)
	defer cancel1()
	gave := make(chan error, 1)
	go func() { _, err := w1.Acquire(ctx1, 15*time.Second); gave <- err }()
	waitQueued(t, b, h, 1)
	second := permitAsync(b.ctx, w2, 15*time.Second)
	waitQueued(t, b, h, 2)
	cancel1()
	require.NoError(t, held.Release(b.ctx))
	released := time.Now()
	require.ErrorIs(t, <-gave, context.Canceled)
	got := receive(t, second, 10*time.Second)
	require.NoError(t, got.err)
	require.Less(t, got.at.Sub(released), 1200*time.Millisecond, "the next waiter waited for its refresh")
	t.Logf("the waiter behind the one that gave up was granted %v after the release", got.at.Sub(released).Round(time.Millisecond))
	require.NoError(t, got.lease.Release(b.ctx))
}

// The cleanup of an attempt of unknown outcome ends only what that attempt may have granted:
// never a permit another goroutine of the same lessor was granted meanwhile and trusts. Eight
// goroutines take, check and release permits while four make attempts that ctx cuts short.
func TestSemaphoreAbandonedAttemptSparesSiblings(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := newLessor(t, b.pool, "sem-sib")
	s, err := fencelock.NewSemaphore(l, "sem:sib", 200)
	require.NoError(t, err)
	deadline := time.Now().Add(2 * time.Second)
	var wg sync.WaitGroup
	var grants, cut atomic.Int64
	for range 8 {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				p, err := s.TryAcquire(b.ctx, 10*time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				grants.Add(1)
				time.Sleep(3 * time.Millisecond)
				if p.Err() == nil {
					var live bool
					err := b.pool.QueryRow(b.ctx, `SELECT expires_at > clock_timestamp() FROM fencelock.leases WHERE name = $1 AND token = $2 AND holder = 'sem-sib'`, p.Name(), int64(p.Token())).Scan(&live)
					if err != nil || !live {
						t.Errorf("permit %s (token %d) trusted by its holder but ended on the server (%v)", p.Name(), p.Token(), err)
					}
				}
				_ = p.Release(b.ctx)
			}
		})
	}
	for g := range 4 {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				ctx, cancel := context.WithTimeout(b.ctx, time.Duration((g*7+i)%15)*100*time.Microsecond)
				p, err := s.TryAcquire(ctx, 10*time.Second)
				cancel()
				if err == nil {
					_ = p.Release(b.ctx)
				} else {
					cut.Add(1)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d grants checked, %d attempts cut short", grants.Load(), cut.Load())
	require.Positive(t, cut.Load())
}

// holdFor runs sql in a transaction of its own and commits it d later, in the background: the
// locks sql takes block others for d. The returned func waits for the commit.
func holdFor(t *testing.T, b *bundle, d time.Duration, sql string) (wait func()) {
	t.Helper()
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	_, err = tx.Exec(b.ctx, sql)
	require.NoError(t, err)
	committed := make(chan struct{})
	go func() {
		defer close(committed)
		time.Sleep(d)
		_ = tx.Commit(b.ctx)
	}()
	return func() { <-committed }
}

// permitAsync waits for a permit of s in a goroutine of its own and delivers the result, with
// the time it came back.
func permitAsync(ctx context.Context, s *fencelock.Semaphore, ttl time.Duration) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		p, err := s.Acquire(ctx, ttl)
		ch <- acquired{p, err, time.Now()}
	}()
	return ch
}
