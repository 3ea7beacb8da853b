package fencelock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
)

func TestFenceTx(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createWrites(t, b)
	for _, step := range []struct {
		token   fencelock.Token
		current fencelock.Token // 0: accepted
	}{
		{token: 5},
		{token: 5}, // equal tokens pass: one grant, several writes
		{token: 3, current: 5},
		{token: 7},
		{token: 6, current: 7},
	} {
		err := fencedWrite(b.Ctx, b.Pool, "r", step.token)
		if step.current == 0 {
			require.NoError(t, err, "token %d", step.token)
			continue
		}
		require.Equal(t, &fencelock.StaleTokenError{Resource: "r", Token: step.token, Current: step.current}, errorsAsStale(t, err))
	}
	require.Equal(t, []int64{5, 5, 7}, writtenTokens(t, b, "r"))
}

// errorsAsStale returns the *fencelock.StaleTokenError in err, failing the test unless there is
// one and err matches fencelock.ErrStaleToken.
var errorsAsStale = fencetest.ErrorsAsStale

// guards are the two calls that check a lease inside the caller's transaction and hold its row.
var guards = []struct {
	desc  string
	guard func(ctx context.Context, lease *fencelock.Lease, tx pgx.Tx) error
}{
	{"GuardTx", func(ctx context.Context, lease *fencelock.Lease, tx pgx.Tx) error { return lease.GuardTx(ctx, tx) }},
	{"LeaseFenceTx", func(ctx context.Context, lease *fencelock.Lease, tx pgx.Tx) error { return lease.FenceTx(ctx, tx, "r") }},
}

// GuardTx and Lease.FenceTx hold the lease row FOR KEY SHARE, which a takeover's FOR UPDATE
// conflicts with: even once the lease has expired on the database clock, no takeover commits
// before the guarded transaction ends, neither a try grant (refused) nor a waiting RunLocked
// (it waits in the server's queue and gets the row only after the commit).
func TestGuardBlocksTakeoverUntilCommit(t *testing.T) {
	t.Parallel()
	for _, guard := range guards {
		t.Run(guard.desc, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			a := newLessor(t, b.Pool, "a", fencelock.WithoutHeartbeat())
			c := newLessor(t, b.Pool, "c")
			// A TTL of 1 s: the guard must run inside the trust window (900 ms), also on a
			// machine loaded by the whole suite under -race (300 ms was too short there once).
			la, err := a.Acquire(b.Ctx, "job", time.Second)
			require.NoError(t, err)

			tx, err := b.Pool.Begin(b.Ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(b.Ctx) }()
			require.NoError(t, guard.guard(b.Ctx, la, tx))
			// Wait, on the database, until the lease has expired there.
			_, err = b.Pool.Exec(b.Ctx, `SELECT pg_sleep_until(expires_at + interval '10 milliseconds') FROM fencelock.leases WHERE name = 'job'`)
			require.NoError(t, err)
			require.True(t, readLease(t, b.Ctx, b.Pool, "job").Expired)
			_, err = c.TryAcquire(b.Ctx, "job", time.Second)
			require.ErrorIs(t, err, fencelock.ErrNotAcquired, "takeover while a guarded transaction is open")
			ran := make(chan fencelock.Token, 1)
			waited := make(chan error, 1)
			go func() {
				waited <- newLessor(t, b.Pool, "w").RunLocked(b.Ctx, "job", func(_ context.Context, _ pgx.Tx, token fencelock.Token) error {
					ran <- token
					return nil
				})
			}()
			// The RunLocked is queued on the row lock: seen waiting in pg_stat_activity.
			require.Eventually(t, func() bool {
				var n int
				err := b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
				return err == nil && n == 1
			}, 5*time.Second, 5*time.Millisecond)
			select {
			case token := <-ran:
				t.Fatalf("a RunLocked took the row over (token %d) while the guarded transaction was open", token)
			default:
			}

			require.NoError(t, tx.Commit(b.Ctx))
			require.NoError(t, <-waited)
			require.Greater(t, <-ran, la.Token())
			lc, err := c.TryAcquire(b.Ctx, "job", time.Second)
			require.NoError(t, err)
			require.Greater(t, lc.Token(), la.Token())

			// The old lease is now lost: the guard refuses (locally, or on the server).
			tx2, err := b.Pool.Begin(b.Ctx)
			require.NoError(t, err)
			defer func() { _ = tx2.Rollback(b.Ctx) }()
			require.ErrorIs(t, guard.guard(b.Ctx, la, tx2), fencelock.ErrLeaseLost)
			require.NoError(t, lc.Release(b.Ctx))
		})
	}
}

func TestGuardTxDetectsLossOnServer(t *testing.T) {
	b, _, la := leaseHeld(t, "a", "job")
	_, err := b.Pool.Exec(b.Ctx, `UPDATE fencelock.leases SET expires_at = clock_timestamp() WHERE name = 'job'`)
	require.NoError(t, err)
	err = pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error { return la.GuardTx(b.Ctx, tx) })
	var lost *fencelock.LeaseLostError
	require.ErrorAs(t, err, &lost)
	require.Equal(t, la.Token(), lost.Token)
	waitDone(t, la, time.Second)
}

func TestUpdateFencedTx(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Identifiers that need quoting: they are quoted, never pasted.
	_, err := b.Pool.Exec(b.Ctx, `CREATE SCHEMA "odd schema";
		CREATE TABLE "odd schema"."pay""ments" (id int PRIMARY KEY, "Status" text, "fence token" bigint);
		INSERT INTO "odd schema"."pay""ments" VALUES (1, 'pending', NULL), (2, 'pending', 9)`)
	require.NoError(t, err)
	table := pgx.Identifier{"odd schema", `pay"ments`}
	update := func(id int, token fencelock.Token, status string) (int64, error) {
		var n int64
		err := pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error {
			var err error
			n, err = fencelock.UpdateFencedTx(b.Ctx, tx, table, "fence token", token,
				[]fencelock.Column{{Name: "Status", Value: status}}, []fencelock.Column{{Name: "id", Value: id}})
			return err
		})
		return n, err
	}
	status := func(id int) (string, *int64) {
		var s string
		var tok *int64
		require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT "Status", "fence token" FROM "odd schema"."pay""ments" WHERE id = $1`, id).Scan(&s, &tok))
		return s, tok
	}

	n, err := update(1, 4, "captured") // NULL token column: never fenced before
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	s, tok := status(1)
	require.Equal(t, "captured", s)
	require.EqualValues(t, 4, *tok)

	_, err = update(2, 8, "refunded") // row carries 9
	stale := errorsAsStale(t, err)
	require.Equal(t, &fencelock.StaleTokenError{Table: `odd schema.pay"ments`, Key: "id=2", Token: 8, Current: 9}, stale)
	// The message names the table and the row, not a quoted identifier.
	require.Equal(t, `fencelock: stale fencing token 8 for table odd schema.pay"ments, row id=2: the row carries token 9`, stale.Error())
	s, tok = status(2)
	require.Equal(t, "pending", s)
	require.EqualValues(t, 9, *tok)

	_, err = update(3, 100, "captured")
	require.ErrorIs(t, err, fencelock.ErrNoRow)
	require.NotErrorIs(t, err, fencelock.ErrStaleToken)

	n, err = update(2, 9, "captured") // equal token passes
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
}

// Lease.FenceTx refuses a stale holder even when its successor has not written yet (a bare
// FenceTx lets that holder through), refuses an older token once a newer one was written, and
// lets the current holder write several times with one grant.
func TestLeaseFenceTx(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createWrites(t, b)
	write := func(lease *fencelock.Lease, resource string) error {
		return pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error {
			if err := lease.FenceTx(b.Ctx, tx, resource); err != nil {
				return err
			}
			_, err := tx.Exec(b.Ctx, `INSERT INTO writes (resource, token) VALUES ($1, $2)`, resource, int64(lease.Token()))
			return err
		})
	}
	old, err := newLessor(t, b.Pool, "old").TryAcquire(b.Ctx, "payment:1", time.Minute)
	require.NoError(t, err)
	require.NoError(t, write(old, "payment:1"))
	require.NoError(t, write(old, "payment:1")) // equal tokens pass

	// The old holder pauses; its grant ends on the server (as by a TTL run out, or a forced
	// release) and a new holder takes the name over, but writes nothing yet.
	_, err = b.Pool.Exec(b.Ctx, `UPDATE fencelock.leases SET expires_at = clock_timestamp() WHERE name = 'payment:1'`)
	require.NoError(t, err)
	cur, err := newLessor(t, b.Pool, "new").TryAcquire(b.Ctx, "payment:1", time.Minute)
	require.NoError(t, err)
	require.NoError(t, old.Err(), "the old holder still trusts its lease: the test is about the server's check")
	require.NoError(t, fencedWrite(b.Ctx, b.Pool, "payment:1", old.Token()), "a bare FenceTx lets the paused holder through")
	err = write(old, "payment:1")
	require.ErrorIs(t, err, fencelock.ErrLeaseLost)
	waitDone(t, old, time.Second)

	// A newer grant's write, then an older grant of another name fencing the same resource.
	require.NoError(t, write(cur, "payment:1"))
	other, err := newLessor(t, b.Pool, "other").TryAcquire(b.Ctx, "other", time.Minute)
	require.NoError(t, err)
	require.NoError(t, write(other, "shared"))
	older, err := newLessor(t, b.Pool, "older").TryAcquire(b.Ctx, "older", time.Minute)
	require.NoError(t, err)
	require.NoError(t, write(older, "shared"))
	err = write(other, "shared")
	require.Equal(t, &fencelock.StaleTokenError{Resource: "shared", Token: other.Token(), Current: older.Token()}, errorsAsStale(t, err))
	require.NoError(t, other.Err(), "a stale token is not a lost lease")

	// Bad input is refused before any SQL.
	require.ErrorIs(t, cur.FenceTx(b.Ctx, nil, "payment:1"), fencelock.ErrInvalidArgument)
	err = pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error { return cur.FenceTx(b.Ctx, tx, "") })
	require.ErrorIs(t, err, fencelock.ErrInvalidArgument)

	require.Equal(t, []int64{int64(old.Token()), int64(old.Token()), int64(old.Token()), int64(cur.Token())}, writtenTokens(t, b, "payment:1"))
	for _, l := range []*fencelock.Lease{cur, other, older} {
		require.NoError(t, l.Release(b.Ctx))
	}
}

// The holder's own fenced transactions, back to back, never cost it its lease: Lease.FenceTx
// and GuardTx hold the lease row FOR KEY SHARE, which renewals (FOR NO KEY UPDATE) do not
// conflict with. When they held it FOR SHARE, renewals skipped the row while a guarded
// transaction was open, and a worker writing continuously lost a 1 s lease within a second.
//
// Two workers write until there have been at least 50 writes and 3 s (three TTLs: about nine
// heartbeats, nearly all of them while a transaction holds the row), under a deadline of a
// minute for a loaded machine: a slow machine makes the test longer, not its writes fewer.
func TestFencedWritesBackToBackKeepLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createWrites(t, b)
	lease, err := newLessor(t, b.Pool, "busy").TryAcquire(b.Ctx, "hot", time.Second)
	require.NoError(t, err)
	const wantWrites, minRun = 50, 3 * time.Second
	ctx, stop := context.WithCancel(b.Ctx)
	var wg sync.WaitGroup
	defer wg.Wait() // after stop, also when the test fails early
	defer stop()
	var writes atomic.Int64
	failed := make(chan error, 2)
	for range 2 {
		wg.Go(func() {
			for ctx.Err() == nil {
				err := pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error {
					if err := lease.FenceTx(b.Ctx, tx, "hot"); err != nil {
						return err
					}
					if err := lease.GuardTx(b.Ctx, tx); err != nil {
						return err
					}
					_, err := tx.Exec(b.Ctx, `SELECT pg_sleep(0.02)`) // the transaction's own work
					return err
				})
				if err != nil {
					failed <- err
					return
				}
				writes.Add(1)
			}
		})
	}
	start := time.Now()
	deadline := time.After(time.Minute)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for writes.Load() < wantWrites || time.Since(start) < minRun {
		select {
		case <-lease.Done():
			t.Fatalf("the holder lost its lease to its own fenced writes: %v", lease.Err())
		case err := <-failed:
			t.Fatalf("a fenced write failed: %v (lease: %v)", err, lease.Err())
		case <-deadline:
			t.Fatalf("%d fenced writes in a minute, want %d", writes.Load(), wantWrites)
		case <-tick.C:
		}
	}
	stop()
	wg.Wait()
	t.Logf("%d fenced writes in %v", writes.Load(), time.Since(start).Round(time.Millisecond))
	require.NoError(t, lease.Err())
	require.NoError(t, lease.Release(b.Ctx))
}

// Under REPEATABLE READ (and SERIALIZABLE), a guard whose snapshot predates a takeover fails
// (a serialization error, 40001, or the lease reported lost), though its statement reads the
// snapshot's row version, on which the old holder's grant still looks current. (Asked by
// review: FOR KEY SHARE succeeds silently on a row only renewed since the snapshot.)
func TestGuardRefusesTakeoverSinceSnapshot(t *testing.T) {
	t.Parallel()
	for _, guard := range guards {
		for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
			t.Run(guard.desc+"/"+string(iso), func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				old, err := newLessor(t, b.Pool, "old", fencelock.WithoutHeartbeat()).TryAcquire(b.Ctx, "job", time.Minute)
				require.NoError(t, err)
				tx, err := b.Pool.BeginTx(b.Ctx, pgx.TxOptions{IsoLevel: iso})
				require.NoError(t, err)
				defer func() { _ = tx.Rollback(b.Ctx) }()
				_, err = tx.Exec(b.Ctx, `SELECT count(*) FROM fencelock.leases`) // takes the snapshot
				require.NoError(t, err)
				// The grant ends on the server (a forced release) and a new holder takes over.
				_, err = b.Pool.Exec(b.Ctx, `UPDATE fencelock.leases SET expires_at = clock_timestamp() WHERE name = 'job'`)
				require.NoError(t, err)
				cur, err := newLessor(t, b.Pool, "new").TryAcquire(b.Ctx, "job", time.Minute)
				require.NoError(t, err)
				require.NoError(t, old.Err(), "the old holder still trusts its lease: the test is about the server's check")

				err = guard.guard(b.Ctx, old, tx)
				require.Error(t, err, "the guard passed on a snapshot older than the takeover")
				var pgErr *pgconn.PgError
				if !errors.Is(err, fencelock.ErrLeaseLost) {
					require.ErrorAs(t, err, &pgErr)
					require.Equal(t, "40001", pgErr.Code)
				}
				require.NoError(t, cur.Release(b.Ctx))
			})
		}
	}
}
