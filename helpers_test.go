package fencelock_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/pgserver"
	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
)

// The package's short names for the helpers that every test package shares (internal/testkit,
// and internal/testkit/fencetest for those that drive the library's API); a helper of these
// tests alone stays here, in full.

// bundle is what most server tests need: a fresh migrated database, its pool (b.Pool) and a
// context (b.Ctx) that ends at test cleanup or after two minutes (testkit.Bundle).
type bundle = testkit.Bundle[*pgserver.DB]

// setup returns a bundle on a fresh database of the shared server.
var setup = testkit.Setup

// fastBackoff keeps waits short in tests where many waiters contend.
var fastBackoff = fencetest.FastBackoff

// newLessor returns a lessor on pool with holder id holder and opts, failing the test on error.
var newLessor = fencetest.NewLessor

// newPool returns a pool on url, closed at test cleanup.
var newPool = testkit.NewPool

// leaseRow reads a lease row as the database has it; readLease returns the row of a lease,
// failing the test if there is none.
type leaseRow = testkit.LeaseRow

var readLease = testkit.ReadLease

// waitDone waits for a lease's Done channel, failing the test after limit.
var waitDone = fencetest.WaitDone

// fencedWrite is the protected write of the tests (see fencetest.FencedWrite).
var fencedWrite = fencetest.FencedWrite

// createWrites creates the writes table of fencedWrite in b's database.
func createWrites(t *testing.T, b *bundle) {
	t.Helper()
	fencetest.CreateWrites(t, b.Ctx, b.Pool)
}

// writtenTokens returns the tokens of the rows fencedWrite wrote for resource, in ascending order.
func writtenTokens(t *testing.T, b *bundle, resource string) []int64 {
	t.Helper()
	return fencetest.WrittenTokens(t, b.Ctx, b.Pool, resource)
}

// pgxTx lets test files name pgx.Tx without importing pgx.
type pgxTx = pgx.Tx

// pgxRows lets test files name pgx.Rows without importing pgx.
type pgxRows = pgx.Rows

// awaitWaiters waits until fencelock.holders shows waiters for lease name, failing the test
// after 10 s.
func awaitWaiters(t *testing.T, b *bundle, name string, waiters int64) {
	t.Helper()
	testkit.AwaitWaiters(t, b.Ctx, b.Pool, name, waiters)
}

// waitFor polls cond every 5 ms until it holds, failing the test when b's context ends first.
func waitFor(t *testing.T, b *bundle, what string, cond func() bool) {
	t.Helper()
	testkit.WaitFor(t, b.Ctx, what, cond)
}

// migrateLockKey is fencelock's migrateLockID, the advisory lock key of Migrate.
const migrateLockKey = testkit.MigrateLockKey

// requireEachVersionOnce fails the test unless fencelock's version table lists every migration
// exactly once (and goose's version 0 once).
func requireEachVersionOnce(t *testing.T, b *bundle) {
	t.Helper()
	testkit.RequireEachVersionOnce(t, b.Ctx, b.Pool)
}

// leaseHeld runs t in parallel on a database of its own, where the lessor of holder holds name
// for a minute; it returns the database, the lessor and its lease.
func leaseHeld(t *testing.T, holder, name string) (*bundle, *fencelock.Lessor, *fencelock.Lease) {
	t.Helper()
	t.Parallel()
	b := setup(t)
	l := newLessor(t, b.Pool, holder)
	lease, err := l.TryAcquire(b.Ctx, name, time.Minute)
	require.NoError(t, err)
	return b, l, lease
}

// twoLessors runs t in parallel on a database of its own, with the lessors of holders "a" and
// "c". When expiring, a's leases have no heartbeat (they expire at their TTL) and c backs off
// briefly (fastBackoff: 200 us doubling to 5 ms), to take them soon after they do.
func twoLessors(t *testing.T, expiring bool) (b *bundle, a, c *fencelock.Lessor) {
	t.Helper()
	t.Parallel()
	b = setup(t)
	if expiring {
		return b, newLessor(t, b.Pool, "a", fencelock.WithoutHeartbeat()), newLessor(t, b.Pool, "c", fastBackoff)
	}
	return b, newLessor(t, b.Pool, "a"), newLessor(t, b.Pool, "c")
}

// insertLeases inserts n lease rows <prefix>1 .. <prefix><n> of holder 'h', acquired at now()
// plus the interval acquired and expiring at now() plus the interval expires (intervals in
// SQL's words: "-2 hours", "30 seconds"), each with a token of the sequence's default.
func insertLeases(t *testing.T, b *bundle, prefix string, n int, acquired, expires string) {
	t.Helper()
	_, err := b.Pool.Exec(b.Ctx, `INSERT INTO fencelock.leases (name, holder, acquired_at, expires_at)
		SELECT $1 || i, 'h', now() + $3::interval, now() + $4::interval FROM generate_series(1, $2) AS i`,
		prefix, n, acquired, expires)
	require.NoError(t, err)
}

// seedLeases inserts total leases 'lease:1' .. 'lease:<total>' held by 'h' for an hour, and
// returns the first take of them by name as LeaseRenew's arrays: names, tokens, and TTLs of a
// minute in microseconds.
func seedLeases(t *testing.T, b *bundle, total, take int) (names []string, tokens, ttls []int64) {
	t.Helper()
	insertLeases(t, b, "lease:", total, "0", "1 hour")
	rows, err := b.Pool.Query(b.Ctx, `SELECT name, token FROM fencelock.leases ORDER BY name LIMIT $1`, take)
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
