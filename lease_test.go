package fencelock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

func TestLease(t *testing.T) {
	t.Parallel()

	t.Run("OneHolderThenLargerTokenAfterRelease", func(t *testing.T) {
		b, a, c := twoLessors(t, false)

		la, err := a.TryAcquire(b.Ctx, "job", 10*time.Second)
		require.NoError(t, err)
		require.Greater(t, la.Token(), fencelock.Token(0))
		_, err = c.TryAcquire(b.Ctx, "job", 10*time.Second)
		require.ErrorIs(t, err, fencelock.ErrNotAcquired)

		require.NoError(t, la.Release(b.Ctx))
		waitDone(t, la, time.Second)
		require.ErrorIs(t, la.Err(), fencelock.ErrReleased)

		lc, err := c.TryAcquire(b.Ctx, "job", 10*time.Second)
		require.NoError(t, err)
		require.Greater(t, lc.Token(), la.Token())
		require.Equal(t, leaseRow{Holder: "c", Token: int64(lc.Token())}, readLease(t, b.Ctx, b.Pool, "job"))
		require.NoError(t, lc.Release(b.Ctx))
	})

	t.Run("LargerTokenAfterExpiry", func(t *testing.T) {
		b, a, c := twoLessors(t, true)

		// TTL 2 s: the try below must reach the server before the expiry (with 300 ms, a loaded
		// machine could let it through, granted).
		la, err := a.Acquire(b.Ctx, "job", 2*time.Second)
		require.NoError(t, err)
		_, err = c.TryAcquire(b.Ctx, "job", time.Second)
		require.ErrorIs(t, err, fencelock.ErrNotAcquired)

		// Acquire waits until the server-side expiry and then gets a larger token.
		lc, err := c.Acquire(b.Ctx, "job", time.Second)
		require.NoError(t, err)
		require.Greater(t, lc.Token(), la.Token())
		// The old holder stopped trusting its lease before the new grant: its trust window
		// (TTL less the margin, from before its grant was sent) ended first, and Done closes.
		require.True(t, la.TrustedUntil().Before(time.Now()), "old trust window still open after a new grant")
		waitDone(t, la, time.Second)
		require.ErrorIs(t, la.Err(), fencelock.ErrLeaseLost)
		require.ErrorIs(t, la.Err(), fencelock.ErrTrustWindowExpired)
		require.NoError(t, lc.Release(b.Ctx))
	})

	t.Run("HeartbeatKeepsLeasePastTTL", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// A TTL of 5 s renewed every 333 ms: the trust window (4.5 s) outlasts a renewal some
		// 4 s late. With a TTL of a second renewed every third of it, a loaded machine (the
		// suite beside four busy loops and a second suite) lost the lease when a renewal came
		// 600 ms late; with 150 ms, when one came 100 ms late.
		const ttl = 5 * time.Second
		a := newLessor(t, b.Pool, "a", fencelock.WithHeartbeatInterval(333*time.Millisecond))
		c := newLessor(t, b.Pool, "c")
		la, err := a.Acquire(b.Ctx, "job", ttl)
		require.NoError(t, err)
		// Wait for a renewal sent after the grant's expiry: it moves ExpiresAt (database clock)
		// past that expiry plus a TTL, and LeaseRenew only renews an unexpired row, so the
		// heartbeat kept the lease without a gap past its TTL. Without renewals the trust
		// window ends first (Done closes); the minute is a bound for a hang only.
		first := la.ExpiresAt()
		deadline := time.Now().Add(time.Minute)
		for !la.ExpiresAt().After(first.Add(ttl)) {
			require.True(t, time.Now().Before(deadline), "lease not renewed past its TTL in a minute")
			select {
			case <-la.Done():
				t.Fatalf("healthy lease lost: %v", la.Err())
			case <-time.After(10 * time.Millisecond):
			}
		}
		// Past the grant's expiry on the database clock, the lease is still held there.
		_, err = c.TryAcquire(b.Ctx, "job", time.Second)
		require.ErrorIs(t, err, fencelock.ErrNotAcquired)
		require.NoError(t, la.Err())
		require.NoError(t, la.Release(b.Ctx))
	})

	t.Run("ManyLeasesOneLessor", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := newLessor(t, b.Pool, "a")
		// A TTL of 5 s with the default heartbeat (a third of it): a batch may come nearly 3 s
		// late before a trust window (4.5 s) ends. With a TTL of a second, a loaded machine
		// lost a lease to a batch 600 ms late.
		const n, ttl = 200, 5 * time.Second
		var leases []*fencelock.Lease
		var lastExpiry time.Time // the latest expiry read as the leases were granted, database clock
		for i := range n {
			l, err := a.TryAcquire(b.Ctx, fmt.Sprintf("job:%d", i), ttl)
			require.NoError(t, err)
			leases = append(leases, l)
			if l.ExpiresAt().After(lastExpiry) {
				lastExpiry = l.ExpiresAt()
			}
		}
		// Once the database clock is past every grant's expiry, every lease is still held
		// there: the batched heartbeat renewed all 200 in time (a lease it left out expires
		// at its grant's expiry and is missing from the count).
		var stillHeld int
		require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT pg_sleep_until($1::timestamptz + interval '10 milliseconds')::text IS NOT NULL`, lastExpiry).Scan(new(bool)))
		require.NoError(t, b.Pool.QueryRow(b.Ctx,
			`SELECT count(*) FROM fencelock.leases WHERE holder = 'a' AND expires_at > clock_timestamp()`).Scan(&stillHeld))
		require.Equal(t, n, stillHeld)
		for _, l := range leases {
			require.NoError(t, l.Err())
			require.NoError(t, l.Release(b.Ctx))
		}
	})
}

// Tokens for one name strictly increase across 1,000 grants raced by 16 goroutines, each with
// its own lessor. Grants are exclusive, so appending under a mutex while holding records them
// in grant order.
func TestTokensStrictlyIncreaseUnderContention(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const workers, grants = 16, 1000
	var (
		mu     sync.Mutex
		tokens []int64
		wg     sync.WaitGroup
		errs   = make(chan error, workers)
	)
	next := make(chan struct{}, grants)
	for range grants {
		next <- struct{}{}
	}
	close(next)
	for w := range workers {
		l := newLessor(t, b.Pool, fmt.Sprintf("w%d", w), fastBackoff)
		wg.Go(func() {
			for range next {
				lease, err := l.Acquire(b.Ctx, "hot", 5*time.Second)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				tokens = append(tokens, int64(lease.Token()))
				mu.Unlock()
				if err := lease.Release(b.Ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, tokens, grants)
	for i := 1; i < len(tokens); i++ {
		require.Greater(t, tokens[i], tokens[i-1], "grant %d", i)
	}
	require.Equal(t, tokens[len(tokens)-1], readLease(t, b.Ctx, b.Pool, "hot").Token)
}

// A holder paused past its TTL (its heartbeat stopped): the new holder's fenced write commits,
// the old holder's is rejected with the typed error, and the old holder's Done has closed.
func TestPausedHolderIsFenced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createWrites(t, b)
	old := newLessor(t, b.Pool, "old", fencelock.WithoutHeartbeat())
	cur := newLessor(t, b.Pool, "new", fastBackoff)

	lo, err := old.Acquire(b.Ctx, "payment:1", 200*time.Millisecond)
	require.NoError(t, err)
	// "Pause": the old holder does nothing while the new one waits out its TTL.
	ln, err := cur.Acquire(b.Ctx, "payment:1", 5*time.Second)
	require.NoError(t, err)
	require.NoError(t, fencedWrite(b.Ctx, b.Pool, "payment:1", ln.Token()))

	// The old holder wakes up and writes with its old token.
	err = fencedWrite(b.Ctx, b.Pool, "payment:1", lo.Token())
	var stale *fencelock.StaleTokenError
	require.ErrorAs(t, err, &stale)
	require.ErrorIs(t, err, fencelock.ErrStaleToken)
	require.Equal(t, fencelock.StaleTokenError{Resource: "payment:1", Token: lo.Token(), Current: ln.Token()}, *stale)
	waitDone(t, lo, time.Second)
	require.ErrorIs(t, lo.Err(), fencelock.ErrLeaseLost)

	require.Equal(t, []int64{int64(ln.Token())}, writtenTokens(t, b, "payment:1"))
	require.NoError(t, ln.Release(b.Ctx))
}

// A late release or renew from an old holder does not touch the new grant.
func TestLateReleaseAndRenewDoNotTouchNewGrant(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := newLessor(t, b.Pool, "old", fencelock.WithoutHeartbeat())
	cur := newLessor(t, b.Pool, "new")

	lo, err := old.TryAcquire(b.Ctx, "job", 10*time.Second)
	require.NoError(t, err)
	// An operator force-expires the lease (the old holder still trusts it), and a new holder
	// takes over.
	_, err = b.Pool.Exec(b.Ctx, `UPDATE fencelock.leases SET expires_at = clock_timestamp() WHERE name = 'job'`)
	require.NoError(t, err)
	ln, err := cur.TryAcquire(b.Ctx, "job", 10*time.Second)
	require.NoError(t, err)
	want := readLease(t, b.Ctx, b.Pool, "job")

	err = lo.Renew(b.Ctx)
	require.ErrorIs(t, err, fencelock.ErrLeaseLost)
	waitDone(t, lo, time.Second)
	require.Equal(t, want, readLease(t, b.Ctx, b.Pool, "job"))

	err = lo.Release(b.Ctx)
	require.ErrorIs(t, err, fencelock.ErrNotHeld)
	require.Equal(t, want, readLease(t, b.Ctx, b.Pool, "job"))
	require.False(t, want.Expired)

	require.NoError(t, ln.Renew(b.Ctx))
	require.NoError(t, ln.Release(b.Ctx))
}

// The heartbeat notices a takeover: Done closes with the server's verdict, not only at the
// end of the trust window.
func TestHeartbeatSignalsTakeover(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := newLessor(t, b.Pool, "old", fencelock.WithHeartbeatInterval(20*time.Millisecond))
	cur := newLessor(t, b.Pool, "new")
	lo, err := old.TryAcquire(b.Ctx, "job", time.Minute)
	require.NoError(t, err)
	_, err = b.Pool.Exec(b.Ctx, `UPDATE fencelock.leases SET expires_at = clock_timestamp() WHERE name = 'job'`)
	require.NoError(t, err)
	ln, err := cur.TryAcquire(b.Ctx, "job", time.Minute)
	require.NoError(t, err)
	waitDone(t, lo, 5*time.Second) // far less than the minute-long trust window
	require.ErrorIs(t, lo.Err(), fencelock.ErrLeaseLost)
	require.NotErrorIs(t, lo.Err(), fencelock.ErrTrustWindowExpired)
	require.NoError(t, ln.Release(b.Ctx))
}

// A cancelled ctx during the grant statement itself (blocked on a row held by a transaction)
// leaves nothing held.
func TestRunLockedCancelledWhileWaitingOnRow(t *testing.T) {
	b, a, c := twoLessors(t, false)
	inside, finish := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- a.RunLocked(b.Ctx, "job", func(ctx context.Context, tx pgxTx, token fencelock.Token) error {
			close(inside)
			<-finish
			return nil
		})
	}()
	<-inside
	ctx, cancel := context.WithTimeout(b.Ctx, 100*time.Millisecond)
	err := c.RunLocked(ctx, "job", func(context.Context, pgxTx, fencelock.Token) error {
		t.Error("fn ran while another transaction held the row")
		return nil
	})
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	close(finish)
	require.NoError(t, <-done)
	var waiting []string
	rows, err := b.Pool.Query(b.Ctx,
		`SELECT format('pid=%s app=%s state=%s wait=%s query=%s', pid, application_name, state, wait_event, left(query, 80)) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`)
	require.NoError(t, err)
	waiting, err = collectStrings(rows)
	require.NoError(t, err)
	require.Empty(t, waiting)
	require.Equal(t, "a", readLease(t, b.Ctx, b.Pool, "job").Holder)
}

var errBoom = errors.New("boom")

// A lessor is not re-entrant: a second grant of a name it holds is refused as such, not as
// someone else's.
func TestLessorNotReentrant(t *testing.T) {
	b, a, l := leaseHeld(t, "a", "job")
	_, err := a.TryAcquire(b.Ctx, "job", time.Minute)
	require.ErrorIs(t, err, fencelock.ErrAlreadyHeld)
	require.NotErrorIs(t, err, fencelock.ErrNotAcquired)
	_, err = a.Acquire(b.Ctx, "job", time.Minute)
	require.ErrorIs(t, err, fencelock.ErrAlreadyHeld)
	require.NoError(t, l.Release(b.Ctx))
	l, err = a.TryAcquire(b.Ctx, "job", time.Minute)
	require.NoError(t, err)
	require.NoError(t, l.Release(b.Ctx))
}

// Attempts by one lessor on one name are serialised locally: 32 goroutines sharing a lessor
// ask for one name at once; one is granted, every other is told the lessor holds it already
// (ErrAlreadyHeld), never that someone else does.
func TestLessorSerialisesAttemptsOnOneName(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := newLessor(t, b.Pool, "shared")
	start := make(chan struct{})
	errs := make(chan error, 32)
	leases := make(chan *fencelock.Lease, 32)
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			<-start
			lease, err := l.TryAcquire(b.Ctx, "job", time.Minute)
			if err == nil {
				leases <- lease
			}
			errs <- err
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	close(leases)
	granted := 0
	for err := range errs {
		if err == nil {
			granted++
			continue
		}
		require.ErrorIs(t, err, fencelock.ErrAlreadyHeld)
	}
	require.Equal(t, 1, granted)
	for lease := range leases {
		require.NoError(t, lease.Release(b.Ctx))
	}
}

func collectStrings(rows pgxRows) ([]string, error) {
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// A grant of a name that has a row draws one token, not two (issue 23): the INSERT path of
// the grant statement (LeaseGrant, and LeaseAcquire's granted) draws none when the row is
// there, and the DO UPDATE draws the grant's. Tokens still rise and stay positive; a refused
// grant draws none.
func TestGrantDrawsOneToken(t *testing.T) {
	b := setup(t)
	l := newLessor(t, b.Pool, "one-token")
	other := newLessor(t, b.Pool, "other")
	lastValue := func() int64 {
		var v int64
		require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT last_value FROM fencelock.leases_token_seq`).Scan(&v))
		return v
	}
	const seqBits = 1<<47 - 1
	first, err := l.TryAcquire(b.Ctx, "drawn", time.Minute) // no row yet: the INSERT path draws
	require.NoError(t, err)
	require.NoError(t, first.Release(b.Ctx))
	prev := first.Token()
	grants := map[string]func() (*fencelock.Lease, error){
		"TryAcquire": func() (*fencelock.Lease, error) { return l.TryAcquire(b.Ctx, "drawn", time.Minute) },
		"Acquire":    func() (*fencelock.Lease, error) { return l.Acquire(b.Ctx, "drawn", time.Minute) },
	}
	for _, how := range []string{"TryAcquire", "Acquire", "TryAcquire"} {
		before := lastValue()
		lease, err := grants[how]()
		require.NoError(t, err, how)
		require.Equal(t, before+1, lastValue(), "%s of a name with a row drew more than one token", how)
		require.Equal(t, before+1, int64(lease.Token())&seqBits, how)
		require.Greater(t, lease.Token(), prev, how)
		prev = lease.Token()

		before = lastValue()
		_, err = other.TryAcquire(b.Ctx, "drawn", time.Minute)
		require.ErrorIs(t, err, fencelock.ErrNotAcquired)
		require.Equal(t, before, lastValue(), "a refused grant drew a token")
		require.NoError(t, lease.Release(b.Ctx))
	}
}
