package fencelock_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// A table protected by fencelock.protect_table refuses stale writes whoever sends them: these
// writes go through a plain connection that runs no fencelock Go code, as psql or a script
// would.

// plainConn returns a connection to b's database that no fencelock code has touched, closed at
// test cleanup.
func plainConn(t *testing.T, b *bundle) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(b.Ctx, b.DB.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// writeWith runs stmt in a transaction that first sets the writer's token with
// fencelock.set_token (none when token is 0) and synchronous_commit off, and returns the
// statement's error and the transaction's synchronous_commit after it.
func writeWith(t *testing.T, ctx context.Context, conn *pgx.Conn, token int64, stmt string, args ...any) (string, error) {
	t.Helper()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SET LOCAL synchronous_commit = off`)
	require.NoError(t, err)
	if token != 0 {
		_, err = tx.Exec(ctx, `SELECT fencelock.set_token($1)`, token)
		require.NoError(t, err)
	}
	if _, err := tx.Exec(ctx, stmt, args...); err != nil {
		return "", err
	}
	var sync string
	require.NoError(t, tx.QueryRow(ctx, `SELECT current_setting('synchronous_commit')`).Scan(&sync))
	return sync, tx.Commit(ctx)
}

func TestProtectedTableRefusesStaleWrites(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn := plainConn(t, b)
	_, err := conn.Exec(b.Ctx, `CREATE TABLE stock (sku text PRIMARY KEY, n int NOT NULL, fence_token bigint);
		SELECT fencelock.protect_table('stock')`)
	require.NoError(t, err)
	ptr := func(v int64) *int64 { return &v }

	for _, step := range []struct {
		desc  string
		token int64 // set with fencelock.set_token; 0: none
		stmt  string
		code  string // the SQLSTATE refusing it; "": accepted
		after *int64 // the row's token afterwards
	}{
		{"InsertWithoutToken", 0, `INSERT INTO stock VALUES ('A', 10, NULL)`, "FL006", nil},
		{"InsertWithSetting", 5, `INSERT INTO stock VALUES ('A', 10, NULL)`, "", ptr(5)},
		{"UpdateWithoutToken", 0, `UPDATE stock SET n = n - 1 WHERE sku = 'A'`, "FL006", ptr(5)},
		{"UpdateSameToken", 5, `UPDATE stock SET n = n - 1 WHERE sku = 'A'`, "", ptr(5)},
		{"UpdateNewerToken", 7, `UPDATE stock SET n = n - 1 WHERE sku = 'A'`, "", ptr(7)},
		{"UpdateStaleToken", 6, `UPDATE stock SET n = n - 1 WHERE sku = 'A'`, "FL004", ptr(7)},
		{"UpdateColumnNewer", 0, `UPDATE stock SET n = n - 1, fence_token = 9 WHERE sku = 'A'`, "", ptr(9)},
		{"UpdateColumnStale", 0, `UPDATE stock SET n = n - 1, fence_token = 8 WHERE sku = 'A'`, "FL004", ptr(9)},
		{"UpdateColumnUnchanged", 0, `UPDATE stock SET n = n - 1, fence_token = 9 WHERE sku = 'A'`, "FL006", ptr(9)},
		{"SettingWinsOverColumn", 10, `UPDATE stock SET fence_token = 3 WHERE sku = 'A'`, "", ptr(10)},
		{"UpsertStale", 4, `INSERT INTO stock VALUES ('A', 1, NULL) ON CONFLICT (sku) DO UPDATE SET n = excluded.n`, "FL004", ptr(10)},
		{"DeleteWithoutToken", 0, `DELETE FROM stock WHERE sku = 'A'`, "FL006", ptr(10)},
		{"DeleteStale", 9, `DELETE FROM stock WHERE sku = 'A'`, "FL004", ptr(10)},
		{"DeleteCurrent", 10, `DELETE FROM stock WHERE sku = 'A'`, "", nil},
	} {
		sync, err := writeWith(t, b.Ctx, conn, step.token, step.stmt)
		if step.code == "" {
			require.NoError(t, err, step.desc)
			require.Equal(t, "on", sync, "%s: the trigger raises synchronous_commit from off to on", step.desc)
		} else {
			require.Equal(t, step.code, sqlState(err), "%s: %v", step.desc, err)
		}
		var after *int64
		err = conn.QueryRow(b.Ctx, `SELECT fence_token FROM stock WHERE sku = 'A'`).Scan(&after)
		if step.after == nil {
			require.ErrorIs(t, err, pgx.ErrNoRows, step.desc)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, *step.after, *after, step.desc)
	}

	// UpdateFencedTx on a protected table: its token travels in the column, and the trigger
	// reports a refusal as the Go sentinel.
	_, err = conn.Exec(b.Ctx, `SELECT fencelock.set_token(20); INSERT INTO stock VALUES ('B', 1, NULL)`)
	require.NoError(t, err)
	updateB := func(token fencelock.Token) error {
		return pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error {
			_, err := fencelock.UpdateFencedTx(b.Ctx, tx, pgx.Identifier{"stock"}, "fence_token", token,
				[]fencelock.Column{{Name: "n", Value: 0}}, []fencelock.Column{{Name: "sku", Value: "B"}})
			return err
		})
	}
	require.NoError(t, updateB(21))
	require.NoError(t, updateB(21), "UpdateFencedTx passes its token to the trigger: the same token again passes")
	require.ErrorIs(t, updateB(15), fencelock.ErrStaleToken)
	var stale *fencelock.StaleTokenError
	require.ErrorAs(t, updateB(15), &stale)
	require.Equal(t, fencelock.Token(21), stale.Current)
	// A write after UpdateFencedTx in its transaction carries its token.
	err = pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error {
		if _, err := fencelock.UpdateFencedTx(b.Ctx, tx, pgx.Identifier{"stock"}, "fence_token", 22,
			[]fencelock.Column{{Name: "n", Value: 3}}, []fencelock.Column{{Name: "sku", Value: "B"}}); err != nil {
			return err
		}
		_, err := tx.Exec(b.Ctx, `UPDATE stock SET n = n - 1 WHERE sku = 'B'`)
		return err
	})
	require.NoError(t, err)
	// A stale write through any Go statement is reported as the sentinel.
	err = pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(b.Ctx, `SELECT fencelock.set_token(19); UPDATE stock SET n = 0 WHERE sku = 'B'`)
		return fencelock.WrapSQLError(err)
	})
	require.ErrorIs(t, err, fencelock.ErrStaleToken)
}

// With a resource, a protected table also advances that fence: a new row inserted with an
// older token than the fence has seen is refused too.
func TestProtectedTableWithFence(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn := plainConn(t, b)
	_, err := conn.Exec(b.Ctx, `CREATE TABLE orders (id int PRIMARY KEY, token bigint);
		SELECT fencelock.protect_table('orders', 'token', 'orders')`)
	require.NoError(t, err)
	_, err = writeWith(t, b.Ctx, conn, 5, `INSERT INTO orders (id) VALUES (1)`)
	require.NoError(t, err)
	_, err = writeWith(t, b.Ctx, conn, 4, `INSERT INTO orders (id) VALUES (2)`)
	require.Equal(t, "FL004", sqlState(err))
	require.ErrorIs(t, fencelock.WrapSQLError(err), fencelock.ErrStaleToken)
	require.ErrorIs(t, fenceOnly(b.Ctx, b.Pool, "orders", 4), fencelock.ErrStaleToken, "the trigger advanced the fence")
	require.NoError(t, fenceOnly(b.Ctx, b.Pool, "orders", 6))
	_, err = writeWith(t, b.Ctx, conn, 5, `INSERT INTO orders (id) VALUES (3)`)
	require.Equal(t, "FL004", sqlState(err), "a Go FenceTx advanced the fence the trigger checks")

	// Bad setups are refused before anything is attached.
	for _, stmt := range []string{
		`SELECT fencelock.protect_table('orders', 'nope')`,
		`SELECT fencelock.protect_table('orders', 'id')`, // not bigint
		`SELECT fencelock.protect_table('orders', 'token', '')`,
	} {
		_, err := conn.Exec(b.Ctx, stmt)
		require.Equal(t, "FL007", sqlState(err), stmt)
	}
	_, err = writeWith(t, b.Ctx, conn, 0, `SET LOCAL fencelock.token = 'x'; INSERT INTO orders (id) VALUES (4)`)
	require.Equal(t, "FL007", sqlState(err), "a setting that is no token")

	_, err = conn.Exec(b.Ctx, `SELECT fencelock.unprotect_table('orders')`)
	require.NoError(t, err)
	_, err = conn.Exec(b.Ctx, `INSERT INTO orders (id) VALUES (9)`)
	require.NoError(t, err, "unprotected again")
}
