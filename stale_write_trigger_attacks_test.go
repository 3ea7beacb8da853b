package fencelock_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// Attacks on the trigger fencelock.refuse_stale_writes (docs/SQL.md, "A table that refuses
// stale writes") by the ways SQL has to write a row besides a plain UPDATE: a token column set
// down or to NULL, rows of mixed tokens in one statement, cascades from a parent table,
// upserts, writable CTEs, MERGE, rows moving between partitions, settings that are no token,
// a setting rolled back with its savepoint, and COPY. Each step starts from the same rows and
// states the SQLSTATE the database must refuse it with ("" when accepted) and the rows'
// tokens afterwards.
func TestProtectedTableRefusesEvasions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn := plainConn(t, b)
	_, err := conn.Exec(b.Ctx, `
		CREATE TABLE parent (id int PRIMARY KEY);
		CREATE TABLE stock (sku text PRIMARY KEY, n int NOT NULL, fence_token bigint,
			parent_id int REFERENCES parent ON DELETE CASCADE ON UPDATE CASCADE);
		SELECT fencelock.protect_table('stock');
		CREATE TABLE pstock (sku text, region int, fence_token bigint, PRIMARY KEY (sku, region)) PARTITION BY LIST (region);
		CREATE TABLE pstock_1 PARTITION OF pstock FOR VALUES IN (1);
		CREATE TABLE pstock_2 PARTITION OF pstock FOR VALUES IN (2);
		SELECT fencelock.protect_table('pstock');`)
	require.NoError(t, err)
	reset := func() {
		_, err := conn.Exec(b.Ctx, `BEGIN; SET LOCAL session_replication_role = replica;
			DELETE FROM stock; DELETE FROM parent; DELETE FROM pstock;
			INSERT INTO parent VALUES (1);
			INSERT INTO stock VALUES ('A', 10, 5, 1), ('B', 10, 9, 1), ('N', 10, NULL, NULL);
			INSERT INTO pstock VALUES ('A', 1, 9);
			COMMIT`)
		require.NoError(t, err)
	}
	tokens := func() string {
		var s string
		require.NoError(t, conn.QueryRow(b.Ctx, `SELECT coalesce(string_agg(sku || '=' || coalesce(fence_token::text, 'null'), ',' ORDER BY sku), '')
			|| ';' || coalesce((SELECT string_agg(sku || region || '=' || fence_token, ',') FROM pstock), '') FROM stock`).Scan(&s))
		return s
	}
	const orig = "A=5,B=9,N=null;A1=9"
	for _, step := range []struct {
		desc  string
		token int64
		stmt  string
		code  string
		after string
	}{
		{"SetColumnNullNoSetting", 0, `UPDATE stock SET fence_token = NULL WHERE sku = 'B'`, "FL006", orig},
		{"SetColumnDownWithHigherSetting", 9, `UPDATE stock SET fence_token = 1 WHERE sku = 'B'`, "", orig},
		{"MultiRowMixed", 7, `UPDATE stock SET n = 0 WHERE sku IN ('A', 'B')`, "FL004", orig},
		{"MultiRowColumnMixed", 0, `UPDATE stock SET fence_token = 7 WHERE sku IN ('A', 'B')`, "FL004", orig},
		{"CascadeDeleteFromParent", 0, `DELETE FROM parent WHERE id = 1`, "FL006", orig},
		{"CascadeDeleteStale", 6, `DELETE FROM parent WHERE id = 1`, "FL004", orig},
		{"CascadeUpdateFromParent", 0, `UPDATE parent SET id = 2 WHERE id = 1`, "FL006", orig},
		{"UpsertColumnOnlyInInsert", 0, `INSERT INTO stock VALUES ('B', 1, 100, NULL) ON CONFLICT (sku) DO UPDATE SET n = excluded.n`, "FL006", orig},
		{"UpsertStaleColumn", 0, `INSERT INTO stock VALUES ('B', 1, 8, NULL) ON CONFLICT (sku) DO UPDATE SET n = excluded.n, fence_token = excluded.fence_token`, "FL004", orig},
		{"UpsertStaleSettingHigherColumn", 8, `INSERT INTO stock VALUES ('B', 1, 100, NULL) ON CONFLICT (sku) DO UPDATE SET n = excluded.n, fence_token = 100`, "FL004", orig},
		{"WritableCTEStale", 8, `WITH d AS (DELETE FROM stock WHERE sku = 'B' RETURNING *) SELECT count(*) FROM d`, "FL004", orig},
		{"MergeStale", 8, `MERGE INTO stock s USING (VALUES ('B')) v(sku) ON s.sku = v.sku WHEN MATCHED THEN UPDATE SET n = 0`, "FL004", orig},
		{"MergeColumnDown", 0, `MERGE INTO stock s USING (VALUES ('B')) v(sku) ON s.sku = v.sku WHEN MATCHED THEN UPDATE SET fence_token = 8`, "FL004", orig},
		{"PartitionMoveStale", 8, `UPDATE pstock SET region = 2 WHERE sku = 'A'`, "FL004", orig},
		{"PartitionMoveColumnNoSetting", 0, `UPDATE pstock SET region = 2, fence_token = 10 WHERE sku = 'A'`, "FL006", orig},
		{"SettingZero", 0, `SET LOCAL fencelock.token = '0'; UPDATE stock SET n = 0 WHERE sku = 'N'`, "FL007", orig},
		{"SettingSpace", 0, `SET LOCAL fencelock.token = ' 99'; UPDATE stock SET n = 0 WHERE sku = 'N'`, "FL007", orig},
		{"SettingOverflow", 0, `SET LOCAL fencelock.token = '9223372036854775808'; UPDATE stock SET n = 0 WHERE sku = 'N'`, "FL007", orig},
		{"SettingInSubtxRolledBack", 0, `SAVEPOINT s; SELECT fencelock.set_token(100); ROLLBACK TO SAVEPOINT s; UPDATE stock SET n = 0 WHERE sku = 'B'`, "FL006", orig},
		{"NullRowNewToken", 1, `UPDATE stock SET n = 0 WHERE sku = 'N'`, "", "A=5,B=9,N=1;A1=9"},
	} {
		reset()
		_, err := writeWith(t, b.Ctx, conn, step.token, step.stmt)
		require.Equal(t, step.code, sqlState(err), "%s: %v", step.desc, err)
		require.Equal(t, step.after, tokens(), step.desc)
	}

	// COPY, without a token and with one.
	for _, c := range []struct {
		token int64
		code  string
	}{{0, "FL006"}, {3, ""}} {
		reset()
		tx, err := conn.Begin(b.Ctx)
		require.NoError(t, err)
		if c.token != 0 {
			_, err = tx.Exec(b.Ctx, `SELECT fencelock.set_token($1)`, c.token)
			require.NoError(t, err)
		}
		_, err = tx.Conn().PgConn().CopyFrom(b.Ctx, strings.NewReader("C\t1\t\\N\t\\N\n"), `COPY stock (sku, n, fence_token, parent_id) FROM STDIN`)
		require.Equal(t, c.code, sqlState(err), "COPY with token %d: %v", c.token, err)
		_ = tx.Rollback(b.Ctx)
	}
}

// Two writers of one row under READ COMMITTED, by UPDATE, DELETE and upsert: the older token
// waits for the newer one's transaction and is then refused against the row as that
// transaction left it.
func TestProtectedTableOlderConcurrentWriterRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn := plainConn(t, b)
	_, err := conn.Exec(b.Ctx, `CREATE TABLE stock (sku text PRIMARY KEY, n int NOT NULL, fence_token bigint);
		SELECT fencelock.protect_table('stock');
		SELECT fencelock.set_token(5); INSERT INTO stock VALUES ('A', 10, NULL)`)
	require.NoError(t, err)
	for _, stmt := range []string{
		`UPDATE stock SET n = n - 1 WHERE sku = 'A'`,
		`DELETE FROM stock WHERE sku = 'A'`,
		`INSERT INTO stock VALUES ('A', 1, NULL) ON CONFLICT (sku) DO UPDATE SET n = excluded.n`,
	} {
		newer, err := b.Pool.Begin(b.Ctx)
		require.NoError(t, err)
		_, err = newer.Exec(b.Ctx, `SELECT fencelock.set_token(7); UPDATE stock SET n = n - 1 WHERE sku = 'A'`)
		require.NoError(t, err)
		older := make(chan error, 1)
		go func() {
			older <- pgx.BeginFunc(b.Ctx, conn, func(tx pgx.Tx) error {
				_, err := tx.Exec(b.Ctx, `SELECT fencelock.set_token(6)`)
				if err != nil {
					return err
				}
				_, err = tx.Exec(b.Ctx, stmt)
				return err
			})
		}()
		waitFor(t, b, "the older writer waiting for the row", func() bool {
			var n int
			require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()`).Scan(&n))
			return n == 1
		})
		require.NoError(t, newer.Commit(b.Ctx))
		select {
		case err := <-older:
			require.Equal(t, "FL004", sqlState(err), "%s: %v", stmt, err)
		case <-time.After(10 * time.Second):
			t.Fatal("older writer still blocked")
		}
		_, err = b.Pool.Exec(b.Ctx, `BEGIN; SET LOCAL session_replication_role = replica; UPDATE stock SET fence_token = 5; COMMIT`)
		require.NoError(t, err)
	}
}
