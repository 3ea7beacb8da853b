package fencelock_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
)

// sqlWirings are the two ways a service wires database/sql beside its pgx pool: one pool
// shared through pgx's stdlib.OpenDBFromPool, and a *sql.DB opened on its own with pgx's
// stdlib driver. (lib/pq, GORM, bun and sqlx: internal/integration/database_sql_orm_test.go.)
var sqlWirings = []struct {
	desc string
	open func(t *testing.T, b *bundle) *sql.DB
}{
	{"SharedPool", func(t *testing.T, b *bundle) *sql.DB {
		sqlDB := stdlib.OpenDBFromPool(b.Pool)
		t.Cleanup(func() { _ = sqlDB.Close() })
		return sqlDB
	}},
	{"OwnDB", func(t *testing.T, b *bundle) *sql.DB {
		sqlDB, err := sql.Open("pgx", b.DB.URL)
		require.NoError(t, err)
		t.Cleanup(func() { _ = sqlDB.Close() })
		return sqlDB
	}},
}

// forEachSQLWiring runs body once per wiring of sqlWirings, as parallel subtests named after
// it, each with a database of its own and the *sql.DB of that wiring.
func forEachSQLWiring(t *testing.T, body func(t *testing.T, b *bundle, sqlDB *sql.DB)) {
	t.Parallel()
	for _, w := range sqlWirings {
		t.Run(w.desc, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			body(t, b, w.open(t, b))
		})
	}
}

// inSQLTx runs fn in a transaction of sqlDB that starts with synchronous_commit off (the
// setting fenced calls must raise), committed when fn returns nil and rolled back otherwise.
// It returns fn's error and the transaction's synchronous_commit when fn returned.
func inSQLTx(t *testing.T, ctx context.Context, sqlDB *sql.DB, fn func(tx *sql.Tx) error) (string, error) {
	t.Helper()
	tx, err := sqlDB.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	_, err = tx.ExecContext(ctx, `SET LOCAL synchronous_commit = off`)
	require.NoError(t, err)
	if err := fn(tx); err != nil {
		return "", err
	}
	var sync string
	require.NoError(t, tx.QueryRowContext(ctx, `SELECT current_setting('synchronous_commit')`).Scan(&sync))
	require.NoError(t, tx.Commit())
	return sync, nil
}

func TestFenceSQLTx(t *testing.T) {
	forEachSQLWiring(t, func(t *testing.T, b *bundle, sqlDB *sql.DB) {
		createWrites(t, b)
		write := func(token fencelock.Token) (string, error) {
			return inSQLTx(t, b.Ctx, sqlDB, func(tx *sql.Tx) error {
				if err := fencelock.FenceSQLTx(b.Ctx, tx, "r", token); err != nil {
					return err
				}
				_, err := tx.ExecContext(b.Ctx, `INSERT INTO writes (resource, token) VALUES ($1, $2)`, "r", int64(token))
				return err
			})
		}
		for _, token := range []fencelock.Token{5, 5, 7} {
			sync, err := write(token)
			require.NoError(t, err, "token %d", token)
			require.Equal(t, "on", sync, "FenceSQLTx raises synchronous_commit from off to on")
		}
		_, err := write(6)
		require.Equal(t, &fencelock.StaleTokenError{Resource: "r", Token: 6, Current: 7}, errorsAsStale(t, err))
		require.Equal(t, []int64{5, 5, 7}, writtenTokens(t, b, "r"))

		var argErr *fencelock.ArgumentError
		require.ErrorAs(t, fencelock.FenceSQLTx(b.Ctx, nil, "r", 1), &argErr)
		_, err = inSQLTx(t, b.Ctx, sqlDB, func(tx *sql.Tx) error { return fencelock.FenceSQLTx(b.Ctx, tx, "r", 0) })
		require.ErrorAs(t, err, &argErr)
	})
}

func TestUpdateFencedSQLTx(t *testing.T) {
	forEachSQLWiring(t, func(t *testing.T, b *bundle, sqlDB *sql.DB) {
		_, err := b.Pool.Exec(b.Ctx, `CREATE TABLE "Stock Items" (sku text PRIMARY KEY, stock int NOT NULL, "fence token" bigint);
			INSERT INTO "Stock Items" VALUES ('A-1', 10, NULL)`)
		require.NoError(t, err)
		update := func(sku string, token fencelock.Token, stock int) (int64, string, error) {
			var n int64
			sync, err := inSQLTx(t, b.Ctx, sqlDB, func(tx *sql.Tx) error {
				var err error
				n, err = fencelock.UpdateFencedSQLTx(b.Ctx, tx, pgx.Identifier{"Stock Items"}, "fence token", token,
					[]fencelock.Column{{Name: "stock", Value: stock}}, []fencelock.Column{{Name: "sku", Value: sku}})
				return err
			})
			return n, sync, err
		}
		n, sync, err := update("A-1", 4, 9)
		require.NoError(t, err)
		require.Equal(t, int64(1), n)
		require.Equal(t, "on", sync)
		_, _, err = update("A-1", 3, 8)
		require.Equal(t, &fencelock.StaleTokenError{Table: "Stock Items", Key: `sku="A-1"`, Token: 3, Current: 4}, errorsAsStale(t, err))
		_, _, err = update("B-2", 5, 1)
		require.ErrorIs(t, err, fencelock.ErrNoRow)
		var stock int
		require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT stock FROM "Stock Items" WHERE sku = 'A-1'`).Scan(&stock))
		require.Equal(t, 9, stock)
	})
}

// The lease forms: a current grant passes and holds its row; once the grant is gone on the
// server (a forced release), both report the loss and the lease ends.
func TestLeaseSQLTx(t *testing.T) {
	t.Parallel()
	forms := []struct {
		desc  string
		guard func(ctx context.Context, lease *fencelock.Lease, tx *sql.Tx) error
	}{
		{"GuardSQLTx", func(ctx context.Context, lease *fencelock.Lease, tx *sql.Tx) error { return lease.GuardSQLTx(ctx, tx) }},
		{"FenceSQLTx", func(ctx context.Context, lease *fencelock.Lease, tx *sql.Tx) error {
			return lease.FenceSQLTx(ctx, tx, "r")
		}},
	}
	for _, w := range sqlWirings {
		for _, form := range forms {
			t.Run(w.desc+"/"+form.desc, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				sqlDB := w.open(t, b)
				l := newLessor(t, b.Pool, "a")
				lease, err := l.TryAcquire(b.Ctx, "job", time.Minute)
				require.NoError(t, err)
				sync, err := inSQLTx(t, b.Ctx, sqlDB, func(tx *sql.Tx) error { return form.guard(b.Ctx, lease, tx) })
				require.NoError(t, err)
				if form.desc == "FenceSQLTx" {
					require.Equal(t, "on", sync)
					var mark int64
					require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT token FROM fencelock.fences WHERE resource = 'r'`).Scan(&mark))
					require.Equal(t, int64(lease.Token()), mark)
				}

				_, err = b.Pool.Exec(b.Ctx, `SELECT fencelock.force_release('job', ARRAY[]::text[])`)
				require.NoError(t, err)
				_, err = inSQLTx(t, b.Ctx, sqlDB, func(tx *sql.Tx) error { return form.guard(b.Ctx, lease, tx) })
				var lost *fencelock.LeaseLostError
				require.ErrorAs(t, err, &lost)
				require.Equal(t, "job", lost.Name)
				select {
				case <-lease.Done():
				default:
					t.Fatal("Done is still open after the guard found the lease gone")
				}
				require.ErrorAs(t, form.guard(b.Ctx, lease, nil), new(*fencelock.ArgumentError))
			})
		}
	}
}

func TestLeaseSetAndTermSQLTx(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sqlDB := stdlib.OpenDBFromPool(b.Pool)
	t.Cleanup(func() { _ = sqlDB.Close() })
	l := newLessor(t, b.Pool, "a")
	set, err := l.TryAcquireAll(b.Ctx, []string{"x", "y"}, time.Minute)
	require.NoError(t, err)
	_, err = inSQLTx(t, b.Ctx, sqlDB, func(tx *sql.Tx) error { return set.GuardSQLTx(b.Ctx, tx) })
	require.NoError(t, err)

	e := fencetest.NewElection(t, b.Pool, "a", "leader", time.Minute)
	term, err := e.Campaign(b.Ctx, "a")
	require.NoError(t, err)
	_, err = inSQLTx(t, b.Ctx, sqlDB, func(tx *sql.Tx) error { return term.FenceSQLTx(b.Ctx, tx, "leader-writes") })
	require.NoError(t, err)

	_, err = b.Pool.Exec(b.Ctx, `SELECT fencelock.force_release('y', ARRAY[]::text[])`)
	require.NoError(t, err)
	_, err = inSQLTx(t, b.Ctx, sqlDB, func(tx *sql.Tx) error { return set.GuardSQLTx(b.Ctx, tx) })
	require.ErrorIs(t, err, fencelock.ErrLeaseLost)
}

func TestAdvisoryLockSQLTx(t *testing.T) {
	forEachSQLWiring(t, func(t *testing.T, b *bundle, sqlDB *sql.DB) {
		a, err := fencelock.NewAdvisoryLocker(b.Pool, fencelock.WithFencingTokens())
		require.NoError(t, err)
		t1, err := sqlDB.BeginTx(b.Ctx, nil)
		require.NoError(t, err)
		defer func() { _ = t1.Rollback() }()
		tok, err := a.TryLockSQLTx(b.Ctx, t1, "report")
		require.NoError(t, err)
		require.Greater(t, tok, fencelock.Token(0))

		t2, err := sqlDB.BeginTx(b.Ctx, nil)
		require.NoError(t, err)
		defer func() { _ = t2.Rollback() }()
		_, err = a.TryLockSQLTx(b.Ctx, t2, "report")
		require.ErrorIs(t, err, fencelock.ErrNotAcquired)
		require.NoError(t, t2.Rollback())

		// LockSQLTx waits in the server's queue until t1 ends.
		got := make(chan error, 1)
		go func() {
			t3, err := sqlDB.BeginTx(b.Ctx, nil)
			if err != nil {
				got <- err
				return
			}
			defer func() { _ = t3.Rollback() }()
			tok3, err := a.LockSQLTx(b.Ctx, t3, "report")
			if err == nil && tok3 <= tok {
				err = errors.New("the later grant's token is not larger")
			}
			got <- err
		}()
		waitFor(t, b, "LockSQLTx waiting on the advisory lock", func() bool {
			var n int
			require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM pg_locks AS l JOIN pg_database AS d ON d.oid = l.database
				WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = current_database()`).Scan(&n))
			return n == 1
		})
		require.NoError(t, t1.Commit())
		require.NoError(t, <-got)

		_, err = a.TryLockSQLTx(b.Ctx, nil, "report")
		require.ErrorAs(t, err, new(*fencelock.ArgumentError))
	})
}

func TestRunLockedSQL(t *testing.T) {
	forEachSQLWiring(t, func(t *testing.T, b *bundle, sqlDB *sql.DB) {
		createWrites(t, b)
		l := newLessor(t, b.Pool, "a", fastBackoff)
		holder := newLessor(t, b.Pool, "h")
		lease, err := holder.TryAcquire(b.Ctx, "job", time.Minute)
		require.NoError(t, err)

		write := func(ctx context.Context, tx *sql.Tx, token fencelock.Token) error {
			if token <= 0 {
				return errors.New("fn got a token that is not positive")
			}
			if err := fencelock.FenceSQLTx(ctx, tx, "job", token); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO writes (resource, token) VALUES ('job', $1)`, int64(token))
			return err
		}
		require.ErrorIs(t, l.TryRunLockedSQL(b.Ctx, sqlDB, "job", write), fencelock.ErrNotAcquired)

		done := make(chan error, 1)
		go func() { done <- l.RunLockedSQL(b.Ctx, sqlDB, "job", write) }()
		awaitWaiters(t, b, "job", 1)
		require.NoError(t, lease.Release(b.Ctx))
		require.NoError(t, <-done)
		got := writtenTokens(t, b, "job")
		require.Len(t, got, 1)
		require.Greater(t, got[0], int64(lease.Token()))

		// fn's error rolls back, and is returned as is.
		errFn := errors.New("fn failed")
		require.Equal(t, errFn, l.TryRunLockedSQL(b.Ctx, sqlDB, "job", func(ctx context.Context, tx *sql.Tx, token fencelock.Token) error {
			if err := write(ctx, tx, token); err != nil {
				return err
			}
			return errFn
		}))
		require.Len(t, writtenTokens(t, b, "job"), 1)

		require.ErrorAs(t, l.TryRunLockedSQL(b.Ctx, nil, "job", write), new(*fencelock.ArgumentError))
		require.ErrorAs(t, l.RunLockedSQL(b.Ctx, sqlDB, "job", nil), new(*fencelock.ArgumentError))
		require.ErrorAs(t, l.RunLockedSQL(b.Ctx, sqlDB, "", write), new(*fencelock.ArgumentError))
	})
}

// A RunLockedSQL whose grant waits on the server's row lock (another transaction holds the row)
// and whose ctx ends meanwhile returns only once its backend no longer waits for the row: the
// row is free for the next transaction as soon as the holder commits.
func TestRunLockedSQLCancelledOnRowLock(t *testing.T) {
	forEachSQLWiring(t, func(t *testing.T, b *bundle, sqlDB *sql.DB) {
		_, err := fencetest.CancelRunLockedSQLOnRowLock(t, b.Ctx, b.Pool, sqlDB)
		require.ErrorIs(t, err, context.Canceled)
		requireFree(t, b, "job")
	})
}
