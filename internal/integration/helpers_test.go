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
	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
	"github.com/fencelock/fencelock/pgtest"
)

// The helpers of this module's tests: its names for those every test package shares
// (internal/testkit, and internal/testkit/fencetest for those that drive the library's API),
// and the few that need what only this module has (pgtest's servers and PgBouncer, goleak).

// TestMain runs the tests through pgtest.Main, which stops the shared server afterwards.
func TestMain(m *testing.M) { pgtest.Main(m) }

// bundle is what most server tests need: a fresh migrated database, its pool (b.Pool) and a
// context (b.Ctx) that ends at test cleanup or after two minutes (testkit.Bundle).
type bundle = testkit.Bundle[*pgtest.DB]

// setup returns a bundle on a fresh database of the shared server.
func setup(t *testing.T) *bundle {
	t.Helper()
	db := pgtest.NewDB(t)
	return testkit.NewBundle(t, db.Pool, db)
}

// crashableDB returns a database on a server of its own that the test may crash
// (pgtest.Crashable, then opts), and a context that ends at test cleanup or after limit.
func crashableDB(t *testing.T, limit time.Duration, opts ...pgtest.Option) (*pgtest.Server, *pgtest.DB, context.Context) {
	t.Helper()
	srv := pgtest.NewServer(t, append([]pgtest.Option{pgtest.Crashable()}, opts...)...)
	db := srv.NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	t.Cleanup(cancel)
	return srv, db, ctx
}

// crashableStandbyPair starts a server of its own that the test may crash (pgtest.Crashable,
// then opts), a fresh database on it, and a standby of it (pg_basebackup -R).
func crashableStandbyPair(t *testing.T, opts ...pgtest.Option) (primary *pgtest.Server, db *pgtest.DB, standby *pgtest.Server) {
	t.Helper()
	primary = pgtest.NewServer(t, append([]pgtest.Option{pgtest.Crashable()}, opts...)...)
	db = primary.NewDB(t)
	return primary, db, primary.NewStandby(t)
}

// hotStandbyDB starts a server of its own (pgtest.Crashable) with a hot standby and a fresh
// database, waits until the standby has replayed it, and returns a context that ends at test
// cleanup or after a minute, with the URL of that database on the standby and a pool on it.
func hotStandbyDB(t *testing.T) (context.Context, string, *pgxpool.Pool) {
	t.Helper()
	srv, primary, standby := crashableStandbyPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	require.NoError(t, srv.WaitReplay(ctx, standby))
	url := standby.URL(primary.Name)
	return ctx, url, newPool(t, ctx, url)
}

// fastBackoff keeps waits short in tests where many waiters contend.
var fastBackoff = fencetest.FastBackoff

// Lessors and leases: newLessor returns a lessor on a pool with a holder id and options;
// waitDone waits for a lease's Done channel; endedCtx returns a copy of a context that has
// already ended. Each fails the test on error.
var (
	newLessor = fencetest.NewLessor
	waitDone  = fencetest.WaitDone
	endedCtx  = testkit.EndedContext
)

// leaseRow reads a lease row as the database has it; readLease returns the row of a lease,
// failing the test if there is none.
type leaseRow = testkit.LeaseRow

var readLease = testkit.ReadLease

// newPool returns a pool on url, closed at test cleanup.
var newPool = testkit.NewPool

// goosePool returns a pool on url, closed at test cleanup; with execMode its connections use
// pgx.QueryExecModeExec (for a PgBouncer older than 1.21, see pgtest.PgBouncer).
func goosePool(t *testing.T, ctx context.Context, url string, execMode bool) *pgxpool.Pool {
	t.Helper()
	return newPool(t, ctx, url, testkit.ExecMode(execMode))
}

// viaPgBouncer starts a PgBouncer in mode ("session" or "transaction") in front of b's server
// (pgtest.NewPgBouncer: skipped where there is none, outside CI) and returns it with a pool
// through it on b's database (goosePool, with execMode where it keeps no prepared statements).
func viaPgBouncer(t *testing.T, b *bundle, mode string) (*pgtest.PgBouncer, *pgxpool.Pool) {
	t.Helper()
	bouncer := pgtest.NewPgBouncer(t, b.DB.Server, mode)
	return bouncer, goosePool(t, b.Ctx, bouncer.URL(b.DB.Name), !bouncer.PreparedStatements())
}

// writtenTokens returns the tokens of the rows fencedWrite wrote for resource, in ascending order.
func writtenTokens(t *testing.T, b *bundle, resource string) []int64 {
	t.Helper()
	return fencetest.WrittenTokens(t, b.Ctx, b.Pool, resource)
}

// fenceOnly advances the fence of resource to token in a transaction of its own.
var fenceOnly = fencetest.FenceOnly

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

// acquired is the result of an Acquire run in a goroutine of its own (fencetest.AcquireAsync,
// fencetest.PermitAsync), with the time it came back.
type acquired = fencetest.Acquired

// newElection returns the election name on a lessor of its own with holder id holder.
func newElection(t *testing.T, b *bundle, holder, name string, ttl time.Duration, opts ...fencelock.LessorOption) *fencelock.Election {
	t.Helper()
	return fencetest.NewElection(t, b.Pool, holder, name, ttl, opts...)
}

// Observers: next receives an observer's next state, failing the test after 10 s; nextWhere
// skips states until one satisfies a condition, checking that terms only rise.
var (
	next      = fencetest.Next
	nextWhere = fencetest.NextWhere
)

// requireFree fails the test unless another lessor is granted name at once (TryAcquire), then
// releases that grant.
func requireFree(t *testing.T, b *bundle, name string) {
	t.Helper()
	fencetest.RequireFree(t, b.Ctx, b.Pool, name)
}

// The database's state: requireNothingHeld checks that refused grants left nothing behind;
// readQueue returns the live waiters of a lease in order, and awaitQueue waits until they are
// exactly the holders given; listeners returns the backend pids of the listening connections;
// gooseProvider returns a goose provider for fencelock's migrations, as Migrate has it.
var (
	requireNothingHeld = testkit.RequireNothingHeld
	readQueue          = testkit.ReadQueue
	awaitQueue         = testkit.AwaitQueue
	listeners          = testkit.Listeners
	gooseProvider      = fencetest.GooseProvider
)

// queued is one row of the view fencelock.lease_queue.
type queued = testkit.Queued

// newSemaphore returns semaphore name with limit on a lessor of its own with holder id holder.
func newSemaphore(t *testing.T, b *bundle, holder, name string, limit int, opts ...fencelock.LessorOption) *fencelock.Semaphore {
	t.Helper()
	return fencetest.NewSemaphore(t, b.Pool, holder, name, limit, opts...)
}

// semState reads a semaphore's state, failing the test on error.
func semState(t *testing.T, b *bundle, s *fencelock.Semaphore) fencelock.SemaphoreState {
	t.Helper()
	return fencetest.SemState(t, b.Ctx, s)
}

// waitQueued waits until sem has n live waiters.
func waitQueued(t *testing.T, b *bundle, s *fencelock.Semaphore, n int64) {
	t.Helper()
	fencetest.WaitQueued(t, b.Ctx, s, n)
}
