// Package gooselock gives goose v3 (github.com/pressly/goose/v3) a [lock.Locker] on a lease of
// a [fencelock.Lessor], so that goose migrators take turns through the lease's queue: it works
// behind PgBouncer in transaction mode, where goose's session advisory locker does not
// (pressly/goose#972), and wakes the next migrator on release instead of polling as goose's
// table locker does.
//
//	locker, err := gooselock.New(lessor, "migrations:app", 30*time.Second)
//	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys, goose.WithLocker(locker))
//	ctx, cancel := locker.Context(ctx) // cancelled if the lease is lost mid-run
//	defer cancel()
//	_, err = p.Up(ctx)
//
// # The SQL it owns
//
// None: the lease is an ordinary lease of the lessor (a row of fencelock.leases, taken,
// renewed by the heartbeat and released by package fencelock's statements), and goose's own
// statements run on the *sql.DB given to goose.
//
// # Errors
//
// Bad input is refused before any SQL runs with a [*fencelock.ArgumentError] (matching
// [fencelock.ErrInvalidArgument]). The other errors are package fencelock's: its lease errors
// ([fencelock.ErrAlreadyHeld], [fencelock.ErrNotHeld], [fencelock.ErrLeaseLost], ...) and
// pgx's, wrapped with %w.
package gooselock
