package fencelock

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/fencelock/fencelock/migrations"
)

// VersionTable is the goose version table that [Migrate] keeps, in fencelock's own schema so
// that it never collides with an application's goose_db_version.
const VersionTable = "fencelock.goose_db_version"

// migrateStateSQL says whether schema fencelock and its version table exist. It reads the
// catalogs only, which every role may read: unlike to_regclass('fencelock.goose_db_version'), it
// does not fail for a role without USAGE on the schema.
const migrateStateSQL = `SELECT pg_catalog.to_regnamespace('fencelock') IS NOT NULL AS schema_exists,
       EXISTS (SELECT FROM pg_catalog.pg_class AS c
               WHERE c.relnamespace = pg_catalog.to_regnamespace('fencelock')
                 AND c.relname = 'goose_db_version') AS table_exists`

// Migrate applies fencelock's migrations (package [migrations]) to the database behind pool,
// creating schema fencelock with its tables, views and functions. It keeps goose v3's version
// table [VersionTable]. It is idempotent, and safe to call from several processes at once.
//
// It first checks, reading only, whether any migration is pending: when the version table
// exists and lists every migration, it returns nil without DDL and without a lock. So the
// application's own runtime role (see below) may call it at every start, once the schema's
// owner has migrated. Otherwise it creates schema fencelock if missing, takes the migration
// lock and applies what is pending. The lock is a transaction-scoped advisory lock held in a
// transaction left open on a connection of its own for the length of the run: it excludes
// other Migrate calls behind PgBouncer in transaction mode too (an open transaction keeps its
// server connection), and it ends with that transaction if the process dies. The others wait
// for it, for at most five minutes, then find nothing pending. The lock is held around the
// whole of goose's Up, the creation of goose's version table included. Its connection is
// opened from pool's configuration outside pool (a full pool cannot hold it up), and closed
// when Migrate returns. Behind PgBouncer, keep its idle_transaction_timeout (0 by default)
// above the longest migration run: the lock's transaction sits idle meanwhile. Migrate does not
// notice a lock lost mid-run (its backend terminated): the migrations go on, each in its own
// transaction, as with goose's own lockers.
//
// Each migration runs with its search_path pinned to pg_catalog, pg_temp for its transaction
// (SET LOCAL), whatever the role's or the connection's own: no object that another role
// created in a schema of that path can slip into what a migration creates or runs
// (docs/SECURITY.md). The connection keeps its own search_path afterwards.
//
// Migration 00003 makes tokens epoch tokens (see [Token]): every token issued after it is
// larger than every token issued before. It refuses, with an error wrapping [ErrTokenBudget]
// and changing nothing, a database whose token sequence is already past 2^47 - 1.
//
// Privileges. Applying migrations needs the owner of schema fencelock and its objects (on a
// fresh database, a role with CREATE on the database). The runtime role of the application,
// which takes leases, fences, advisory tokens and runs the nothing-pending Migrate, needs no
// DDL privilege at all; after each Migrate that applied migrations, as the owner:
//
//	GRANT USAGE ON SCHEMA fencelock TO app;
//	GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA fencelock TO app;
//	GRANT USAGE ON ALL SEQUENCES IN SCHEMA fencelock TO app;
//
// (plus CONNECT on the database where PUBLIC's was revoked). ALL TABLES covers the views
// (holders, lease_queue, advisory_locks), fencelock.token_flushes (advisory tokens),
// fencelock.token_epoch and fencelock.token_epoch_marks (every token; [RebaseTokenEpoch] too)
// and the version table, which
// Migrate reads. The functions (next_token, hand_off, force_release, rebase_token_epoch) are
// EXECUTE to PUBLIC unless default privileges revoked that. README.md, "Least privilege", says
// more.
//
// Errors: an [*ArgumentError] for a nil pool (before any SQL runs); one wrapping
// [ErrTokenBudget] as said; when the role cannot read the version table, or migrations are
// pending and it may not apply them (create schema fencelock, alter its tables), an error saying
// which privilege is missing, wrapping the [*pgconn.PgError] (SQLSTATE 42501; the migration that
// failed rolls back); when the lock is not granted within five minutes, an error saying so;
// otherwise goose's and pgx's errors, wrapped. With nothing pending it returns nil on a hot
// standby too; with migrations pending there, an error wrapping [ErrReadOnly].
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if pool == nil {
		return argError("pool", "must not be nil")
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	// No goose locker: goose's Up first runs HasPending without its locker, which creates the
	// version table on a fresh database, racing other Migrate calls (the losers retry once a
	// second). Migrate takes its lock around the whole of Up instead.
	p, err := goose.NewProvider(goose.DialectPostgres, db, pinnedMigrations{migrations.FS},
		goose.WithTableName(VersionTable),
		goose.WithDisableGlobalRegistry(true),
		goose.WithLogger(goose.NopLogger()),
	)
	if err != nil {
		return fmt.Errorf("fencelock: migrations: %w", err)
	}

	var schemaExists, tableExists bool
	if err := pool.QueryRow(ctx, migrateStateSQL).Scan(&schemaExists, &tableExists); err != nil {
		return wrapPg("fencelock: migrate: read catalog", err)
	}
	if tableExists {
		// HasPending takes no lock (goose ignores the locker there) and creates nothing: the
		// version table exists, so goose's check for it passes. It reads the whole table, so
		// that a migration missing below the highest applied one is an error here as in Up.
		pending, err := p.HasPending(ctx)
		if err != nil {
			if pgCode(err) == "42501" {
				// Falling through to the DDL would fail too (Up reads the same table), with a
				// less telling error, or take the lock for nothing.
				return fmt.Errorf("fencelock: migrate: the role cannot read %s: grant it USAGE on schema fencelock and SELECT on %s, or run Migrate as the owner of schema fencelock: %w",
					VersionTable, VersionTable, err)
			}
			return wrapPg("fencelock: migrate: check pending migrations", err)
		}
		if !pending {
			return nil
		}
	}

	if !schemaExists {
		// goose creates its version table before it runs any migration, so the schema the
		// table lives in must exist first. CREATE SCHEMA IF NOT EXISTS is not safe against a
		// concurrent twin: the loser can fail with unique_violation (23505) or duplicate_schema
		// (42P06). The schema then exists.
		if _, err := pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS fencelock`); err != nil {
			switch code := pgCode(err); {
			case code == "42501": // insufficient_privilege
				return fmt.Errorf("fencelock: migrate: migrations are pending and the role may not create schema fencelock (CREATE on the database): run Migrate as the owner of schema fencelock: %w", err)
			case code != "23505" && code != "42P06":
				return wrapPg("fencelock: create schema", err)
			}
		}
	}
	// The lock's connection is opened from the pool's configuration but outside the pool: a
	// connection of the pool held by goose (or by the application) while another waits for the
	// lock's could otherwise leave several Migrate calls of one pool each holding one and
	// waiting for another.
	lockDB := stdlib.OpenDB(*pool.Config().ConnConfig.Copy())
	defer lockDB.Close()
	locker := &migrateLocker{}
	if err := locker.Lock(ctx, lockDB); err != nil {
		return fmt.Errorf("fencelock: migrate: %w", err)
	}
	_, err = p.Up(ctx)
	if uerr := locker.Unlock(context.WithoutCancel(ctx), lockDB); uerr != nil && err == nil {
		err = uerr
	}
	switch {
	case err == nil:
		return nil
	case pgCode(err) == "42501":
		return fmt.Errorf("fencelock: migrate: migrations are pending and the role may not apply them: run Migrate as the owner of schema fencelock: %w", err)
	case pgCode(err) == "25006":
		return fmt.Errorf("fencelock: migrate: migrations are pending and the server is read-only (a hot standby?): run Migrate on the primary: %w: %w", ErrReadOnly, err)
	}
	return wrapPg("fencelock: migrate", err)
}
