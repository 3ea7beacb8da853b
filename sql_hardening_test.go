package fencelock_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
)

// Issue 38: fencelock's SQL as a well-kept extension's (docs/SECURITY.md, migration 00017).

// TestPlantedOperatorNeverCalled is the attack of issue 38: a role with nothing but CREATE on
// schema public plants public.*(bigint, interval), an exact match where pg_catalog has only
// *(double precision, interval), which makes its caller's role a superuser's accomplice
// (ALTER ROLE ... SUPERUSER when the caller is one). A superuser with the default search_path
// then takes, renews and releases leases through the SQL API and the Go lessor, sweeps, fences
// and writes a protected table: the planted operator is never called. The last step runs a
// statement of the test's own that multiplies a bigint by an interval, to show the plant works
// (without it, the test could pass with a plant that never resolves).
func TestPlantedOperatorNeverCalled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.Ctx
	attacker, attackerPool := testkit.NewRole(t, ctx, b.Pool, b.DB.URL, `GRANT CREATE, USAGE ON SCHEMA public TO %[1]s`)
	_, err := attackerPool.Exec(ctx, fmt.Sprintf(`
		CREATE TABLE public.planted_calls (caller text, at timestamptz DEFAULT clock_timestamp());
		GRANT INSERT ON public.planted_calls TO PUBLIC;
		CREATE FUNCTION public.planted_mul(bigint, interval) RETURNS interval LANGUAGE plpgsql AS $f$
		BEGIN
			INSERT INTO public.planted_calls (caller) VALUES (current_user);
			IF (SELECT r.rolsuper FROM pg_catalog.pg_roles AS r WHERE r.rolname = current_user) THEN
				EXECUTE 'ALTER ROLE %s SUPERUSER';
			END IF;
			RETURN $1::float8 * $2;
		END $f$;
		CREATE OPERATOR public.* (LEFTARG = bigint, RIGHTARG = interval, FUNCTION = public.planted_mul);`,
		pgx.Identifier{attacker}.Sanitize()))
	require.NoError(t, err)

	su := plainConn(t, b) // the test server's superuser, search_path "$user", public
	var isSuper bool
	require.NoError(t, su.QueryRow(ctx, `SELECT rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&isSuper))
	require.True(t, isSuper, "the victim must be a superuser for the attack to mean anything")
	calls := func() int {
		var n int
		require.NoError(t, su.QueryRow(ctx, `SELECT count(*) FROM public.planted_calls`).Scan(&n))
		return n
	}

	var token int64
	require.NoError(t, su.QueryRow(ctx, `SELECT fencelock.try_acquire('acct:1', 'psql', '10 seconds')`).Scan(&token))
	for _, stmt := range []string{
		`SELECT fencelock.renew('acct:1', 'psql', $1, '10 seconds')`,
		`SELECT fencelock.fence_lease('acct:1', 'psql', $1, 'acct:1')`,
		`SELECT fencelock.release('acct:1', 'psql', $1)`,
	} {
		_, err := su.Exec(ctx, stmt, token)
		require.NoError(t, err, stmt)
	}
	lessor := newLessor(t, b.Pool, "go")
	lease, err := lessor.TryAcquire(ctx, "acct:2", 10*time.Second)
	require.NoError(t, err)
	require.NoError(t, lease.Renew(ctx))
	require.NoError(t, pgx.BeginFunc(ctx, b.Pool, func(tx pgx.Tx) error { return lease.FenceTx(ctx, tx, "acct:2") }))
	require.NoError(t, lease.Release(ctx))
	_, err = fencelock.SweepLeases(ctx, b.Pool, time.Minute)
	require.NoError(t, err)
	require.Zero(t, calls(), "the planted operator ran inside fencelock's SQL")

	_, err = su.Exec(ctx, `SELECT 1::bigint * interval '1 second'`)
	require.NoError(t, err)
	require.Equal(t, 1, calls(), "control: the plant resolves for a statement that needs it")
}

// TestEveryFunctionPinsSearchPath: every function of schema fencelock runs with search_path
// pg_catalog, fencelock, pg_temp (migration 00017), so a later migration that replaces one
// without the SET clause fails here; only fencelock.issued_bound runs as its owner.
func TestEveryFunctionPinsSearchPath(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var unpinned, definers []string
	n := 0
	rows, err := b.Pool.Query(b.Ctx, `
		SELECT p.oid::regprocedure::text, coalesce(p.proconfig, '{}'), p.prosecdef
		FROM pg_proc AS p WHERE p.pronamespace = 'fencelock'::regnamespace ORDER BY 1`)
	require.NoError(t, err)
	for rows.Next() {
		var fn string
		var config []string
		var definer bool
		require.NoError(t, rows.Scan(&fn, &config, &definer))
		n++
		if len(config) != 1 || config[0] != "search_path=pg_catalog, fencelock, pg_temp" {
			unpinned = append(unpinned, fmt.Sprintf("%s %v", fn, config))
		}
		if definer {
			definers = append(definers, fn)
		}
	}
	require.NoError(t, rows.Err())
	require.Greater(t, n, 30)
	require.Empty(t, unpinned, "functions without the pinned search_path")
	require.Equal(t, []string{"fencelock.issued_bound()"}, definers)
}

// TestPinnedSearchPathKeepsLocalSettings: a function's SET clause restores search_path at its
// exit, and only that: the synchronous_commit that fence, a grant (next_token) and the trigger
// raise for the transaction, and set_token's fencelock.token, outlive the call, and end with the
// transaction.
func TestPinnedSearchPathKeepsLocalSettings(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn := plainConn(t, b)
	_, err := conn.Exec(b.Ctx, `CREATE TABLE stock (sku text PRIMARY KEY, fence_token bigint);
		SELECT fencelock.protect_table('stock'); SET synchronous_commit = off`)
	require.NoError(t, err)
	lease, err := newLessor(t, b.Pool, "h").TryAcquire(b.Ctx, "r", time.Minute)
	require.NoError(t, err)
	tok := int64(lease.Token())
	for _, c := range []struct {
		name, stmt, setting, want string
	}{
		{"Fence", `SELECT fencelock.fence('r', $1)`, "synchronous_commit", "on"},
		{"TryAcquire", `SELECT fencelock.try_acquire('s' || $1::bigint::text, 'h', '1 minute')`, "synchronous_commit", "on"},
		{"Trigger", `INSERT INTO stock VALUES ('a' || $1::bigint::text, $1::bigint)`, "synchronous_commit", "on"},
		{"SetToken", `SELECT fencelock.set_token($1)`, "fencelock.token", fmt.Sprint(tok)},
	} {
		t.Run(c.name, func(t *testing.T) {
			tx, err := conn.Begin(b.Ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(b.Ctx) }()
			_, err = tx.Exec(b.Ctx, c.stmt, tok)
			require.NoError(t, err)
			var got, path string
			require.NoError(t, tx.QueryRow(b.Ctx, `SELECT current_setting($1, true), current_setting('search_path')`, c.setting).Scan(&got, &path))
			require.Equal(t, c.want, got)
			require.Equal(t, `"$user", public`, path, "the caller's search_path is back")
			require.NoError(t, tx.Commit(b.Ctx))
			require.NoError(t, conn.QueryRow(b.Ctx, `SELECT coalesce(current_setting($1, true), '')`, c.setting).Scan(&got))
			require.NotEqual(t, c.want, got, "the setting ended with the transaction")
		})
	}
}

// TestProtectTableProtectsInheritanceChildren: PostgreSQL fires the row triggers of the table
// that stores a row, so protect_table attaches the trigger to every inheritance child too
// (grandchildren included); before migration 00017, writes through the parent to a child's
// rows committed unchecked. unprotect_table removes every trigger protect_table attached. A
// child created later is protected when protect_table runs again.
func TestProtectTableProtectsInheritanceChildren(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn := plainConn(t, b)
	_, err := conn.Exec(b.Ctx, `
		CREATE TABLE orders (id int, n int, fence_token bigint);
		CREATE TABLE orders_2025 () INHERITS (orders);
		CREATE TABLE orders_2025_q1 () INHERITS (orders_2025);
		SET session_replication_role = replica;
		INSERT INTO orders VALUES (1, 0, 9);
		INSERT INTO orders_2025 VALUES (2, 0, 9);
		INSERT INTO orders_2025_q1 VALUES (3, 0, 9);
		SET session_replication_role = origin;
		SELECT fencelock.protect_table('orders');`)
	require.NoError(t, err)
	for _, id := range []int{1, 2, 3} {
		for _, step := range []struct {
			desc  string
			token int64
			stmt  string
			code  string
		}{
			{"StaleThroughParent", 5, `UPDATE orders SET n = n + 1 WHERE id = $1`, "FL004"},
			{"NoTokenThroughParent", 0, `UPDATE orders SET n = n + 1 WHERE id = $1`, "FL006"},
			{"DeleteNoTokenThroughParent", 0, `DELETE FROM orders WHERE id = $1`, "FL006"},
			{"DeleteStaleThroughParent", 5, `DELETE FROM orders WHERE id = $1`, "FL004"},
			{"CurrentThroughParent", 9, `UPDATE orders SET n = n + 1 WHERE id = $1`, ""},
		} {
			_, err := writeWith(t, b.Ctx, conn, step.token, step.stmt, id)
			require.Equal(t, step.code, sqlState(err), "row %d: %s: %v", id, step.desc, err)
		}
	}
	var n int
	require.NoError(t, conn.QueryRow(b.Ctx, `SELECT sum(n) FROM orders`).Scan(&n))
	require.Equal(t, 3, n, "only the current token's writes landed")

	// A child created later is not protected until protect_table runs again.
	_, err = conn.Exec(b.Ctx, `CREATE TABLE orders_2026 () INHERITS (orders)`)
	require.NoError(t, err)
	triggers := func() int {
		require.NoError(t, conn.QueryRow(b.Ctx, `SELECT count(*) FROM pg_trigger
			WHERE tgname = 'fencelock_refuse_stale_writes' AND tgrelid IN ('orders'::regclass, 'orders_2025'::regclass,
				'orders_2025_q1'::regclass, 'orders_2026'::regclass)`).Scan(&n))
		return n
	}
	require.Equal(t, 3, triggers())
	_, err = conn.Exec(b.Ctx, `SELECT fencelock.protect_table('orders')`)
	require.NoError(t, err)
	require.Equal(t, 4, triggers())
	_, err = writeWith(t, b.Ctx, conn, 0, `INSERT INTO orders_2026 VALUES (4, 0, NULL)`)
	require.Equal(t, "FL006", sqlState(err))

	_, err = conn.Exec(b.Ctx, `SELECT fencelock.unprotect_table('orders')`)
	require.NoError(t, err)
	require.Zero(t, triggers(), "unprotect_table removes what protect_table attached")

	// Partitions, attached before or after protect_table, carry PostgreSQL's clone of the
	// partitioned table's trigger; unprotect_table removes it with the parent's.
	_, err = conn.Exec(b.Ctx, `CREATE TABLE parts (id int, fence_token bigint) PARTITION BY LIST (id);
		CREATE TABLE parts_1 PARTITION OF parts FOR VALUES IN (1);
		SELECT fencelock.protect_table('parts');
		CREATE TABLE parts_2 PARTITION OF parts FOR VALUES IN (2)`)
	require.NoError(t, err)
	for _, id := range []int{1, 2} {
		_, err := writeWith(t, b.Ctx, conn, 0, `INSERT INTO parts VALUES ($1, NULL)`, id)
		require.Equal(t, "FL006", sqlState(err), "partition %d", id)
	}
	_, err = conn.Exec(b.Ctx, `SELECT fencelock.unprotect_table('parts')`)
	require.NoError(t, err)
	require.NoError(t, conn.QueryRow(b.Ctx, `SELECT count(*) FROM pg_trigger WHERE tgname = 'fencelock_refuse_stale_writes'`).Scan(&n))
	require.Zero(t, n)
}

// TestTokensNeverIssuedAreRefused: a token larger than every token the database has issued
// (fencelock.issued_bound) is refused with FL008 (ErrTokenNotIssued) by every path that takes
// a token from its caller, before anything is written; the largest issued token passes
// everywhere. Before migration 00017, each of these accepted 2^63-1 and then refused every
// legitimate holder with FL004 for ever.
func TestTokensNeverIssuedAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn := plainConn(t, b)
	_, err := conn.Exec(b.Ctx, `CREATE TABLE stock (sku text PRIMARY KEY, n int, fence_token bigint);
		CREATE TABLE fenced (sku text PRIMARY KEY, n int, fence_token bigint);
		SELECT fencelock.protect_table('stock');
		SELECT fencelock.protect_table('fenced', 'fence_token', 'res');
		SET session_replication_role = replica;
		INSERT INTO stock VALUES ('A', 0, 1); INSERT INTO fenced VALUES ('A', 0, 1);
		SET session_replication_role = origin`)
	require.NoError(t, err)
	lease, err := newLessor(t, b.Pool, "h").TryAcquire(b.Ctx, "res", time.Minute)
	require.NoError(t, err)
	issued := int64(lease.Token())
	var bound int64
	require.NoError(t, conn.QueryRow(b.Ctx, `SELECT fencelock.issued_bound()`).Scan(&bound))
	require.Equal(t, issued, bound, "the bound is the last token issued")
	var epoch int64
	require.NoError(t, conn.QueryRow(b.Ctx, `SELECT fencelock.timeline()`).Scan(&epoch))

	sqlPaths := []struct {
		desc string
		txn  []string // one transaction; $1 is the token
	}{
		{"Fence", []string{`SELECT fencelock.fence('res2', $1)`}},
		{"SetToken", []string{`SELECT fencelock.set_token($1)`}},
		{"TriggerColumnUpdate", []string{`UPDATE stock SET fence_token = $1 WHERE sku = 'A'`}},
		{"TriggerColumnInsert", []string{`INSERT INTO stock VALUES ('B', 0, $1)`}},
		{"TriggerSetting", []string{`SELECT set_config('fencelock.token', $1::bigint::text, true)`, `UPDATE stock SET n = 1 WHERE sku = 'A'`}},
		{"TriggerSettingDelete", []string{`SELECT set_config('fencelock.token', $1::bigint::text, true)`, `DELETE FROM stock WHERE sku = 'A'`}},
		{"TriggerWithResource", []string{`UPDATE fenced SET fence_token = $1 WHERE sku = 'A'`}},
	}
	run := func(token int64, txn []string) error {
		return pgx.BeginFunc(b.Ctx, conn, func(tx pgx.Tx) error {
			for _, s := range txn {
				var args []any
				if strings.Contains(s, "$1") {
					args = append(args, token)
				}
				if _, err := tx.Exec(b.Ctx, s, args...); err != nil {
					return err
				}
			}
			return errors.New("rolled back")
		})
	}
	goPaths := []struct {
		desc string
		run  func(token int64) error
	}{
		{"FenceTx", func(token int64) error {
			return pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error {
				if err := fencelock.FenceTx(b.Ctx, tx, "res3", fencelock.Token(token)); err != nil {
					return err
				}
				return errors.New("rolled back")
			})
		}},
		{"UpdateFencedTx", func(token int64) error {
			return pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error {
				if _, err := fencelock.UpdateFencedTx(b.Ctx, tx, pgx.Identifier{"stock"}, "fence_token", fencelock.Token(token),
					[]fencelock.Column{{Name: "n", Value: 2}}, []fencelock.Column{{Name: "sku", Value: "A"}}); err != nil {
					return err
				}
				return errors.New("rolled back")
			})
		}},
	}
	forged := []int64{math.MaxInt64, bound + 1, (epoch + 1) << 47}
	for _, tok := range forged {
		for _, p := range sqlPaths {
			err := run(tok, p.txn)
			require.Equal(t, "FL008", sqlState(err), "%s with %d: %v", p.desc, tok, err)
		}
		for _, p := range goPaths {
			err := p.run(tok)
			require.ErrorIs(t, err, fencelock.ErrTokenNotIssued, "%s with %d", p.desc, tok)
		}
	}
	for _, p := range sqlPaths {
		require.EqualError(t, run(issued, p.txn), "rolled back", "%s with the last issued token", p.desc)
	}
	for _, p := range goPaths {
		require.EqualError(t, p.run(issued), "rolled back", "%s with the last issued token", p.desc)
	}
	var fences int
	require.NoError(t, conn.QueryRow(b.Ctx, `SELECT count(*) FROM fencelock.fences`).Scan(&fences))
	require.Zero(t, fences, "nothing was written")

	// A legitimate holder after an epoch rebase: its old token and the new one both pass.
	_, err = fencelock.RebaseTokenEpoch(b.Ctx, b.Pool, 0)
	require.NoError(t, err)
	lease2, err := newLessor(t, b.Pool, "h2").TryAcquire(b.Ctx, "other", time.Minute)
	require.NoError(t, err)
	require.Greater(t, int64(lease2.Token())>>47, issued>>47, "the new token is of a later epoch")
	for _, tok := range []int64{issued, int64(lease2.Token())} {
		for _, p := range sqlPaths {
			require.EqualError(t, run(tok, p.txn), "rolled back", "%s with %d after a rebase", p.desc, tok)
		}
	}
}

// TestNeverIssuedHighWaterMarkIsReplaced: a fence row, or a protected row, that holds a token
// never issued (written before migration 00017, which accepted one) does not refuse the
// legitimate holder: its token replaces the made-up one, through the SQL fence, FenceTx,
// Lease.FenceTx, UpdateFencedTx and the trigger.
func TestNeverIssuedHighWaterMarkIsReplaced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn := plainConn(t, b)
	_, err := conn.Exec(b.Ctx, `CREATE TABLE stock (sku text PRIMARY KEY, n int, fence_token bigint);
		SELECT fencelock.protect_table('stock');
		SET session_replication_role = replica;
		INSERT INTO stock VALUES ('A', 0, 9223372036854775807), ('B', 0, 9223372036854775807);
		SET session_replication_role = origin;
		INSERT INTO fencelock.fences VALUES ('f1', 9223372036854775807), ('f2', 9223372036854775807), ('f3', 9223372036854775807)`)
	require.NoError(t, err)
	lease, err := newLessor(t, b.Pool, "h").TryAcquire(b.Ctx, "f3", time.Minute)
	require.NoError(t, err)
	tok := lease.Token()
	_, err = conn.Exec(b.Ctx, `SELECT fencelock.fence('f1', $1)`, int64(tok))
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error {
		if err := fencelock.FenceTx(b.Ctx, tx, "f2", tok); err != nil {
			return err
		}
		if err := lease.FenceTx(b.Ctx, tx, "f3"); err != nil {
			return err
		}
		_, err := fencelock.UpdateFencedTx(b.Ctx, tx, pgx.Identifier{"stock"}, "fence_token", tok,
			[]fencelock.Column{{Name: "n", Value: 1}}, []fencelock.Column{{Name: "sku", Value: "A"}})
		return err
	}))
	_, err = writeWith(t, b.Ctx, conn, int64(tok), `UPDATE stock SET n = 1 WHERE sku = 'B'`)
	require.NoError(t, err)
	var fences, rows int
	require.NoError(t, conn.QueryRow(b.Ctx, `SELECT count(*) FILTER (WHERE token = $1) FROM fencelock.fences`, int64(tok)).Scan(&fences))
	require.NoError(t, conn.QueryRow(b.Ctx, `SELECT count(*) FILTER (WHERE fence_token = $1 AND n = 1) FROM stock`, int64(tok)).Scan(&rows))
	require.Equal(t, 3, fences)
	require.Equal(t, 2, rows)

	// A made-up token below a made-up high-water mark is refused all the same.
	_, err = conn.Exec(b.Ctx, `SET session_replication_role = replica;
		INSERT INTO stock VALUES ('C', 0, 9223372036854775807);
		SET session_replication_role = origin`)
	require.NoError(t, err)
	_, err = conn.Exec(b.Ctx, `BEGIN; SET LOCAL fencelock.token = '9223372036854775806';
		UPDATE stock SET n = 1 WHERE sku = 'C'; COMMIT`)
	require.Equal(t, "FL008", sqlState(err))
	_, err = conn.Exec(b.Ctx, `ROLLBACK`)
	require.NoError(t, err)
	_, err = conn.Exec(b.Ctx, `SELECT fencelock.fence('f1', 9223372036854775806)`)
	require.Equal(t, "FL008", sqlState(err))
}

// TestProtectedTableWriterPrivileges: what a writer of a protected table needs, and what the
// runtime role cannot do to a table it does not own (docs/SECURITY.md). A writer with nothing
// but UPDATE on the table is refused as before when it passes no token (FL006) or a stale one
// (FL004); one that passes a token larger than the row's needs USAGE on schema fencelock, for
// the trigger's check that the token was issued (migration 00017), and is refused without it
// (42501). The runtime role (README's grants) can neither unprotect the table nor replace its
// trigger.
func TestProtectedTableWriterPrivileges(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.Ctx
	_, err := b.Pool.Exec(ctx, `CREATE TABLE public.stock (sku text PRIMARY KEY, n int, fence_token bigint);
		SELECT fencelock.protect_table('public.stock');
		SET session_replication_role = replica;
		INSERT INTO public.stock VALUES ('A', 0, 5);
		SET session_replication_role = origin`)
	require.NoError(t, err)
	_, writer := testkit.NewRole(t, ctx, b.Pool, b.DB.URL, `GRANT SELECT, UPDATE ON public.stock TO %[1]s`)
	lease, err := newLessor(t, b.Pool, "h").TryAcquire(ctx, "stock", time.Minute)
	require.NoError(t, err)
	write := func(token int64) error {
		return pgx.BeginFunc(ctx, writer, func(tx pgx.Tx) error {
			if token != 0 {
				if _, err := tx.Exec(ctx, `SELECT set_config('fencelock.token', $1::bigint::text, true)`, token); err != nil {
					return err
				}
			}
			_, err := tx.Exec(ctx, `UPDATE public.stock SET n = n + 1 WHERE sku = 'A'`)
			return err
		})
	}
	require.Equal(t, "FL006", sqlState(write(0)))
	require.Equal(t, "FL004", sqlState(write(4)))
	require.NoError(t, write(5), "the row's own token needs no check")
	require.Equal(t, "42501", sqlState(write(int64(lease.Token()))), "a newer token needs USAGE on schema fencelock")
	_, err = b.Pool.Exec(ctx, `GRANT USAGE ON SCHEMA fencelock TO `+roleOf(t, writer))
	require.NoError(t, err)
	require.NoError(t, write(int64(lease.Token())))
	require.Equal(t, "FL008", sqlState(write(math.MaxInt64)))

	_, app := testkit.NewRole(t, ctx, b.Pool, b.DB.URL, `GRANT USAGE ON SCHEMA fencelock TO %[1]s;
		GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA fencelock TO %[1]s;
		GRANT USAGE ON ALL SEQUENCES IN SCHEMA fencelock TO %[1]s;
		GRANT SELECT, UPDATE ON public.stock TO %[1]s`)
	for _, stmt := range []string{
		`SELECT fencelock.unprotect_table('public.stock')`,
		`SELECT fencelock.protect_table('public.stock', 'fence_token')`,
		`ALTER TABLE public.stock DISABLE TRIGGER fencelock_refuse_stale_writes`,
	} {
		_, err := app.Exec(ctx, stmt)
		require.Equal(t, "42501", sqlState(err), stmt)
	}
}

// roleOf returns the quoted name of the role pool connects as.
func roleOf(t *testing.T, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) string {
	t.Helper()
	var role string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT current_user`).Scan(&role))
	return pgx.Identifier{role}.Sanitize()
}
