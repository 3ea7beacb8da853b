package integration

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
)

// The advisory lock helpers of the fault, pooler, command and metrics tests here: this
// module's names for those every test package shares.

// bigPool opens a pool of 40 connections on the test's database: every session lock holds a
// connection, and the default pool (4 connections on 2 cores) is soon exhausted.
func bigPool(t *testing.T, b *bundle) *pgxpool.Pool {
	t.Helper()
	return newPool(t, b.Ctx, b.DB.URL, testkit.MaxConns(40))
}

// newLocker returns an advisory locker on a pool with options, failing the test on error;
// keyOf returns the int64 advisory lock key that a locker derives for a name; advisoryHolders
// lists the backend pids of the test's database holding (granted) or waiting for a key.
var (
	newLocker       = fencetest.NewLocker
	keyOf           = fencetest.KeyOf
	advisoryHolders = testkit.AdvisoryHolders
)
