package fencelock_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
)

// newSemaphore returns semaphore name with limit on a lessor of its own with holder id holder.
func newSemaphore(t *testing.T, b *bundle, holder, name string, limit int, opts ...fencelock.LessorOption) *fencelock.Semaphore {
	t.Helper()
	s, err := fencelock.NewSemaphore(newLessor(t, b.Pool, holder, opts...), name, limit)
	require.NoError(t, err)
	return s
}

// permitHeld runs t in parallel on a database of its own, where semaphore name (limit) of a
// lessor of holder (with opts) grants a permit for ttl; it returns the database, the
// semaphore and the permit.
func permitHeld(t *testing.T, holder, name string, limit int, ttl time.Duration, opts ...fencelock.LessorOption) (*bundle, *fencelock.Semaphore, *fencelock.Lease) {
	t.Helper()
	t.Parallel()
	b := setup(t)
	s := newSemaphore(t, b, holder, name, limit, opts...)
	p, err := s.TryAcquire(b.Ctx, ttl)
	require.NoError(t, err)
	return b, s, p
}

// semState reads a semaphore's state, failing the test on error.
func semState(t *testing.T, b *bundle, s *fencelock.Semaphore) fencelock.SemaphoreState {
	t.Helper()
	st, err := s.State(b.Ctx)
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
		p, err := s.TryAcquire(b.Ctx, 10*time.Second)
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
	_, err := other.TryAcquire(b.Ctx, 10*time.Second)
	require.ErrorIs(t, err, fencelock.ErrNotAcquired)
	require.Equal(t, fencelock.SemaphoreState{Limit: 3, Held: 3}, semState(t, b, s))

	require.NoError(t, permits[1].Release(b.Ctx))
	p, err := other.TryAcquire(b.Ctx, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, "sem:limit#1", p.Name(), "the lowest free slot")
	require.Greater(t, p.Token(), permits[1].Token(), "a new grant of a permit carries a larger token")
	require.Equal(t, "sem-b", readLease(t, b.Ctx, b.Pool, "sem:limit#1").Holder)
	// A permit is a lease: guarded and fenced like one.
	createWrites(t, b)
	require.NoError(t, fencedWrite(b.Ctx, b.Pool, "sem:limit#1", p.Token()))
	require.ErrorIs(t, fencedWrite(b.Ctx, b.Pool, "sem:limit#1", permits[1].Token()), fencelock.ErrStaleToken)
}

// Bad input is refused before any SQL with an ArgumentError.
func TestSemaphoreBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := newLessor(t, b.Pool, "sem-bad")
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
	_, err = s.TryAcquire(b.Ctx, time.Millisecond)
	require.ErrorIs(t, err, fencelock.ErrInvalidArgument)
	_, err = s.Acquire(b.Ctx, 0)
	require.ErrorIs(t, err, fencelock.ErrInvalidArgument)
	_, err = s.SetLimit(b.Ctx, 0)
	require.ErrorIs(t, err, fencelock.ErrInvalidArgument)
	var n int
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM fencelock.semaphores`).Scan(&n))
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
	b, holder, p := permitHeld(t, "sem-holder", "sem:fifo", 1, 10*time.Second)
	const n = 5
	got := make(chan int, n)
	permits := make([]*fencelock.Lease, n)
	var wg sync.WaitGroup
	for i := range n {
		// A slow backoff: only a wake-up serves a waiter quickly.
		s := newSemaphore(t, b, fmt.Sprintf("sem-w%d", i), "sem:fifo", 1, fencelock.WithBackoff(fencelock.ExponentialBackoff(5*time.Second, 5*time.Second)))
		wg.Go(func() {
			lp, err := s.Acquire(b.Ctx, 10*time.Second)
			if err == nil {
				permits[i] = lp
				got <- i
			}
		})
		waitQueued(t, b, holder, int64(i+1)) // i joined before i+1 starts
	}
	_, err := newSemaphore(t, b, "sem-try", "sem:fifo", 1).TryAcquire(b.Ctx, time.Second)
	require.ErrorIs(t, err, fencelock.ErrNotAcquired)
	require.NoError(t, p.Release(b.Ctx))
	for want := range n {
		select {
		case i := <-got:
			require.Equal(t, want, i, "served in arrival order")
		case <-time.After(1200 * time.Millisecond): // a waiter not woken would find it at its refresh, 1.67 s
			t.Fatalf("waiter %d not woken within 1.2 s of the release", want)
		}
		// The try still cannot barge while others wait.
		if want < n-1 {
			_, err = newSemaphore(t, b, fmt.Sprintf("sem-try%d", want), "sem:fifo", 1).TryAcquire(b.Ctx, time.Second)
			require.ErrorIs(t, err, fencelock.ErrNotAcquired)
		}
		require.NoError(t, permits[want].Release(b.Ctx))
	}
	wg.Wait()
	require.Equal(t, fencelock.SemaphoreState{Limit: 1}, semState(t, b, holder))
}

// The limit changes at run time for everyone: a higher one lets a waiter in at once (woken),
// a lower one ends no permit but grants nothing until fewer are held.
func TestSemaphoreSetLimit(t *testing.T) {
	b, s, p1 := permitHeld(t, "sem-set", "sem:set", 1, 10*time.Second)
	w := newSemaphore(t, b, "sem-setw", "sem:set", 1, fencelock.WithBackoff(fencelock.ExponentialBackoff(5*time.Second, 5*time.Second)))
	granted := fencetest.PermitAsync(b.Ctx, w, 10*time.Second)
	waitQueued(t, b, s, 1)
	prev, err := s.SetLimit(b.Ctx, 2)
	require.NoError(t, err)
	require.Equal(t, 1, prev)
	// Not woken, the waiter would find the room at its refresh, 1.67 s.
	got := fencetest.Receive(t, granted, 1200*time.Millisecond)
	require.NoError(t, got.Err)
	p2 := got.Lease
	require.Equal(t, fencelock.SemaphoreState{Limit: 2, Held: 2}, semState(t, b, s))

	_, err = s.SetLimit(b.Ctx, 1)
	require.NoError(t, err)
	require.NoError(t, p1.Err(), "a lowered limit ends no permit")
	require.NoError(t, p2.Err())
	require.NoError(t, p1.Release(b.Ctx))
	_, err = s.TryAcquire(b.Ctx, time.Second)
	require.ErrorIs(t, err, fencelock.ErrNotAcquired, "one held, limit 1")
	require.NoError(t, p2.Release(b.Ctx))
	p3, err := s.TryAcquire(b.Ctx, time.Second)
	require.NoError(t, err)
	require.NoError(t, p3.Release(b.Ctx))
	// NewSemaphore's limit does not override the stored one.
	other := newSemaphore(t, b, "sem-set2", "sem:set", 5)
	require.Equal(t, 1, semState(t, b, other).Limit)
}

// A permit whose holder stops renewing is reclaimed when its TTL ends on the database clock:
// the head waiter gets it, and the old holder's Done has closed by then, its renewal refused.
func TestSemaphoreExpiredPermitReclaimed(t *testing.T) {
	// TTL 1 s: a permit of 300 ms was granted, on a loaded machine, with its reply after its
	// trust window, and refused (issue 40).
	const ttl = time.Second
	b, _, p := permitHeld(t, "sem-dead", "sem:reclaim", 1, ttl, fencelock.WithoutHeartbeat())
	w := newSemaphore(t, b, "sem-next", "sem:reclaim", 1)
	start := time.Now()
	p2, err := w.Acquire(b.Ctx, 10*time.Second)
	require.NoError(t, err)
	took := time.Since(start)
	// Reclaimed at most about a second after it expired (Semaphore's doc), with room for a
	// loaded machine: a bound against a permit never reclaimed, not a speed.
	require.Less(t, took, ttl+5*time.Second)
	select {
	case <-p.Done():
	default:
		t.Fatal("the old holder's Done is still open after its permit was granted again")
	}
	require.ErrorIs(t, p.Renew(b.Ctx), fencelock.ErrLeaseLost)
	require.Greater(t, p2.Token(), p.Token())
	require.Equal(t, p.Name(), p2.Name())
	require.ErrorIs(t, p.Release(b.Ctx), fencelock.ErrNotHeld)
	require.NoError(t, p2.Err())
}

// A waiter whose ctx ends leaves the queue before Acquire returns, and holds nothing; several
// goroutines of one lessor wait for and hold several permits of one semaphore.
func TestSemaphoreCancelAndSameLessor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := newLessor(t, b.Pool, "sem-same")
	s, err := fencelock.NewSemaphore(l, "sem:same", 2)
	require.NoError(t, err)
	p1, err := s.Acquire(b.Ctx, 10*time.Second)
	require.NoError(t, err)
	p2, err := s.Acquire(b.Ctx, 10*time.Second)
	require.NoError(t, err)
	require.NotEqual(t, p1.Name(), p2.Name())
	ctx, cancel := context.WithTimeout(b.Ctx, 200*time.Millisecond)
	defer cancel()
	_, err = s.Acquire(ctx, 10*time.Second)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, fencelock.SemaphoreState{Limit: 2, Held: 2}, semState(t, b, s), "no place left in the queue")
	var rows int
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM fencelock.semaphore_waiters`).Scan(&rows))
	require.Zero(t, rows)
	// Two goroutines of the lessor wait at once; each release lets one in.
	first, second := fencetest.PermitAsync(b.Ctx, s, 10*time.Second), fencetest.PermitAsync(b.Ctx, s, 10*time.Second)
	waitQueued(t, b, s, 2)
	require.NoError(t, p1.Release(b.Ctx))
	require.NoError(t, p2.Release(b.Ctx))
	for _, ch := range []<-chan acquired{first, second} {
		got := fencetest.Receive(t, ch, 10*time.Second)
		require.NoError(t, got.Err)
		require.NoError(t, got.Lease.Release(b.Ctx))
	}
	require.Equal(t, fencelock.SemaphoreState{Limit: 2}, semState(t, b, s))
}

// A refused try says why (issue 40): all the limit's permits held, or waiters ahead in the
// queue; both wrap ErrNotAcquired. (Busy: TestSemaphoreTryAcquireWhileCreated.)
func TestSemaphoreTryRefusalSaysWhy(t *testing.T) {
	b, _, p := permitHeld(t, "why-holder", "sem:why", 1, time.Minute)
	try := newSemaphore(t, b, "why-try", "sem:why", 1)
	_, err := try.TryAcquire(b.Ctx, time.Minute)
	require.ErrorIs(t, err, fencelock.ErrNotAcquired)
	require.ErrorContains(t, err, "all 1 permits held")

	waiter := newSemaphore(t, b, "why-waiter", "sem:why", 1)
	ctx, cancel := context.WithCancel(b.Ctx)
	defer cancel()
	waited := make(chan error, 1)
	go func() {
		_, err := waiter.Acquire(ctx, time.Minute)
		waited <- err
	}()
	testkit.WaitFor(t, b.Ctx, "the waiter to queue", func() bool {
		return semState(t, b, try).Waiting == 1
	})
	_, err = try.TryAcquire(b.Ctx, time.Minute)
	require.ErrorIs(t, err, fencelock.ErrNotAcquired)
	require.ErrorContains(t, err, "1 waiter(s) ahead in its queue")
	cancel()
	require.ErrorIs(t, <-waited, context.Canceled)
	require.NoError(t, p.Release(b.Ctx))
}
