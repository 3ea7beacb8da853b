package fencelock_test

import (
	"context"
	"fmt"
	"io/fs"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/pgserver"
	"github.com/fencelock/fencelock/migrations"
)

// bundle is what most tests need: a fresh migrated database and a context bounded so that a
// hung test fails instead of stalling the suite.
type bundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
	db   *pgserver.DB
}

// setup returns a bundle on a fresh database of the shared server, its context ending at
// test cleanup or after two minutes.
func setup(t *testing.T) *bundle {
	t.Helper()
	db := pgserver.NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return &bundle{ctx: ctx, pool: db.Pool, db: db}
}

// fastBackoff keeps waits short in tests where many waiters contend.
var fastBackoff = fencelock.WithBackoff(fencelock.ExponentialBackoff(200*time.Microsecond, 5*time.Millisecond))

// newLessor returns a lessor on pool with holder id holder and opts, failing the test on error.
func newLessor(t *testing.T, pool *pgxpool.Pool, holder string, opts ...fencelock.LessorOption) *fencelock.Lessor {
	t.Helper()
	l, err := fencelock.NewLessor(pool, append([]fencelock.LessorOption{fencelock.WithHolder(holder)}, opts...)...)
	require.NoError(t, err)
	return l
}

// leaseRow reads a lease row as the database has it.
type leaseRow struct {
	Holder  string
	Token   int64
	Expired bool
}

// newPool returns a pool on url, closed at test cleanup.
func newPool(t *testing.T, ctx context.Context, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// readLease returns the row of lease name, failing the test if there is none.
func readLease(t *testing.T, ctx context.Context, pool *pgxpool.Pool, name string) leaseRow {
	t.Helper()
	var r leaseRow
	err := pool.QueryRow(ctx, `SELECT holder, token, expires_at <= clock_timestamp() FROM fencelock.leases WHERE name = $1`, name).
		Scan(&r.Holder, &r.Token, &r.Expired)
	require.NoError(t, err)
	return r
}

// waitDone waits for a lease's Done channel, failing the test after limit.
func waitDone(t *testing.T, lease *fencelock.Lease, limit time.Duration) {
	t.Helper()
	select {
	case <-lease.Done():
	case <-time.After(limit):
		t.Fatalf("lease %q: Done not closed within %v", lease.Name(), limit)
	}
}

// fencedWrite is the protected write of the tests: in one transaction, advance the fence of
// resource to token and insert the row (resource, token) into the writes table (see
// createWrites).
func fencedWrite(ctx context.Context, pool *pgxpool.Pool, resource string, token fencelock.Token) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := fencelock.FenceTx(ctx, tx, resource, token); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO writes (resource, token) VALUES ($1, $2)`, resource, int64(token))
		return err
	})
}

// createWrites creates the writes table of fencedWrite in b's database.
func createWrites(t *testing.T, b *bundle) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `CREATE TABLE writes (resource text NOT NULL, token bigint NOT NULL)`)
	require.NoError(t, err)
}

// writtenTokens returns the tokens of the rows fencedWrite wrote for resource, in ascending order.
func writtenTokens(t *testing.T, b *bundle, resource string) []int64 {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT token FROM writes WHERE resource = $1 ORDER BY token`, resource)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return got
}

// pgxTx lets test files name pgx.Tx without importing pgx.
type pgxTx = pgx.Tx

// pgxRows lets test files name pgx.Rows without importing pgx.
type pgxRows = pgx.Rows

// awaitWaiters waits until fencelock.holders shows waiters for lease name, failing the test
// after 10 s.
// (A copy of the helper of internal/integration's cli_test.go, whose tests still use it.)
func awaitWaiters(t *testing.T, b *bundle, name string, waiters int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int64
		err := b.pool.QueryRow(b.ctx, `SELECT coalesce((SELECT waiters FROM fencelock.holders WHERE name = $1), -1)`, name).Scan(&n)
		require.NoError(t, err)
		if n == waiters {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("fencelock.holders shows %d waiters for %q, want %d", n, name, waiters)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitFor polls cond every 5 ms until it holds, failing the test when b's context ends first.
// (A copy of the helper of internal/integration's metrics_test.go, whose tests still use it.)
func waitFor(t *testing.T, b *bundle, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-b.ctx.Done():
			t.Fatalf("timed out waiting until %s", what)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// tokenPath issues one fencing token the way one API path does, and leaves nothing behind
// that would flush the WAL (no release, no unlock).
type tokenPath func(t *testing.T, ctx context.Context, pool *pgxpool.Pool, i int) (fencelock.Token, error)

// tokenPaths are the API paths that issue tokens.
// (A copy of internal/integration's durability_fault_test.go, whose tests still use it.)
var tokenPaths = []struct {
	desc  string
	issue tokenPath
}{
	{"LeaseGrant", func(t *testing.T, ctx context.Context, pool *pgxpool.Pool, i int) (fencelock.Token, error) {
		lease, err := newLessor(t, pool, "grant").TryAcquire(ctx, fmt.Sprintf("lease:%d", i), time.Minute)
		if err != nil {
			return 0, err
		}
		return lease.Token(), nil
	}},
	{"RunLocked", func(t *testing.T, ctx context.Context, pool *pgxpool.Pool, i int) (fencelock.Token, error) {
		var token fencelock.Token
		err := newLessor(t, pool, "tx").RunLocked(ctx, fmt.Sprintf("tx:%d", i), func(_ context.Context, _ pgx.Tx, tok fencelock.Token) error {
			token = tok
			return nil
		})
		return token, err
	}},
	{"AdvisorySession", func(t *testing.T, ctx context.Context, pool *pgxpool.Pool, i int) (fencelock.Token, error) {
		a, err := fencelock.NewAdvisoryLocker(pool, fencelock.WithFencingTokens())
		require.NoError(t, err)
		lk, err := a.TryLock(ctx, fmt.Sprintf("adv:%d", i))
		if err != nil {
			return 0, err
		}
		// Held until the crash ends its session; Unlock then hands the connection back (closed),
		// which the pool's Close at cleanup waits for.
		t.Cleanup(func() { _ = lk.Unlock(context.Background()) })
		return lk.Token(), nil
	}},
	{"AdvisoryTransaction", func(t *testing.T, ctx context.Context, pool *pgxpool.Pool, i int) (fencelock.Token, error) {
		a, err := fencelock.NewAdvisoryLocker(pool, fencelock.WithFencingTokens())
		require.NoError(t, err)
		var token fencelock.Token
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
			token, err = a.TryLockTx(ctx, tx, fmt.Sprintf("advtx:%d", i))
			return err
		})
		return token, err
	}},
}

// migrateLockKey is fencelock's migrateLockID, the advisory lock key of Migrate.
// (internal/integration's migrate_pooler_test.go has a copy, for its PgBouncer tests.)
const migrateLockKey int64 = 0x66656e63656c6f63

// requireEachVersionOnce fails the test unless fencelock's version table lists every migration
// exactly once (and goose's version 0 once).
// (internal/integration's migrate_pooler_test.go has a copy, for its PgBouncer tests.)
func requireEachVersionOnce(t *testing.T, b *bundle) {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT version_id FROM fencelock.goose_db_version WHERE is_applied ORDER BY version_id`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	sqlFiles, err := fs.Glob(migrations.FS, "*.sql")
	require.NoError(t, err)
	want := []int64{0}
	for v := range len(sqlFiles) {
		want = append(want, int64(v+1)) // migrations are numbered 1..n
	}
	require.Equal(t, want, got)
}

// seedLeases inserts total leases 'lease:1' .. 'lease:<total>' held by 'h' for an hour, and
// returns the first take of them by name as LeaseRenew's arrays: names, tokens, and TTLs of a
// minute in microseconds.
func seedLeases(t *testing.T, b *bundle, total, take int) (names []string, tokens, ttls []int64) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `INSERT INTO fencelock.leases (name, holder, acquired_at, expires_at)
		SELECT 'lease:' || i, 'h', now(), now() + interval '1 hour' FROM generate_series(1, $1) AS i`, total)
	require.NoError(t, err)
	rows, err := b.pool.Query(b.ctx, `SELECT name, token FROM fencelock.leases ORDER BY name LIMIT $1`, take)
	require.NoError(t, err)
	for rows.Next() {
		var name string
		var token int64
		require.NoError(t, rows.Scan(&name, &token))
		names, tokens, ttls = append(names, name), append(tokens, token), append(ttls, 60_000_000)
	}
	require.NoError(t, rows.Err())
	return names, tokens, ttls
}
