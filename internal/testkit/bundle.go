package testkit

import (
	"context"
	"testing"

	"github.com/fencelock/fencelock/internal/pgserver"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Bundle is what most server tests need: a fresh migrated database D (the *DB of pgserver or
// pgtest, whichever server the test package runs on), its pool, and a context bounded so that
// a hung test fails instead of stalling the suite. Each test package names it once:
//
//	type bundle = testkit.Bundle[*pgserver.DB]
//
// Its fields are set once by [NewBundle] and only read afterwards, so a bundle is safe to share
// between a test's goroutines.
type Bundle[D any] struct {
	Ctx  context.Context // ends at test cleanup or after [Timeout]
	Pool *pgxpool.Pool   // D's pool, closed at test cleanup
	DB   D
}

// NewBundle returns a bundle of db and its pool, with a context from [Context].
func NewBundle[D any](t testing.TB, pool *pgxpool.Pool, db D) *Bundle[D] {
	return &Bundle[D]{Ctx: Context(t), Pool: pool, DB: db}
}

// Setup returns a [Bundle] on a fresh database of pgserver's shared server
// ([pgserver.NewDB]): the setup(t) of every test package that runs on that server. It skips or
// fails t as NewDB does.
func Setup(t testing.TB) *Bundle[*pgserver.DB] {
	t.Helper()
	db := pgserver.NewDB(t)
	return NewBundle(t, db.Pool, db)
}
