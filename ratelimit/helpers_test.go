package ratelimit_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/internal/pgserver"
	"github.com/fencelock/fencelock/internal/testkit"
)

// The helpers of the limiter's server tests (limiter_test.go): the package's names for those
// every test package shares (internal/testkit).

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

// newPool returns a pool on url, closed at test cleanup.
var newPool = testkit.NewPool

// waitFor polls cond every 5 ms until it holds, failing the test when b's context ends first.
func waitFor(t *testing.T, b *bundle, what string, cond func() bool) {
	t.Helper()
	testkit.WaitFor(t, b.ctx, what, cond)
}
