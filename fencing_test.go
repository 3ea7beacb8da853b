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
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

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
			// A TTL of 10 s: the guard must run inside the trust window (9 s), also on a
			// machine loaded by the whole suite under -race (1 s was too short beside a second
			// suite). The grant then ends on the server below, not by waiting out the TTL.
			la, err := a.Acquire(b.Ctx, "job", 10*time.Second)
			require.NoError(t, err)

			tx, err := b.Pool.Begin(b.Ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(b.Ctx) }()
			require.NoError(t, guard.guard(b.Ctx, la, tx))
			// The lease expires on the database clock now, as by its TTL run out: the UPDATE
			// of a non-key column (FOR NO KEY UPDATE) does not conflict with the guard's KEY
			// SHARE lock, which stays on the row.
			_, err = b.Pool.Exec(b.Ctx, `UPDATE fencelock.leases SET expires_at = clock_timestamp() WHERE name = 'job'`)
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
			// The RunLocked is queued on the row lock: seen waiting in pg_stat_activity, however
			// long a loaded machine takes to start it; one that takes the row over fails at
			// once. The minute is a bound for a hang only.
			hang := time.After(time.Minute)
			for queued := false; !queued; {
				select {
				case token := <-ran:
					t.Fatalf("a RunLocked took the row over (token %d) while the guarded transaction was open", token)
				case err := <-waited:
					t.Fatalf("the RunLocked returned while the guarded transaction was open: %v", err)
				case <-hang:
					t.Fatal("the RunLocked was not seen waiting on the row lock in a minute")
				case <-time.After(5 * time.Millisecond):
				}
				var n int
				require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n))
				queued = n == 1
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
// Judged by the renewals themselves, whatever the machine's speed: none of them may come back
// "locked" (skipped for a row lock; fencelock.lease.renewals by outcome), and the lease stays
// held. Two workers write until there have been at least 50 writes and 30 renewal attempts
// (a heartbeat every 100 ms, nearly all of them while a transaction holds the row). The TTL of
// 5 s only keeps a loaded machine's late heartbeat from losing the lease; with the old lock
// every renewal meeting an open transaction counts as locked, and the first one fails the
// test. A minute is a bound for a hang: a slow machine makes the test longer, not its
// renewals or writes fewer.
func TestFencedWritesBackToBackKeepLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createWrites(t, b)
	tally := &renewalTally{by: map[string]int64{}}
	lessor := newLessor(t, b.Pool, "busy", fencelock.WithHeartbeatInterval(100*time.Millisecond), fencelock.WithMeterProvider(tally))
	lease, err := lessor.TryAcquire(b.Ctx, "hot", 5*time.Second)
	require.NoError(t, err)
	const wantWrites, wantRenewals = 50, 30
	ctx, stop := context.WithCancel(b.Ctx)
	var wg sync.WaitGroup
	defer wg.Wait() // after stop, also when the test fails early
	defer stop()
	var writes atomic.Int64
	failed := make(chan error, 2)
	base := tally.total() // renewal attempts before the writers start
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
	for writes.Load() < wantWrites || tally.total()-base < wantRenewals {
		select {
		case <-lease.Done():
			t.Fatalf("the holder lost its lease to its own fenced writes: %v", lease.Err())
		case err := <-failed:
			t.Fatalf("a fenced write failed: %v (lease: %v)", err, lease.Err())
		case <-deadline:
			t.Fatalf("in a minute: %d fenced writes, %d renewal attempts (want %d and %d)", writes.Load(), tally.total()-base, wantWrites, wantRenewals)
		case <-tick.C:
		}
		require.Zero(t, tally.get("locked"), "a renewal skipped the lease row, locked by the holder's own fenced transaction")
	}
	stop()
	wg.Wait()
	t.Logf("%d fenced writes and %d renewal attempts in %v (%d renewed)", writes.Load(), tally.total()-base, time.Since(start).Round(time.Millisecond), tally.get("renewed"))
	require.Zero(t, tally.get("locked"), "a renewal skipped the lease row, locked by the holder's own fenced transaction")
	require.Positive(t, tally.get("renewed"), "the holder never renewed")
	require.NoError(t, lease.Err())
	require.NoError(t, lease.Release(b.Ctx))
}

// renewalTally is a meter provider that counts the lease renewals recorded on it by outcome
// (fencelock.lease.renewals: renewed, locked, lost, failed); every other instrument is a no-op.
// A pointer, so fencelock keys its instruments by it.
type renewalTally struct {
	noop.MeterProvider
	mu sync.Mutex
	by map[string]int64
}

func (r *renewalTally) Meter(string, ...metric.MeterOption) metric.Meter {
	return renewalTallyMeter{r: r}
}

// get returns the renewals counted with outcome o.
func (r *renewalTally) get(o string) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.by[o]
}

// total returns the renewals counted, of every outcome.
func (r *renewalTally) total() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var n int64
	for _, v := range r.by {
		n += v
	}
	return n
}

type renewalTallyMeter struct {
	noop.Meter
	r *renewalTally
}

func (m renewalTallyMeter) Int64Counter(name string, opts ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	if name != "fencelock.lease.renewals" {
		return m.Meter.Int64Counter(name, opts...)
	}
	return renewalTallyCounter{r: m.r}, nil
}

type renewalTallyCounter struct {
	noop.Int64Counter
	r *renewalTally
}

func (c renewalTallyCounter) Add(_ context.Context, n int64, opts ...metric.AddOption) {
	set := metric.NewAddConfig(opts).Attributes()
	o, _ := set.Value(attribute.Key("fencelock.outcome"))
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	c.r.by[o.AsString()] += n
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
