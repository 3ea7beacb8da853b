package fencelock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
	"github.com/fencelock/fencelock/job"
	"github.com/fencelock/fencelock/ratelimit"
)

// leastPrivilegeGrants are the grants README.md ("Least privilege") and Migrate's doc comment
// give the application's runtime role, %[1]s, on a database, %[2]s, whose PUBLIC may not
// connect.
const leastPrivilegeGrants = `GRANT CONNECT ON DATABASE %[2]s TO %[1]s;
	GRANT USAGE ON SCHEMA fencelock TO %[1]s;
	GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA fencelock TO %[1]s;
	GRANT USAGE ON ALL SEQUENCES IN SCHEMA fencelock TO %[1]s`

// newLeastPrivilegeRole creates a LOGIN role with a password and exactly leastPrivilegeGrants on
// b's database (and SELECT, UPDATE on the application table accounts, which the owner creates),
// and returns its name and a pool of connections as that role. Roles are cluster-wide: the role
// is dropped at test cleanup, after its pool is closed, by DROP OWNED (its privileges, on the
// database too) and DROP ROLE.
func newLeastPrivilegeRole(t *testing.T, b *bundle) (string, *pgxpool.Pool) {
	t.Helper()
	role, pool := testkit.NewRole(t, b.Ctx, b.Pool, b.DB.URL, `REVOKE CONNECT, TEMPORARY ON DATABASE %[2]s FROM PUBLIC;
		CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL, fence_token bigint);
		INSERT INTO accounts VALUES (1, 100, NULL);
		GRANT SELECT, UPDATE ON accounts TO %[1]s;
		`+leastPrivilegeGrants)

	var user string
	var super, createDB, createSchema, ownsSchema bool
	require.NoError(t, pool.QueryRow(b.Ctx, `SELECT current_user, r.rolsuper,
			has_database_privilege(current_database(), 'CREATE'),
			has_schema_privilege('fencelock', 'CREATE'),
			pg_has_role((SELECT nspowner FROM pg_namespace WHERE nspname = 'fencelock'), 'USAGE')
		FROM pg_roles AS r WHERE r.rolname = current_user`).Scan(&user, &super, &createDB, &createSchema, &ownsSchema))
	require.Equal(t, role, user)
	require.False(t, super || createDB || createSchema || ownsSchema, "the role has DDL privileges")
	return role, pool
}

// requirePermissionDenied fails the test unless err wraps Postgres's insufficient_privilege
// (42501) and its message contains want.
func requirePermissionDenied(t *testing.T, err error, want string) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "42501", pgErr.Code, "%v", err)
	require.ErrorContains(t, err, want)
}

// An application role with only the grants that README.md documents ("Least privilege": USAGE
// on schema fencelock, DML on its tables, USAGE on its sequences, CONNECT on the database) does
// everything but apply migrations: a Migrate with nothing pending (before Migrate checked for
// pending migrations first, it failed here: "create schema: permission denied for database"),
// leases with a queued waiter and the hand-off, GuardTx, FenceTx, UpdateFencedTx, RunLocked,
// advisory locks with fencing tokens (session and transaction), the views, force_release,
// SweepLeases and RebaseTokenEpoch. Migrate with a migration pending fails with a permission
// error that says what to do, as does a Migrate by a role that cannot read the version table,
// and one on a database without schema fencelock.
func TestLeastPrivilege(t *testing.T) {
	t.Parallel()
	b := setup(t)
	role, app := newLeastPrivilegeRole(t, b)
	ctx := b.Ctx

	require.NoError(t, fencelock.Migrate(ctx, app), "nothing pending")

	// A lease, a queued waiter, the hand-off.
	la, lb := newLessor(t, app, "a"), newLessor(t, app, "b")
	held, err := la.TryAcquire(ctx, "account:1", 10*time.Second)
	require.NoError(t, err)
	waiter := fencetest.AcquireAsync(ctx, lb, "account:1", 10*time.Second)
	awaitQueue(t, ctx, app, "account:1", false, "b")
	var holder string
	var waiters int64
	require.NoError(t, app.QueryRow(ctx, `SELECT holder, waiters FROM fencelock.holders WHERE name = 'account:1'`).Scan(&holder, &waiters))
	require.Equal(t, "a", holder)
	require.EqualValues(t, 1, waiters)
	var summary int64
	require.NoError(t, app.QueryRow(ctx, `SELECT waiters FROM fencelock.lease_queue_summary WHERE name = 'account:1'`).Scan(&summary))
	require.EqualValues(t, 1, summary)
	require.NoError(t, held.Release(ctx))
	got := <-waiter
	require.NoError(t, got.Err)
	lease := got.Lease
	require.Greater(t, lease.Token(), held.Token(), "handed over with a larger token")

	// GuardTx, Lease.FenceTx, FenceTx and UpdateFencedTx in one transaction of the role.
	require.NoError(t, pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error {
		if err := lease.GuardTx(ctx, tx); err != nil {
			return err
		}
		if err := lease.FenceTx(ctx, tx, "account:1"); err != nil {
			return err
		}
		if err := fencelock.FenceTx(ctx, tx, "ledger", lease.Token()); err != nil {
			return err
		}
		n, err := fencelock.UpdateFencedTx(ctx, tx, pgx.Identifier{"accounts"}, "fence_token", lease.Token(),
			[]fencelock.Column{{Name: "balance", Value: 90}}, []fencelock.Column{{Name: "id", Value: 1}})
		if err == nil && n != 1 {
			err = fmt.Errorf("UpdateFencedTx updated %d rows", n)
		}
		return err
	}))
	err = pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error { return fencelock.FenceTx(ctx, tx, "ledger", held.Token()) })
	require.ErrorIs(t, err, fencelock.ErrStaleToken)
	require.NoError(t, lease.Release(ctx))

	// The SQL API (docs/SQL.md): a lease's life cycle, a fenced write, and a protected table
	// (the owner protects it; the role writes to it with its token).
	var sqlToken int64
	require.NoError(t, app.QueryRow(ctx, `SELECT fencelock.try_acquire('sql:1', 'py', interval '10 seconds')`).Scan(&sqlToken))
	require.Greater(t, sqlToken, int64(lease.Token()))
	_, err = b.Pool.Exec(ctx, `SELECT fencelock.protect_table('accounts')`)
	require.NoError(t, err)
	inTx := func(token int64, stmts ...string) error {
		return pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error {
			for _, stmt := range stmts {
				if _, err := tx.Exec(ctx, stmt, token); err != nil {
					return fencelock.WrapSQLError(err)
				}
			}
			return nil
		})
	}
	require.NoError(t, inTx(sqlToken,
		`SELECT fencelock.renew('sql:1', 'py', $1, interval '10 seconds')`,
		`SELECT fencelock.guard_lease('sql:1', 'py', $1)`,
		`SELECT fencelock.fence_lease('sql:1', 'py', $1, 'sql:1')`,
		`SELECT fencelock.fence('sql:ledger', $1)`,
		`SELECT fencelock.set_token($1)`,
		`UPDATE accounts SET balance = balance - 1 WHERE id = 1 AND $1::bigint > 0`))
	err = inTx(int64(lease.Token()), `SELECT fencelock.set_token($1)`, `UPDATE accounts SET balance = 0 WHERE id = 1 AND $1::bigint > 0`)
	require.ErrorIs(t, err, fencelock.ErrStaleToken, "the role's stale write to the protected table")
	var released bool
	require.NoError(t, app.QueryRow(ctx, `SELECT fencelock.release('sql:1', 'py', $1)`, sqlToken).Scan(&released))
	require.True(t, released)
	_, err = b.Pool.Exec(ctx, `SELECT fencelock.unprotect_table('accounts')`)
	require.NoError(t, err)

	// RunLocked: a transaction-scoped grant.
	require.NoError(t, la.RunLocked(ctx, "account:1", func(ctx context.Context, tx pgx.Tx, token fencelock.Token) error {
		if token <= lease.Token() {
			return fmt.Errorf("RunLocked token %d not above %d", token, lease.Token())
		}
		return fencelock.FenceTx(ctx, tx, "account:1", token)
	}))

	// Advisory locks with fencing tokens: a session lock, labelled by its watchdog's first probe
	// and then seen by name in fencelock.advisory_locks, and a transaction lock.
	a, err := fencelock.NewAdvisoryLocker(app, fencelock.WithFencingTokens(), fencelock.WithWatchdogInterval(time.Second))
	require.NoError(t, err)
	lk, err := a.TryLock(ctx, "nightly-report")
	require.NoError(t, err)
	t.Cleanup(func() { _ = lk.Unlock(context.Background()) }) // a failed assertion must not leave app's Close waiting
	require.Positive(t, lk.Token())
	var names []string
	waitFor(t, b, "the lock's label in fencelock.advisory_locks", func() bool {
		rows, err := app.Query(ctx, `SELECT name FROM fencelock.advisory_locks WHERE granted AND name IS NOT NULL`)
		require.NoError(t, err)
		names, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return len(names) > 0
	})
	require.Equal(t, []string{"nightly-report"}, names)
	require.NoError(t, pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error { return fencelock.FenceTx(ctx, tx, "report", lk.Token()) }))
	require.NoError(t, lk.Unlock(ctx))
	require.NoError(t, pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error {
		token, err := a.TryLockTx(ctx, tx, "nightly-report")
		if err != nil {
			return err
		}
		if token <= lk.Token() {
			return fmt.Errorf("TryLockTx token %d not above %d", token, lk.Token())
		}
		return nil
	}))

	// The operator's force release (fencelock release --force) and the retention sweep.
	again, err := la.TryAcquire(ctx, "account:1", 10*time.Second)
	require.NoError(t, err)
	var oldHolder string
	var newToken int64
	require.NoError(t, app.QueryRow(ctx, `SELECT old_holder, new_token FROM fencelock.force_release('account:1', ARRAY['account:1'])`).Scan(&oldHolder, &newToken))
	require.Equal(t, "a", oldHolder)
	require.Greater(t, newToken, int64(again.Token()))
	require.Error(t, again.Renew(ctx), "the forced release ended the grant")
	_, err = fencelock.SweepLeases(ctx, app, fencelock.DefaultSweepGrace)
	require.NoError(t, err)
	// Elections and jobs (migrations 00006, 00007): campaign, proclaim, read, resign; a job's
	// slot claimed, run and recorded, and its ledger read.
	el, err := fencelock.NewElection(la, "election/app", 10*time.Second)
	require.NoError(t, err)
	term, err := el.Campaign(ctx, "10.0.0.1")
	require.NoError(t, err)
	leader, err := el.Leader(ctx)
	require.NoError(t, err)
	require.Equal(t, "10.0.0.1", leader.Value)
	require.NoError(t, term.Resign(ctx))
	j, err := job.New(la, "job/app", 10*time.Second)
	require.NoError(t, err)
	slot := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
	require.NoError(t, j.RunSlot(ctx, slot, func(context.Context, *job.Run) error { return nil }))
	var outcome string
	require.NoError(t, app.QueryRow(ctx, `SELECT outcome FROM fencelock.job_ledger WHERE job = 'job/app'`).Scan(&outcome))
	require.Equal(t, "succeeded", outcome)
	// Semaphores, rate limits and multi-locks (migrations 00008-00010): a permit, a waiter
	// queued and woken by the release, the limit changed and read; a rate-limited key and the
	// sweep of idle keys; a set of leases all or nothing.
	sem, err := fencelock.NewSemaphore(la, "sem/app", 1)
	require.NoError(t, err)
	permit, err := sem.TryAcquire(ctx, 10*time.Second)
	require.NoError(t, err)
	semB, err := fencelock.NewSemaphore(lb, "sem/app", 1)
	require.NoError(t, err)
	permitB := fencetest.PermitAsync(ctx, semB, 10*time.Second)
	require.Eventually(t, func() bool { st, err := sem.State(ctx); return err == nil && st.Waiting == 1 }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, permit.Release(ctx))
	gotB := fencetest.Receive(t, permitB, 10*time.Second)
	require.NoError(t, gotB.Err)
	require.NoError(t, gotB.Lease.Release(ctx))
	_, err = sem.SetLimit(ctx, 3)
	require.NoError(t, err)
	rl, err := ratelimit.New(app, ratelimit.PerSecond(10))
	require.NoError(t, err)
	res, err := rl.Allow(ctx, "rate/app")
	require.NoError(t, err)
	require.Equal(t, 1, res.Allowed)
	_, err = ratelimit.Sweep(ctx, app, 0)
	require.NoError(t, err)
	set, err := la.TryAcquireAll(ctx, []string{"multi/app/1", "multi/app/2"}, 10*time.Second)
	require.NoError(t, err)
	require.NoError(t, set.Release(ctx))
	_, err = fencelock.SweepLeases(ctx, app, fencelock.DefaultSweepGrace)
	require.NoError(t, err)

	// After a logical copy the runtime role could rebase the epoch itself (UPDATE and INSERT
	// on fencelock.token_epoch); it never lowers the epoch, so this changes nothing here.
	epoch, err := fencelock.RebaseTokenEpoch(ctx, app, 0)
	require.NoError(t, err)
	require.Positive(t, epoch)

	// A migration pending: the role may not apply it, and says so. The owner takes the version
	// row of the last migration away (and puts it back after): the role's Migrate takes the lock
	// and runs that migration, whose first statement (DDL on fencelock's tables) fails; the
	// migration's transaction rolls back and no version is recorded.
	var last int64
	require.NoError(t, b.Pool.QueryRow(ctx, `DELETE FROM fencelock.goose_db_version
		WHERE version_id = (SELECT max(version_id) FROM fencelock.goose_db_version) RETURNING version_id`).Scan(&last))
	err = fencelock.Migrate(ctx, app)
	requirePermissionDenied(t, err, "run Migrate as the owner of schema fencelock")
	var recorded int64
	require.NoError(t, b.Pool.QueryRow(ctx, `SELECT count(*) FROM fencelock.goose_db_version WHERE version_id = $1`, last).Scan(&recorded))
	require.Zero(t, recorded)
	_, err = b.Pool.Exec(ctx, `INSERT INTO fencelock.goose_db_version (version_id, is_applied) VALUES ($1, true)`, last)
	require.NoError(t, err)
	requireEachVersionOnce(t, b)

	// A role that cannot read the version table is told which grant it lacks, before any DDL.
	_, err = b.Pool.Exec(ctx, `REVOKE SELECT ON fencelock.goose_db_version FROM `+pgx.Identifier{role}.Sanitize())
	require.NoError(t, err)
	err = fencelock.Migrate(ctx, app)
	requirePermissionDenied(t, err, "SELECT on fencelock.goose_db_version")

	// A database without schema fencelock: the role may not create it.
	_, err = b.Pool.Exec(ctx, `DROP SCHEMA fencelock CASCADE`)
	require.NoError(t, err)
	err = fencelock.Migrate(ctx, app)
	requirePermissionDenied(t, err, "may not create schema fencelock")
}
