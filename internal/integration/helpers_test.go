package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/migrations"
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

// (A copy of the helper of the root package's queue_test.go, now that its tests live there.)
func acquireAsync(ctx context.Context, l *fencelock.Lessor, name string, ttl time.Duration) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		lease, err := l.Acquire(ctx, name, ttl)
		ch <- acquired{lease, err, time.Now()}
	}()
	return ch
}

// acquireAsync runs l.Acquire in a goroutine; the result arrives on the channel.
// (A copy of the helper of the root package's queue_test.go, now that its tests live there.)
type acquired struct {
	lease *fencelock.Lease
	err   error
	at    time.Time
}

// receive waits for an acquire's result, failing the test after limit.
// (A copy of the helper of the root package's queue_test.go, now that its tests live there.)
func receive(t *testing.T, ch <-chan acquired, limit time.Duration) acquired {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(limit):
		t.Fatalf("no grant within %v", limit)
		return acquired{}
	}
}

// newElection returns the election name on a lessor of its own with holder id holder.
// (A copy of the helper of the root package's election_test.go, now that its tests live there.)
func newElection(t *testing.T, b *bundle, holder, name string, ttl time.Duration, opts ...fencelock.LessorOption) *fencelock.Election {
	t.Helper()
	e, err := fencelock.NewElection(newLessor(t, b.pool, holder, opts...), name, ttl)
	require.NoError(t, err)
	return e
}

// next receives the observer's next state, failing the test after 10 s.
// (A copy of the helper of the root package's election_test.go, now that its tests live there.)
func next(t *testing.T, ch <-chan fencelock.LeaderInfo) fencelock.LeaderInfo {
	t.Helper()
	select {
	case info, ok := <-ch:
		require.True(t, ok, "the observer's channel closed")
		return info
	case <-time.After(10 * time.Second):
		t.Fatal("the observer delivered nothing in 10 s")
	}
	return fencelock.LeaderInfo{}
}

// nextWhere skips states until one satisfies cond (a state with the new leader's value may be
// preceded by the same term before it proclaimed), checking that terms only rise.
// (A copy of the helper of the root package's election_test.go, now that its tests live there.)
func nextWhere(t *testing.T, ch <-chan fencelock.LeaderInfo, last fencelock.Token, cond func(fencelock.LeaderInfo) bool) fencelock.LeaderInfo {
	t.Helper()
	for {
		info := next(t, ch)
		if info.Token != 0 {
			require.GreaterOrEqual(t, info.Token, last, "terms delivered out of order")
			last = info.Token
		}
		if cond(info) {
			return info
		}
	}
}

// endedCtx returns a copy of parent that has already ended, as a caller's context has when its
// deadline passed or its request was cancelled just before the release.
// (A copy of the helper of the root package's ended_context_test.go, now that its tests live there.)
func endedCtx(parent context.Context) context.Context {
	ctx, cancel := context.WithCancel(parent)
	cancel()
	return ctx
}

// requireFree fails the test unless another lessor is granted name at once (TryAcquire), then
// releases that grant.
// (A copy of the helper of the root package's ended_context_test.go, now that its tests live there.)
func requireFree(t *testing.T, b *bundle, name string) {
	t.Helper()
	other, err := newLessor(t, b.pool, "other").TryAcquire(b.ctx, name, 10*time.Second)
	require.NoError(t, err, "lease %q is not free", name)
	require.NoError(t, other.Release(b.ctx))
}

// fenceOnly advances the fence of resource to token in a transaction of its own.
func fenceOnly(ctx context.Context, pool *pgxpool.Pool, resource string, token fencelock.Token) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return fencelock.FenceTx(ctx, tx, resource, token) })
}

// requireNothingHeld checks that refused grants left nothing behind: no lease row with a token
// but those of names in granted, no flush row, no advisory lock.
// (A copy of the helper of the root package's epoch_test.go, now that its tests live there.)
func requireNothingHeld(t *testing.T, ctx context.Context, pool *pgxpool.Pool, granted ...string) {
	t.Helper()
	var leases, flushes, advisory int
	require.NoError(t, pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM fencelock.leases WHERE token > 0 AND name <> ALL ($1::text[]) AND expires_at > now()),
		(SELECT count(*) FROM fencelock.token_flushes),
		(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))`, granted).Scan(&leases, &flushes, &advisory))
	require.Zero(t, leases, "a refused grant left a lease held")
	require.Zero(t, flushes, "a refused advisory token left its flush row")
	require.Zero(t, advisory, "a refused advisory token left its lock held")
}

// readQueue returns the live waiters of name in order, as the view fencelock.lease_queue
// shows them.
// (A copy of the helper of the root package's queue_test.go, now that its tests live there.)
func readQueue(t *testing.T, ctx context.Context, pool *pgxpool.Pool, name string) []queued {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT holder, position, woken_by_notify FROM fencelock.lease_queue WHERE name = $1 ORDER BY position`, name)
	require.NoError(t, err)
	q, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (queued, error) {
		var e queued
		err := r.Scan(&e.Holder, &e.Position, &e.Notify)
		return e, err
	})
	require.NoError(t, err)
	return q
}

// queued is one row of the view fencelock.lease_queue.
// (A copy of the helper of the root package's queue_test.go, now that its tests live there.)
type queued struct {
	Holder   string
	Position int64
	Notify   bool
}

// awaitQueue waits until the queue of name is exactly holders, in that order (and, with notify,
// each of them is woken by NOTIFY rather than polling), failing the test after 10 s.
// (A copy of the helper of the root package's queue_test.go, now that its tests live there.)
func awaitQueue(t *testing.T, ctx context.Context, pool *pgxpool.Pool, name string, notify bool, holders ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		q := readQueue(t, ctx, pool, name)
		got := make([]string, len(q))
		ok := len(q) == len(holders)
		for i, e := range q {
			got[i] = e.Holder
			ok = ok && e.Holder == holders[i] && e.Position == int64(i+1) && (!notify || e.Notify)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue of %q is %v (%+v), want %v (notify %v)", name, got, q, holders, notify)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// gooseProvider returns a goose provider for fencelock's migrations on pool, as Migrate has it.
// (A copy of the helper of the root package's epoch_test.go, now that its tests live there.)
func gooseProvider(t *testing.T, pool *pgxpool.Pool) *goose.Provider {
	t.Helper()
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { db.Close() })
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS,
		goose.WithTableName(fencelock.VersionTable), goose.WithDisableGlobalRegistry(true), goose.WithLogger(goose.NopLogger()))
	require.NoError(t, err)
	return p
}

// listeners returns the backend pids of the database's listening connections.
// (A copy of the helper of the root package's queue_test.go, now that its tests live there.)
func listeners(t *testing.T, ctx context.Context, pool *pgxpool.Pool) []int32 {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN %' ORDER BY pid`)
	require.NoError(t, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	return pids
}

// permitAsync waits for a permit of s in a goroutine of its own and delivers the result, with
// the time it came back.
// (A copy of the helper of the root package's semaphore_test.go, now that its tests live there.)
func permitAsync(ctx context.Context, s *fencelock.Semaphore, ttl time.Duration) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		p, err := s.Acquire(ctx, ttl)
		ch <- acquired{p, err, time.Now()}
	}()
	return ch
}

// waitQueued waits until sem has n live waiters.
// (A copy of the helper of the root package's semaphore_test.go, now that its tests live there.)
func waitQueued(t *testing.T, b *bundle, s *fencelock.Semaphore, n int64) {
	t.Helper()
	require.Eventually(t, func() bool { return semState(t, b, s).Waiting == n }, 10*time.Second, 2*time.Millisecond)
}

// semState reads a semaphore's state, failing the test on error.
// (A copy of the helper of the root package's semaphore_test.go, now that its tests live there.)
func semState(t *testing.T, b *bundle, s *fencelock.Semaphore) fencelock.SemaphoreState {
	t.Helper()
	st, err := s.State(b.ctx)
	require.NoError(t, err)
	return st
}

// newSemaphore returns semaphore name with limit on a lessor of its own with holder id holder.
// (A copy of the helper of the root package's semaphore_test.go, now that its tests live there.)
func newSemaphore(t *testing.T, b *bundle, holder, name string, limit int, opts ...fencelock.LessorOption) *fencelock.Semaphore {
	t.Helper()
	s, err := fencelock.NewSemaphore(newLessor(t, b.pool, holder, opts...), name, limit)
	require.NoError(t, err)
	return s
}
