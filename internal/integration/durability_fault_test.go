package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
	"github.com/fencelock/fencelock/pgtest"
)

// Every path that issues a token makes it durable before the grant returns, even when the
// value falls in a range of the sequence WAL-logged by a transaction that rolled back: nextval
// logs 32 values ahead, a rollback is not flushed, and a later nextval inside the range writes
// no WAL, so a commit that writes nothing else flushes nothing. The server keeps its default
// synchronous_commit = on; wal_writer_delay = 10s keeps the WAL writer from flushing the range
// by chance before the crash. Before fencelock.next_token, the advisory paths handed the same
// token out again after the crash.
func TestTokenDurableAfterRolledBackRange(t *testing.T) {
	t.Parallel()
	for _, tc := range fencetest.TokenPaths {
		t.Run(tc.Desc, func(t *testing.T) {
			t.Parallel()
			srv, db, ctx := crashableDB(t, 2*time.Minute, pgtest.WithSetting("wal_writer_delay", "10s"))
			first, err := tc.Issue(t, ctx, db.Pool, 0)
			require.NoError(t, err)

			// After a checkpoint the next nextval WAL-logs a range; its transaction rolls back.
			_, err = db.Pool.Exec(ctx, `CHECKPOINT`)
			require.NoError(t, err)
			errRollback := errors.New("roll back")
			err = newLessor(t, db.Pool, "rollback").RunLocked(ctx, "rollback", func(context.Context, pgx.Tx, fencelock.Token) error {
				return errRollback
			})
			require.ErrorIs(t, err, errRollback)

			inRange, err := tc.Issue(t, ctx, db.Pool, 1) // a value of the rolled-back range
			require.NoError(t, err)
			require.Greater(t, inRange, first)

			crashAndRestart(t, ctx, srv, db.Pool)
			after, err := tc.Issue(t, ctx, db.Pool, 2)
			require.NoError(t, err)
			require.Greater(t, after, inRange, "a token issued before the crash was issued again")
			var sc string
			require.NoError(t, db.Pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&sc))
			require.Equal(t, "on", sc) // the server default the scenario is about
		})
	}
}

// An acknowledged UpdateFencedTx survives a crash where the server default is
// synchronous_commit = off, so an older token is still rejected afterwards. Before the fix the
// committed update was lost with the unflushed WAL, and the older token passed.
func TestUpdateFencedDurableAfterCrash(t *testing.T) {
	t.Parallel()
	srv, db, ctx := crashableDB(t, 2*time.Minute, pgtest.AsyncCommit())
	_, err := db.Pool.Exec(ctx, `CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL, fence bigint)`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO accounts VALUES (1, 0, NULL)`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `CHECKPOINT`) // the table and its row are durable
	require.NoError(t, err)

	update := func(token fencelock.Token, balance int) error {
		return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := fencelock.UpdateFencedTx(ctx, tx, pgx.Identifier{"accounts"}, "fence", token,
				[]fencelock.Column{{Name: "balance", Value: balance}}, []fencelock.Column{{Name: "id", Value: 1}})
			return err
		})
	}
	require.NoError(t, update(10, 100))
	crashAndRestart(t, ctx, srv, db.Pool)
	require.ErrorIs(t, update(5, 50), fencelock.ErrStaleToken, "the acknowledged fenced update was lost in the crash")
	var balance int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT balance FROM accounts WHERE id = 1`).Scan(&balance))
	require.Equal(t, 100, balance)
	var sc string
	require.NoError(t, db.Pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&sc))
	require.Equal(t, "off", sc)
}

// The control for the crash tests above: on a server started with pgtest.AsyncCommit, a crash
// really loses commits that did not raise synchronous_commit themselves. Without this, the
// durability tests could pass because the crash lost nothing.
func TestAsyncCommitCrashLosesUnforcedCommits(t *testing.T) {
	t.Parallel()
	srv, db, ctx := crashableDB(t, 2*time.Minute, pgtest.AsyncCommit())
	_, err := db.Pool.Exec(ctx, `CREATE TABLE acked (i int)`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `CHECKPOINT`)
	require.NoError(t, err)
	for i := range 100 {
		_, err := db.Pool.Exec(ctx, `INSERT INTO acked VALUES ($1)`, i)
		require.NoError(t, err)
	}
	crashAndRestart(t, ctx, srv, db.Pool)
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM acked`).Scan(&n))
	require.Less(t, n, 100, "the crash lost no acknowledged commit: the durability tests would prove nothing")
}

// Each statement that acknowledges a write a fence or a lease relies on survives a crash where
// the server default is synchronous_commit = off: FenceTx and Lease.FenceTx (the high-water
// mark: a lost advance would let an older token through) and Lease.Renew (a lost renewal would
// let a new holder in while the old one trusts it).
func TestFencesAndRenewalsDurableAfterCrash(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		desc string
		// act makes the acknowledged write with lease; check verifies it after the crash.
		act   func(ctx context.Context, pool *pgxpool.Pool, lease *fencelock.Lease) error
		check func(t *testing.T, ctx context.Context, pool *pgxpool.Pool, lease *fencelock.Lease, before time.Time)
	}{
		{"FenceTx", func(ctx context.Context, pool *pgxpool.Pool, lease *fencelock.Lease) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return fencelock.FenceTx(ctx, tx, "r", lease.Token()) })
		}, checkFence},
		{"LeaseFenceTx", func(ctx context.Context, pool *pgxpool.Pool, lease *fencelock.Lease) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return lease.FenceTx(ctx, tx, "r") })
		}, checkFence},
		{"Renew", func(ctx context.Context, _ *pgxpool.Pool, lease *fencelock.Lease) error {
			return lease.Renew(ctx)
		}, func(t *testing.T, ctx context.Context, pool *pgxpool.Pool, lease *fencelock.Lease, before time.Time) {
			var expires time.Time
			require.NoError(t, pool.QueryRow(ctx, `SELECT expires_at FROM fencelock.leases WHERE name = 'job'`).Scan(&expires))
			require.True(t, expires.After(before), "the acknowledged renewal was lost in the crash (expiry %v, granted with %v)", expires, before)
			require.Equal(t, lease.ExpiresAt(), expires)
		}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			t.Parallel()
			srv, db, ctx := crashableDB(t, 2*time.Minute, pgtest.AsyncCommit())
			lease, err := newLessor(t, db.Pool, "h", fencelock.WithoutHeartbeat()).TryAcquire(ctx, "job", time.Hour)
			require.NoError(t, err)
			granted := lease.ExpiresAt()
			// The grant is durable; the act below is what is tested. (The checkpoint also takes
			// long enough for a renewal's expiry to differ from the grant's.)
			_, err = db.Pool.Exec(ctx, `CHECKPOINT`)
			require.NoError(t, err)
			require.NoError(t, tc.act(ctx, db.Pool, lease))
			crashAndRestart(t, ctx, srv, db.Pool)
			tc.check(t, ctx, db.Pool, lease, granted)
		})
	}
}

// checkFence verifies that the high-water mark of "r" is lease's token.
func checkFence(t *testing.T, ctx context.Context, pool *pgxpool.Pool, lease *fencelock.Lease, _ time.Time) {
	t.Helper()
	var token int64
	err := pool.QueryRow(ctx, `SELECT token FROM fencelock.fences WHERE resource = 'r'`).Scan(&token)
	require.NoError(t, err, "the acknowledged fence advance was lost in the crash")
	require.Equal(t, int64(lease.Token()), token)
}

// awaitReconnect waits until pool reaches the restarted server again, failing the test after
// 30 s. (Polled: a restarting server announces nothing to wait on.)
func awaitReconnect(t *testing.T, ctx context.Context, pool *pgxpool.Pool) {
	t.Helper()
	require.Eventually(t, func() bool { return pool.Ping(ctx) == nil }, 30*time.Second, 20*time.Millisecond)
}

// A hand-off (a release that grants the lease to the head of the queue) is a grant: acknowledged
// to the new holder, it survives a crash, also where the server default is synchronous_commit
// = off (the hand-off draws its token with next_token, which raises it). The waiter learns of it
// only after its commit: the NOTIFY goes out at commit.
func TestHandOffDurableAfterCrash(t *testing.T) {
	t.Parallel()
	srv, db, ctx := crashableDB(t, 2*time.Minute, pgtest.AsyncCommit())
	lh, err := newLessor(t, db.Pool, "holder", fencelock.WithoutHeartbeat()).TryAcquire(ctx, "job", time.Hour)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `CHECKPOINT`)
	require.NoError(t, err)
	waiter := newLessor(t, newPool(t, ctx, db.URL), "waiter", fencelock.WithoutHeartbeat())
	got := make(chan *fencelock.Lease, 1)
	go func() {
		lease, err := waiter.Acquire(ctx, "job", time.Hour)
		assert.NoError(t, err)
		got <- lease
	}()
	require.Eventually(t, func() bool {
		var n int
		return db.Pool.QueryRow(ctx, `SELECT count(*) FROM fencelock.lease_queue WHERE name = 'job' AND woken_by_notify`).Scan(&n) == nil && n == 1
	}, 10*time.Second, 2*time.Millisecond)
	require.NoError(t, lh.Release(ctx))
	lw := <-got
	require.NotNil(t, lw)
	crashAndRestart(t, ctx, srv, db.Pool)
	row := readLease(t, ctx, db.Pool, "job")
	require.Equal(t, "waiter", row.Holder, "the acknowledged hand-off was lost in the crash")
	require.Equal(t, int64(lw.Token()), row.Token)
	require.False(t, row.Expired)
}

// A release nobody waits for commits without waiting for its WAL flush (synchronous_commit
// off): lost in a crash, it leaves the name held by the old grant, which expires by its TTL,
// and nothing else. (Control: that the server loses it, on a server whose WAL writer waits 10
// s; were the release flushed, the name would be free at once.)
func TestReleaseLostInCrashExpiresByTTL(t *testing.T) {
	t.Parallel()
	srv, db, ctx := crashableDB(t, 2*time.Minute, pgtest.AsyncCommit())
	const ttl = 2 * time.Second
	lh, err := newLessor(t, db.Pool, "holder", fencelock.WithoutHeartbeat()).TryAcquire(ctx, "job", ttl)
	require.NoError(t, err)
	require.NoError(t, lh.Release(ctx))
	crashAndRestart(t, ctx, srv, db.Pool)
	row := readLease(t, ctx, db.Pool, "job")
	require.Equal(t, int64(lh.Token()), row.Token)
	// Control, by the row and not by the clock (a crash and restart on a loaded machine can
	// outlast the TTL): the old grant's expiry is back, where a release that survived would
	// have left the release's time.
	var expires time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT expires_at FROM fencelock.leases WHERE name = 'job'`).Scan(&expires))
	require.True(t, expires.Equal(lh.ExpiresAt()), "control: the release survived the crash, so it was flushed: expiry %v, granted until %v", expires, lh.ExpiresAt())
	// The grant comes at the old grant's expiry, or at once when the crash and restart outlasted
	// it (on a loaded machine they can): measured from the later of the two, database clock.
	var asked time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&asked))
	lease, err := newLessor(t, db.Pool, "next").Acquire(ctx, "job", time.Minute)
	require.NoError(t, err)
	require.Greater(t, lease.Token(), lh.Token())
	var acquired time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT acquired_at FROM fencelock.leases WHERE name = 'job'`).Scan(&acquired))
	require.False(t, acquired.Before(expires), "granted at %v, before the old grant expired at %v", acquired, expires)
	from := expires
	if asked.After(from) {
		from = asked
	}
	t.Logf("asked %v after the old grant's expiry; granted %v after the later of the two", asked.Sub(expires), acquired.Sub(from))
	require.Less(t, acquired.Sub(from), time.Second, "the name stayed held past the old grant's TTL")
	require.NoError(t, lease.Release(ctx))
}

// A forced release that hands a permit to the head of its semaphore's queue is durable where
// the server default is synchronous_commit = off: after a crash the permit is the head's, with
// the token the release reported, not the old holder's again (which would renew and be trusted
// beside the head: two permits of a semaphore of one). Before migration 00019, force_release
// restored the caller's "off" after the hand-off's token had raised it, and the crash undid the
// hand-off. The waiter is queued through the SQL API without a channel (nobody listens), so no
// statement of a woken waiter flushes the WAL by chance before the crash.
func TestForcedPermitHandOffDurableAfterCrash(t *testing.T) {
	t.Parallel()
	srv, db, ctx := crashableDB(t, 2*time.Minute, pgtest.AsyncCommit())
	var outcome int
	var name string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT outcome, name FROM fencelock.semaphore_acquire('s', 'holder', 1, 60000000, 1, false, '', 0)`).
		Scan(&outcome, &name))
	require.Equal(t, 1, outcome, "the holder's permit")
	require.Equal(t, "s#0", name)
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT outcome FROM fencelock.semaphore_acquire('s', 'waiter', 2, 60000000, 1, true, '', 60000000)`).
		Scan(&outcome))
	require.Equal(t, 4, outcome, "the waiter queued")
	_, err := db.Pool.Exec(ctx, `CHECKPOINT`) // the permit and the queue are durable
	require.NoError(t, err)

	var newToken int64
	var handedTo *string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT new_token, handed_to FROM fencelock.force_release('s#0', ARRAY[]::text[])`).
		Scan(&newToken, &handedTo))
	require.NotNil(t, handedTo, "the permit went to the head of the queue")
	require.Equal(t, "waiter", *handedTo)

	crashAndRestart(t, ctx, srv, db.Pool)
	var holder string
	var token int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT holder, token FROM fencelock.leases WHERE name = 's#0'`).Scan(&holder, &token))
	require.Equal(t, "waiter", holder, "the acknowledged forced hand-off was lost in the crash")
	require.Equal(t, newToken, token)
	var sc string
	require.NoError(t, db.Pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&sc))
	require.Equal(t, "off", sc) // the server default the test is about
}
