package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/pgtest"
)

// TestMain runs the tests through pgtest.Main, which stops the shared server afterwards.
func TestMain(m *testing.M) { pgtest.Main(m) }

// bundle is what most tests need: a fresh migrated database and a context bounded so that a
// hung test fails instead of stalling the suite.
type bundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
	db   *pgtest.DB
}

// setup returns a bundle on a fresh database of the shared server, its context ending at
// test cleanup or after two minutes.
func setup(t *testing.T) *bundle {
	t.Helper()
	db := pgtest.NewDB(t)
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

// readLease returns the row of lease name, failing the test if there is none.
// newPool returns a pool on url, closed at test cleanup.
func newPool(t *testing.T, ctx context.Context, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

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

// verifyNoLeakWithin fails t unless, within d, no goroutine is left but those opts ignore: for
// goroutines that end by a stated bound (a lessor's listening connection closes a second after
// its last wait or lease), not at once.
func verifyNoLeakWithin(t *testing.T, d time.Duration, opts ...goleak.Option) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := goleak.Find(opts...)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("goroutines left %v after the bound: %v", d, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
