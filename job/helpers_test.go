package job_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/internal/pgserver"
	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
)

// The helpers of the job's server tests (slot_test.go, job_gone_test.go): the package's names
// for those every test package shares (internal/testkit, internal/testkit/fencetest).

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
	return &bundle{ctx: testkit.Context(t), pool: db.Pool, db: db}
}

// newLessor returns a lessor on pool with holder id holder and opts, failing the test on error.
var newLessor = fencetest.NewLessor

// waitFor polls cond every 5 ms until it holds, failing the test when b's context ends first.
func waitFor(t *testing.T, b *bundle, what string, cond func() bool) {
	t.Helper()
	testkit.WaitFor(t, b.ctx, what, cond)
}
