package job_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/pgserver"
)

// The helpers of the job's server tests (slot_test.go, job_gone_test.go): copies of the root
// package's (helpers_test.go), which a test package of another directory cannot import.

// bundle is what a server test needs: a fresh migrated database and a context bounded so that
// a hung test fails instead of stalling the suite.
type bundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
	db   *pgserver.DB
}

// setup returns a bundle on a fresh database of the shared server of TestMain (main_test.go),
// its context ending at test cleanup or after two minutes.
func setup(t *testing.T) *bundle {
	t.Helper()
	db := pgserver.NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return &bundle{ctx: ctx, pool: db.Pool, db: db}
}

// newLessor returns a lessor on pool with holder id holder and opts, failing the test on error.
func newLessor(t *testing.T, pool *pgxpool.Pool, holder string, opts ...fencelock.LessorOption) *fencelock.Lessor {
	t.Helper()
	l, err := fencelock.NewLessor(pool, append([]fencelock.LessorOption{fencelock.WithHolder(holder)}, opts...)...)
	require.NoError(t, err)
	return l
}

// waitFor polls cond every 5 ms until it holds, failing the test when b's context ends first.
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
