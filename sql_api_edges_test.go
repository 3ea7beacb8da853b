package fencelock_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// The SQL API's edges (migration 00014, docs/SQL.md): arguments at the limits, try_acquire
// inside a transaction block, renewals inside one, durability, tokens shared with the Go
// lessor, and grants that ended. Each call is sent as a worker in another language sends it:
// a plain statement with parameters (pgx's extended protocol, as psycopg, JDBC and lib/pq).

// docs/SQL.md: a ttl outside 10 ms .. 7 days raises FL007 ("invalid argument, refused before
// anything is read or written"), also a ttl too large for the microsecond arithmetic (which
// would overflow bigint, SQLSTATE 22003, if converted before the check).
func TestSQLTTLOutOfRangeRaisesInvalidArgument(t *testing.T) {
	t.Parallel()
	b := setup(t)
	lease, err := newLessor(t, b.Pool, "h").TryAcquire(b.Ctx, "n", time.Minute)
	require.NoError(t, err)
	for _, c := range []struct {
		desc string
		stmt string
		args []any
	}{
		{"try_acquire", `SELECT fencelock.try_acquire('m', 'h', '300000 years'::interval)`, nil},
		{"renew", `SELECT fencelock.renew('n', 'h', $1, '300000 years'::interval)`, []any{int64(lease.Token())}},
		{"try_acquire negative", `SELECT fencelock.try_acquire('m', 'h', '-300000 years'::interval)`, nil},
	} {
		_, err := b.Pool.Exec(b.Ctx, c.stmt, c.args...)
		require.Equal(t, "FL007", sqlState(err), "%s: %v", c.desc, err)
		require.ErrorIs(t, fencelock.WrapSQLError(err), fencelock.ErrInvalidArgument, c.desc)
	}
}

// docs/SQL.md: try_acquire runs in a transaction of its own (autocommit), however the driver
// sends it: in one simple Query message (psql), or in the extended protocol's Parse, Bind and
// Execute messages (pgx, psycopg, JDBC and lib/pq with parameters), whose statement_timestamp()
// is the receipt of the last of them and so comes after the transaction's start, now().
func TestSQLTryAcquireGrantsInAutocommitWithAnyProtocol(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, mode := range []pgx.QueryExecMode{
		pgx.QueryExecModeSimpleProtocol,
		pgx.QueryExecModeCacheStatement,
		pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec,
		pgx.QueryExecModeExec,
	} {
		t.Run(mode.String(), func(t *testing.T) {
			name := "acct:" + mode.String()
			var tok *int64
			err := b.Pool.QueryRow(b.Ctx, `SELECT fencelock.try_acquire($1, 'A', '1 minute'::interval)`, mode, name).Scan(&tok)
			require.NoError(t, err, "try_acquire in autocommit")
			require.NotNil(t, tok)
			require.Equal(t, "A", readLease(t, b.Ctx, b.Pool, name).Holder)
		})
	}
}

// try_acquire counts its TTL from the start of its own statement (docs/SQL.md), not from the
// transaction's: a grant sent inside a transaction that began earlier (sqlInTxWork before it)
// keeps everyone else out until its statement's start + TTL. Judged on the database clock:
// the lease row expires exactly then, and B, asking once the TTL has passed since the
// transaction began (when a TTL counted from there would have ended), is refused.
func TestSQLTryAcquireInTransactionBlockCountsFromItsStatement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tx, err := b.Pool.Begin(b.Ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.Ctx) }()
	_, err = tx.Exec(b.Ctx, `SELECT pg_sleep($1::float8)`, sqlInTxWork.Seconds()) // work in the transaction before the grant
	require.NoError(t, err)
	var tokA *int64
	var stmt, txStart time.Time
	require.NoError(t, tx.QueryRow(b.Ctx, `SELECT fencelock.try_acquire('acct', 'A', $1), statement_timestamp(), now()`, sqlInTxTTL).
		Scan(&tokA, &stmt, &txStart))
	require.NotNil(t, tokA)
	require.NoError(t, tx.Commit(b.Ctx))

	var expires time.Time
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT expires_at FROM fencelock.leases WHERE name = 'acct'`).Scan(&expires))
	require.True(t, expires.Equal(stmt.Add(sqlInTxTTL)), "expires_at %v: not the statement's start (%v) + TTL; the transaction began at %v", expires, stmt, txStart)
	sqlRefusedToBAt(t, b, txStart.Add(sqlInTxTTL), stmt.Add(sqlInTxTTL))
}

// renew counts its TTL from the start of its own statement (docs/SQL.md), so a renewal sent
// inside a transaction that began earlier (sqlInTxWork before it) keeps everyone else out
// until its statement's start + TTL, even once the TTL has passed since the transaction's
// start and since the grant. Judged on the database clock: the renewal returns that expiry,
// and B, asking once the TTL has passed since the transaction began (after the grant), is
// refused.
func TestSQLRenewInTransactionCountsFromItsStatement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tokA := sqlTryAcquire(t, b, "acct", "A", sqlInTxTTL)
	require.NotZero(t, tokA)
	tx, err := b.Pool.Begin(b.Ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.Ctx) }()
	_, err = tx.Exec(b.Ctx, `SELECT pg_sleep($1::float8)`, sqlInTxWork.Seconds())
	require.NoError(t, err)
	var expires, stmt, txStart time.Time
	require.NoError(t, tx.QueryRow(b.Ctx, `SELECT fencelock.renew('acct', 'A', $1, $2), statement_timestamp(), now()`, int64(tokA), sqlInTxTTL).
		Scan(&expires, &stmt, &txStart))
	require.NoError(t, tx.Commit(b.Ctx))

	require.True(t, expires.Equal(stmt.Add(sqlInTxTTL)), "the renewal's expiry %v: not its statement's start (%v) + TTL; the transaction began at %v", expires, stmt, txStart)
	sqlRefusedToBAt(t, b, txStart.Add(sqlInTxTTL), stmt.Add(sqlInTxTTL))
}

// The TTL of the grants and renewals sent inside a transaction block, and the work in that
// transaction before them: the window in which a TTL counted from the transaction's start
// would have ended and one counted from the statement's has not is sqlInTxWork wide.
const (
	sqlInTxTTL  = 6 * time.Second
	sqlInTxWork = 2 * time.Second
)

// sqlRefusedToBAt has B try fencelock.try_acquire of "acct" once, in a statement that sleeps on
// the database until at (when a TTL counted from the wrong start would have ended) and reads
// the database clock before the attempt, and fails the test unless B is refused. An attempt
// that began after until (A's expiry: a refusal is no longer due), which only a machine
// stalled for seconds makes, fails the test too, as not judged.
func sqlRefusedToBAt(t *testing.T, b *bundle, at, until time.Time) {
	t.Helper()
	var asked time.Time
	var tok *int64
	// The target list is evaluated left to right: the sleep, the clock, then the attempt.
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT pg_sleep(greatest(extract(epoch FROM $1::timestamptz - clock_timestamp()), 0)::float8),
		clock_timestamp(), fencelock.try_acquire('acct', 'B', $2)`, at, sqlInTxTTL).Scan(nil, &asked, &tok))
	require.False(t, asked.Before(at), "B asked at %v, before %v", asked, at)
	require.True(t, asked.Before(until), "not judged: B asked at %v, not before A's expiry %v", asked, until)
	require.Nil(t, tok, "B took the lease at %v, %v before A's expiry %v (a TTL counted from the transaction's start ended at %v)",
		asked, until.Sub(asked), until, at)
}

// Durability: with the session default synchronous_commit = off, every call that hands out a
// token, renews or fences raises it to on for its transaction (docs/SQL.md, DESIGN.md).
// try_acquire runs in a transaction of its own, so the setting is read in its statement (the
// target list is evaluated left to right); the others may share the caller's transaction, and
// it is read there after them.
func TestSQLAPIRaisesSynchronousCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn := plainConn(t, b)
	_, err := conn.Exec(b.Ctx, `SET synchronous_commit = off`)
	require.NoError(t, err)
	tryAcquire := func(desc, name, holder string, ttl time.Duration) int64 {
		t.Helper()
		var tok *int64
		var sc string
		require.NoError(t, conn.QueryRow(b.Ctx, `SELECT fencelock.try_acquire($1, $2, $3), current_setting('synchronous_commit')`,
			name, holder, ttl).Scan(&tok, &sc), desc)
		require.NotNil(t, tok, desc)
		require.Equal(t, "on", sc, desc)
		return *tok
	}
	inTx := func(desc, stmt string, args ...any) {
		t.Helper()
		tx, err := conn.Begin(b.Ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(b.Ctx) }()
		_, err = tx.Exec(b.Ctx, stmt, args...)
		require.NoError(t, err, desc)
		var sc string
		require.NoError(t, tx.QueryRow(b.Ctx, `SELECT current_setting('synchronous_commit')`).Scan(&sc))
		require.Equal(t, "on", sc, desc)
		require.NoError(t, tx.Commit(b.Ctx), desc)
	}
	tok := tryAcquire("try_acquire (new row)", "n", "A", time.Minute)
	inTx("renew", `SELECT fencelock.renew('n', 'A', $1, '1 minute'::interval)`, tok)
	inTx("fence", `SELECT fencelock.fence('r', $1)`, tok)
	inTx("fence_lease", `SELECT fencelock.fence_lease('n', 'A', $1, 'r')`, tok)
	// A Go waiter queues; release hands it the lease (a new token) in the same statement.
	w := newLessor(t, b.Pool, "W")
	got := make(chan error, 1)
	go func() {
		lease, err := w.Acquire(b.Ctx, "n", time.Minute)
		if err == nil && lease.Token() <= fencelock.Token(tok) {
			err = fmt.Errorf("handed token %d not above %d", lease.Token(), tok)
		}
		got <- err
	}()
	awaitWaiters(t, b, "n", 1)
	inTx("release with hand-off", `SELECT fencelock.release('n', 'A', $1)`, tok)
	require.NoError(t, <-got)
	// An expired row taken over (the ON CONFLICT path).
	tryAcquire("try_acquire (expired row)", "e", "A", 20*time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	tryAcquire("try_acquire (take over)", "e", "B", time.Minute)
}

// try_acquire never grants a lease that is held, and never goes around a Go waiter, and its
// tokens are above every earlier token of the name, whoever granted them.
func TestSQLAndGoGrantTokensRise(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := newLessor(t, b.Pool, "go")
	var last fencelock.Token
	for i := range 5 {
		lease, err := l.TryAcquire(b.Ctx, "n", time.Minute)
		require.NoError(t, err)
		require.Greater(t, lease.Token(), last, "round %d go", i)
		last = lease.Token()
		require.Zero(t, sqlTryAcquire(t, b, "n", "sql", time.Minute), "held by go")
		require.Zero(t, sqlTryAcquire(t, b, "n", "go", time.Minute), "held by go, same holder id")
		require.NoError(t, lease.Release(b.Ctx))
		tok := sqlTryAcquire(t, b, "n", "sql", time.Minute)
		require.Greater(t, tok, last, "round %d sql", i)
		last = tok
		_, err = l.TryAcquire(b.Ctx, "n", time.Minute)
		require.ErrorIs(t, err, fencelock.ErrNotAcquired)
		var released bool
		require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT fencelock.release('n', 'sql', $1)`, int64(tok)).Scan(&released))
		require.True(t, released)
		require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT fencelock.release('n', 'sql', $1)`, int64(tok)).Scan(&released))
		require.False(t, released, "second release")
		_, err = b.Pool.Exec(b.Ctx, `SELECT fencelock.renew('n', 'sql', $1, '1 minute'::interval)`, int64(tok))
		require.Equal(t, "FL005", sqlState(err), "renew after release revives nothing")
	}
}

// guard_lease under REPEATABLE READ (docs: use READ COMMITTED) must not pass for a grant that
// a later grant replaced: the snapshot still shows the old row.
func TestSQLGuardLeaseRefusedUnderRepeatableReadAfterTakeover(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tokA := sqlTryAcquire(t, b, "n", "A", time.Minute)
	require.NotZero(t, tokA)
	tx, err := b.Pool.BeginTx(b.Ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.Ctx) }()
	_, err = tx.Exec(b.Ctx, `SELECT count(*) FROM fencelock.leases`) // the snapshot
	require.NoError(t, err)
	var released bool
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT fencelock.release('n', 'A', $1)`, int64(tokA)).Scan(&released))
	require.True(t, released)
	tokB := sqlTryAcquire(t, b, "n", "B", time.Minute)
	require.NotZero(t, tokB)
	_, err = tx.Exec(b.Ctx, `SELECT fencelock.guard_lease('n', 'A', $1)`, int64(tokA))
	require.Error(t, err, "guard_lease passed for A's grant after B took the lease (token %d)", tokB)
}

// try_acquire does not barge past a Go Acquire waiting for a lease whose TTL ran out, and renew
// never revives a grant that expired. A's grant is long, so that the Go waiter surely queues
// behind it, and runs out when the test ends it (its expires_at set to the database clock's
// now): a TTL of 300 ms raced the waiter's first attempt on a loaded machine (issue 39).
func TestSQLTryAcquireDoesNotBargeAndRenewDoesNotRevive(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tokA := sqlTryAcquire(t, b, "n", "A", time.Minute)
	require.NotZero(t, tokA)
	w := newLessor(t, b.Pool, "W")
	got := make(chan *fencelock.Lease, 1)
	go func() {
		lease, err := w.Acquire(b.Ctx, "n", time.Minute)
		if err != nil {
			t.Error(err)
		}
		got <- lease
	}()
	awaitWaiters(t, b, "n", 1)
	_, err := b.Pool.Exec(b.Ctx, `UPDATE fencelock.leases SET expires_at = clock_timestamp() WHERE name = 'n'`)
	require.NoError(t, err)
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		require.Zero(t, sqlTryAcquire(t, b, "n", "C", time.Minute), "try_acquire went around the Go waiter")
		time.Sleep(10 * time.Millisecond)
	}
	lease := <-got
	require.NotNil(t, lease)
	require.Greater(t, lease.Token(), tokA)
	_, err = b.Pool.Exec(b.Ctx, `SELECT fencelock.renew('n', 'A', $1, '1 minute'::interval)`, int64(tokA))
	require.Equal(t, "FL005", sqlState(err), "renew of an expired, taken-over grant")
	var released bool
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT fencelock.release('n', 'A', $1)`, int64(tokA)).Scan(&released))
	require.False(t, released)
	require.Equal(t, "W", readLease(t, b.Ctx, b.Pool, "n").Holder)
	require.NoError(t, lease.Err())

	tokE := sqlTryAcquire(t, b, "e", "A", 20*time.Millisecond)
	require.NotZero(t, tokE)
	time.Sleep(40 * time.Millisecond)
	_, err = b.Pool.Exec(b.Ctx, `SELECT fencelock.renew('e', 'A', $1, '1 minute'::interval)`, int64(tokE))
	require.Equal(t, "FL005", sqlState(err), "renew of an expired grant nobody took")
}
