package fencelock

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/fencelock/fencelock/migrations"
)

// VersionTable is the goose version table that [Migrate] keeps, in fencelock's own schema so
// that it never collides with an application's goose_db_version.
const VersionTable = "fencelock.goose_db_version"

// migrateLockID is the session advisory lock key that serialises concurrent [Migrate] calls.
// It differs from goose's default key, so fencelock's migrations never wait on (or block) an
// application's own goose run.
const migrateLockID int64 = 0x66656e63656c6f63 // "fencelock" in ASCII, truncated to 8 bytes

// Migrate applies fencelock's migrations (package [migrations]) to the database behind pool,
// creating schema fencelock with tables leases and fences. It uses goose v3's Provider with
// version table [VersionTable] and a session advisory lock, so several processes may call it at
// once: one applies, the others wait (polling every second, for at most five minutes) and
// then find nothing pending. It is idempotent.
//
// Migration 00003 makes tokens epoch tokens (see [Token]): every token issued after it is
// larger than every token issued before. It refuses, with an error wrapping [ErrTokenBudget]
// and changing nothing, a database whose token sequence is already past 2^47 - 1.
//
// The role needs CREATE on the database. Errors: an [*ArgumentError] for a nil pool (before any
// SQL runs); one wrapping [ErrTokenBudget] as said; otherwise goose's and pgx's errors, wrapped.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if pool == nil {
		return argError("pool", "must not be nil")
	}
	// goose creates its version table before it runs any migration, so the schema the table
	// lives in must exist first.
	// CREATE SCHEMA IF NOT EXISTS is not safe against a concurrent twin: the loser can fail
	// with unique_violation (23505) or duplicate_schema (42P06). The schema then exists.
	if _, err := pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS fencelock`); err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || (pgErr.Code != "23505" && pgErr.Code != "42P06") {
			return fmt.Errorf("fencelock: create schema: %w", err)
		}
	}
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(migrateLockID), lock.WithLockTimeout(1, 300))
	if err != nil {
		return fmt.Errorf("fencelock: migration lock: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS,
		goose.WithTableName(VersionTable),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
		goose.WithLogger(goose.NopLogger()),
	)
	if err != nil {
		return fmt.Errorf("fencelock: migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return wrapPg("fencelock: migrate", err)
	}
	return nil
}
