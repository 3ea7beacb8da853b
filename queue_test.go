package fencelock_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/queue"
	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
)

// Tests of the queue of lease waiters (migration 00004, lease_queue.go, listener.go): first
// come, first served, a release that hands the lease to the head and wakes only it, a place
// that a waiter leaves when it gives up, and the fallbacks to polling.

// queued is one row of the view fencelock.lease_queue; readQueue returns the live waiters of
// a lease in order, and awaitQueue waits until they are exactly the holders given, in that
// order (and, with notify, each of them woken by NOTIFY rather than polling), failing the
// test after 10 s.
type queued = testkit.Queued

var (
	readQueue  = testkit.ReadQueue
	awaitQueue = testkit.AwaitQueue
)

// acquired is the result of an Acquire run in a goroutine of its own (fencetest.AcquireAsync,
// fencetest.PermitAsync), with the time it came back.
type acquired = fencetest.Acquired

// Eight waiters that join one after the other are granted in that order, each by the release
// of the one before (a hand-off in the release's statement, woken by NOTIFY: well within the
// waiters' refresh period of 1.7 s), with rising tokens; the queue is visible in SQL the whole
// time, with the head's wait.
func TestQueueFirstComeFirstServed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 8
	holder := newLessor(t, b.Pool, "holder")
	first, err := holder.TryAcquire(b.Ctx, "fifo", time.Minute)
	require.NoError(t, err)
	var names []string
	var results []<-chan acquired
	for i := range n {
		name := fmt.Sprintf("w%d", i)
		names = append(names, name)
		results = append(results, fencetest.AcquireAsync(b.Ctx, newLessor(t, b.Pool, name), "fifo", time.Minute))
		awaitQueue(t, b.Ctx, b.Pool, "fifo", true, names...)
	}
	var waiters int64
	var head string
	var headWaited time.Duration
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT waiters, head_holder, head_waited FROM fencelock.lease_queue_summary WHERE name = 'fifo'`).
		Scan(&waiters, &head, &headWaited))
	require.EqualValues(t, n, waiters)
	require.Equal(t, "w0", head)
	require.Positive(t, headWaited)

	prev := first
	for i := range n {
		require.NoError(t, prev.Release(b.Ctx))
		got := fencetest.Receive(t, results[i], 10*time.Second)
		require.NoError(t, got.Err, "w%d", i)
		requireHandedOff(t, b, "fifo", names[i], got.Lease)
		require.Equal(t, names[i], got.Lease.Holder(), "grant %d went out of order", i)
		require.Greater(t, got.Lease.Token(), prev.Token())
		require.Equal(t, names[i], readLease(t, b.Ctx, b.Pool, "fifo").Holder)
		awaitQueue(t, b.Ctx, b.Pool, "fifo", true, names[i+1:]...)
		prev = got.Lease
	}
	require.NoError(t, prev.Release(b.Ctx))
}

// While anyone waits, a try grant does not barge: TryAcquire and TryRunLocked are refused even
// when the lease is free (here a waiter whose place is live but who has not taken the free lease
// yet), and granted once the queue is empty.
func TestQueueNoBarging(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.Pool.Exec(b.Ctx, `INSERT INTO fencelock.lease_waiters (name, holder, wait_id, seq, ttl_us, since, expires_at)
		VALUES ('nobarge', 'someone', 1, nextval('fencelock.lease_waiters_seq'), 60000000, now(), now() + interval '1 minute')`)
	require.NoError(t, err)
	l := newLessor(t, b.Pool, "newcomer")
	_, err = l.TryAcquire(b.Ctx, "nobarge", time.Minute)
	require.ErrorIs(t, err, fencelock.ErrNotAcquired)
	err = l.TryRunLocked(b.Ctx, "nobarge", func(context.Context, pgx.Tx, fencelock.Token) error {
		t.Error("a transaction-scoped grant barged past the queue")
		return nil
	})
	require.ErrorIs(t, err, fencelock.ErrNotAcquired)
	_, err = b.Pool.Exec(b.Ctx, `DELETE FROM fencelock.lease_waiters WHERE name = 'nobarge'`)
	require.NoError(t, err)
	lease, err := l.TryAcquire(b.Ctx, "nobarge", time.Minute)
	require.NoError(t, err)
	require.NoError(t, lease.Release(b.Ctx))
	// An Acquire granted at its first attempt never waits: no listening connection is opened
	// for a lessor that never waits.
	lease, err = l.Acquire(b.Ctx, "nobarge", time.Minute)
	require.NoError(t, err)
	require.NoError(t, lease.Release(b.Ctx))
	require.Empty(t, listeners(t, b.Ctx, b.Pool))
}

// A Release from inside a transaction that the same lease guards (GuardTx holds its row FOR
// KEY SHARE) while someone waits: the release does not wait for that transaction (which would
// never end: its own goroutine is in Release), ends the grant without a hand-off, and the
// head, woken (the test LISTENs on its channel and sees the release's NOTIFY), takes the lease
// once the transaction has ended, with a larger token. The bounds are hang bounds (10 s): a
// release that waited for the transaction would wait forever (the transaction ends only after
// it), a wake-up not sent never arrives, and a head that is not served stays unserved.
func TestReleaseInsideGuardedTransaction(t *testing.T) {
	b, _, lh := leaseHeld(t, "holder", "guarded")
	w := fencetest.AcquireAsync(b.Ctx, newLessor(t, b.Pool, "waiter", fastBackoff), "guarded", time.Minute)
	awaitQueue(t, b.Ctx, b.Pool, "guarded", true, "waiter")
	var channel string
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT channel FROM fencelock.lease_waiters WHERE name = 'guarded' AND holder = 'waiter'`).Scan(&channel))
	c, err := b.Pool.Acquire(b.Ctx)
	require.NoError(t, err)
	listener := c.Hijack()
	defer func() { _ = listener.Close(context.Background()) }()
	_, err = listener.Exec(b.Ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize())
	require.NoError(t, err)
	tx, err := b.Pool.Begin(b.Ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	require.NoError(t, lh.GuardTx(b.Ctx, tx))
	rctx, cancel := context.WithTimeout(b.Ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, lh.Release(rctx), "the release waited for the transaction its own lease guards")
	row := readLease(t, b.Ctx, b.Pool, "guarded")
	require.Equal(t, "holder", row.Holder, "handed over while the holder's guarded transaction was open")
	require.True(t, row.Expired)
	nctx, ncancel := context.WithTimeout(b.Ctx, 10*time.Second)
	defer ncancel()
	n, err := listener.WaitForNotification(nctx)
	require.NoError(t, err, "the release did not wake the head")
	wk, err := queue.ParseWake(n.Payload)
	require.NoError(t, err)
	require.Equal(t, []any{"waiter", "guarded", int64(0)}, []any{wk.Holder, wk.Name, wk.Token}, "the release woke the head to try for itself, handing it nothing")
	require.NoError(t, tx.Commit(b.Ctx))
	got := fencetest.Receive(t, w, 10*time.Second)
	require.NoError(t, got.Err)
	require.Greater(t, got.Lease.Token(), lh.Token())
	require.NoError(t, got.Lease.Release(b.Ctx))
}

// A RunLocked waits in the same queue: queued before a TTL waiter, it runs first, woken by the
// release (which does not hand it a TTL grant but leaves the lease free for it), and the TTL
// waiter behind it is then woken in turn.
func TestRunLockedWaitsInQueue(t *testing.T) {
	b, _, lh := leaseHeld(t, "holder", "mixed")
	ran := make(chan fencelock.Token, 1)
	txDone := make(chan error, 1)
	go func() {
		txDone <- newLessor(t, b.Pool, "tx").RunLocked(b.Ctx, "mixed", func(_ context.Context, _ pgx.Tx, token fencelock.Token) error {
			ran <- token
			return nil
		})
	}()
	awaitQueue(t, b.Ctx, b.Pool, "mixed", true, "tx")
	ttl := fencetest.AcquireAsync(b.Ctx, newLessor(t, b.Pool, "ttl"), "mixed", time.Minute)
	awaitQueue(t, b.Ctx, b.Pool, "mixed", true, "tx", "ttl")
	require.NoError(t, lh.Release(b.Ctx))
	// The order of the two grants is their tokens' (one sequence): on a loaded machine both may
	// be ready before this goroutine looks, so which channel it reads first says nothing.
	var token fencelock.Token
	select {
	case token = <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("the RunLocked at the head was not woken")
	}
	require.NoError(t, <-txDone)
	require.Greater(t, token, lh.Token())
	got := fencetest.Receive(t, ttl, 10*time.Second)
	require.NoError(t, got.Err)
	require.Greater(t, got.Lease.Token(), token, "the TTL waiter behind the RunLocked was granted first")
	require.NoError(t, got.Lease.Release(b.Ctx))
}

// A waiter that gives up (ctx ends) leaves the queue before Acquire returns, and the next one
// is served by the holder's release. Then 50 rounds race a release against a waiter's
// cancellation: whichever wins, the cancelled waiter holds nothing and is in no queue, and the
// waiter behind it gets the lease by a hand-off (a release's, or the quitter's on leaving),
// not at its own next look. Judged by the queue row the hand-off writes, not by a time: a
// bound of 1 s, 50 times over, was one a loaded machine could miss.
func TestQueueWaiterCancelled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	holder := newLessor(t, b.Pool, "holder")
	quitter := newLessor(t, b.Pool, "quitter")
	next := newLessor(t, b.Pool, "next")

	lh, err := holder.TryAcquire(b.Ctx, "cancel", time.Minute)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.Ctx)
	q := fencetest.AcquireAsync(ctx, quitter, "cancel", time.Minute)
	awaitQueue(t, b.Ctx, b.Pool, "cancel", true, "quitter")
	n := fencetest.AcquireAsync(b.Ctx, next, "cancel", time.Minute)
	awaitQueue(t, b.Ctx, b.Pool, "cancel", true, "quitter", "next")
	cancel()
	require.ErrorIs(t, fencetest.Receive(t, q, 10*time.Second).Err, context.Canceled)
	require.Equal(t, []queued{{Holder: "next", Position: 1, Notify: true}}, readQueue(t, b.Ctx, b.Pool, "cancel"))
	require.NoError(t, lh.Release(b.Ctx))
	got := fencetest.Receive(t, n, 10*time.Second)
	require.NoError(t, got.Err)
	requireHandedOff(t, b, "cancel", "next", got.Lease)
	require.NoError(t, got.Lease.Release(b.Ctx))

	for round := range 50 {
		name := fmt.Sprintf("race:%d", round)
		lh, err := holder.TryAcquire(b.Ctx, name, time.Minute)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(b.Ctx)
		q := fencetest.AcquireAsync(ctx, quitter, name, time.Minute)
		awaitQueue(t, b.Ctx, b.Pool, name, true, "quitter")
		n := fencetest.AcquireAsync(b.Ctx, next, name, time.Minute)
		awaitQueue(t, b.Ctx, b.Pool, name, true, "quitter", "next")
		time.AfterFunc(time.Duration(rand.IntN(2000))*time.Microsecond, cancel)
		require.NoError(t, lh.Release(b.Ctx))
		if r := fencetest.Receive(t, q, 10*time.Second); r.Err == nil {
			// The quitter was granted before its ctx ended: a grant like any other.
			require.NoError(t, r.Lease.Release(b.Ctx), "round %d", round)
		} else {
			require.ErrorIs(t, r.Err, context.Canceled, "round %d", round)
		}
		got := fencetest.Receive(t, n, 10*time.Second)
		require.NoError(t, got.Err, "round %d", round)
		requireHandedOff(t, b, name, "next", got.Lease)
		require.Empty(t, readQueue(t, b.Ctx, b.Pool, name), "round %d", round)
		var held int
		require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM fencelock.leases WHERE holder = 'quitter' AND expires_at > clock_timestamp()`).Scan(&held))
		require.Zero(t, held, "round %d", round)
		require.NoError(t, got.Lease.Release(b.Ctx))
		cancel()
	}
}

// listeners returns the backend pids of the database's listening connections.
var listeners = testkit.Listeners

// SweepLeases deletes the places of waiters that left the queue longer ago than its grace, and
// keeps live ones.
func TestSweepQueueRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.Pool.Exec(b.Ctx, `INSERT INTO fencelock.lease_waiters (name, holder, wait_id, seq, ttl_us, since, expires_at) VALUES
		('old', 'a', 1, nextval('fencelock.lease_waiters_seq'), 1000000, now() - interval '3 hours', now() - interval '2 hours'),
		('live', 'b', 2, nextval('fencelock.lease_waiters_seq'), 1000000, now(), now() + interval '1 minute')`)
	require.NoError(t, err)
	_, err = fencelock.SweepLeases(b.Ctx, b.Pool, fencelock.DefaultSweepGrace)
	require.NoError(t, err)
	var names []string
	rows, err := b.Pool.Query(b.Ctx, `SELECT name FROM fencelock.lease_waiters ORDER BY name`)
	require.NoError(t, err)
	names, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"live"}, names)
}

// requireHandedOff fails the test unless lease, holder's grant of name, came by a hand-off: a
// release (or a waiter leaving) recorded it in holder's queue row (granted_token), which a
// waiter's own grant never does (it deletes its row instead). So the waiter was served by the
// release's wake-up, not at its next refresh, however slow the machine.
func requireHandedOff(t *testing.T, b *bundle, name, holder string, lease *fencelock.Lease) {
	t.Helper()
	var handed int64
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT coalesce(max(granted_token), 0) FROM fencelock.lease_waiters WHERE name = $1 AND holder = $2`,
		name, holder).Scan(&handed))
	require.Equal(t, int64(lease.Token()), handed, "%s's grant of %q did not come by a hand-off", holder, name)
}
