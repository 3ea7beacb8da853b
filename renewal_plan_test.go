package fencelock_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/db"
	"github.com/fencelock/fencelock/internal/testkit"
)

// Renewal costs O(batch), not O(table): a statement of 500 leases, in a table of 20,000 of the
// same holder, looks each one up by its key; no plan node handles more than a few rows per
// lease of the batch, in either branch (one lease's row is locked by a guard-like transaction,
// so the statement also reports the current leases). The heartbeat sends cohorts of a large
// lessor as many statements of up to 1,000 leases; a hash join over a scan of the whole table
// made each of them cost the table (75 to 89 us a lease at 100,000 held, against 20 to 36 at
// 10,000), and a cohort of n leases O(n^2 / 1,000).
func TestRenewalPlanScalesWithBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const table, n = 20_000, 500
	names, tokens, ttls := seedLeases(t, b, table, n)
	_, err := b.Pool.Exec(b.Ctx, `ANALYZE fencelock.leases`)
	require.NoError(t, err)
	guard, err := b.Pool.Begin(b.Ctx)
	require.NoError(t, err)
	defer func() { _ = guard.Rollback(b.Ctx) }()
	_, err = guard.Exec(b.Ctx, `SELECT 1 FROM fencelock.leases WHERE name = $1 FOR SHARE`, names[0])
	require.NoError(t, err)

	// Several times on one session: pgx prepares the statement, and the server may switch to
	// a generic plan after five executions.
	conn, _ := testkit.Conn(t, b.Ctx, b.Pool)
	for run := range 7 {
		var plan []map[string]any
		err = conn.QueryRow(b.Ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+db.Statement("LeaseRenew"), names, tokens, ttls, "h").Scan(&plan)
		require.NoError(t, err)
		worst, where := testkit.BusiestPlanNode(plan)
		require.LessOrEqual(t, worst, 3.0*n, "run %d: plan node %s handles %.0f rows for %d leases in a table of %d\n%s", run, where, worst, n, table, mustJSON(plan))
	}
}
