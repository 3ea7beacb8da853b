package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/pgtest"
)

// rebaseSlot is the physical replication slot the standby of TestRebaseTokenEpochWaitsForSlot
// streams through.
const rebaseSlot = "rebase_standby"

// streamThroughSlot creates the physical replication slot name on primary (reserving WAL at
// once, so that it has a position) and makes standby stream through it (primary_slot_name,
// reloaded: its WAL receiver reconnects), and returns once the primary shows the slot active
// with a restart_lsn at or past everything committed on the primary so far.
func streamThroughSlot(t *testing.T, ctx context.Context, primary *pgtest.Server, pool *pgxpool.Pool, standby *pgtest.Server, name string) {
	t.Helper()
	_, err := pool.Exec(ctx, `SELECT pg_create_physical_replication_slot($1, true)`, name)
	require.NoError(t, err)
	sp := newPool(t, ctx, standby.URL("postgres"))
	_, err = sp.Exec(ctx, `ALTER SYSTEM SET primary_slot_name = '`+name+`'`)
	require.NoError(t, err)
	_, err = sp.Exec(ctx, `SELECT pg_reload_conf()`)
	require.NoError(t, err)
	awaitSlotActive(t, ctx, pool, name)
	// WaitReplay commits a transaction and waits for the standby to replay it; the standby's
	// WAL receiver reports its flush position as soon as it has flushed what it received,
	// which moves the slot's restart_lsn.
	require.NoError(t, primary.WaitReplay(ctx, standby))
	var target string
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_current_wal_flush_lsn()::text`).Scan(&target))
	require.Eventually(t, func() bool {
		var passed bool
		return pool.QueryRow(ctx, `SELECT restart_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`,
			name, target).Scan(&passed) == nil && passed
	}, 30*time.Second, 5*time.Millisecond, "slot %s reaches %s", name, target)
}

// awaitSlotActive returns once pool's server shows slot name active: a WAL sender streams
// from it.
func awaitSlotActive(t *testing.T, ctx context.Context, pool *pgxpool.Pool, name string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var active bool
		return pool.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, name).Scan(&active) == nil && active
	}, 30*time.Second, 5*time.Millisecond, "the standby streams through slot %s", name)
}

// awaitSlotInactive returns once pool's server shows slot name inactive and no WAL sender:
// the primary has seen its standby's connection end.
func awaitSlotInactive(t *testing.T, ctx context.Context, pool *pgxpool.Pool, name string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var gone bool
		return pool.QueryRow(ctx, `SELECT NOT s.active AND NOT EXISTS (SELECT FROM pg_stat_replication)
			FROM pg_replication_slots AS s WHERE s.slot_name = $1`, name).Scan(&gone) == nil && gone
	}, 30*time.Second, 5*time.Millisecond, "the primary sees the standby of slot %s gone", name)
}

// A standby that streams through a physical replication slot is crashed: the primary keeps
// its slot, whose restart_lsn is where the standby will resume. A rebase committed now is not
// on that standby, and a promotion of it would lose the rebase: RebaseTokenEpoch waits for the
// slot until its ctx ends and returns an error naming the slot, its position behind the
// rebase's (before issue 39 it returned success within 40 ms: the standby was not connected).
// Its ctx is cancelled once it is seen waiting (rebaseUntilWaiting).
// Then:
//   - with the slot left out (ExceptSlot), the call returns success without waiting;
//   - the standby started again resumes from its slot, and the call returns success once the
//     standby has the rebase: its offset is the new one when the call returns;
//   - with the standby crashed again, dropping the slot ends the wait for it.
//
// Before the crash, the call with the standby connected through the slot returns success,
// like one without a slot.
func TestRebaseTokenEpochWaitsForSlot(t *testing.T) {
	t.Parallel()
	ctx := testkit.Context(t)
	primary, db, standby := rebaseStandbyPair(t, ctx)
	streamThroughSlot(t, ctx, primary, db.Pool, standby, rebaseSlot)
	standbyPool := newPool(t, ctx, standby.URL(db.Name))

	epoch, err := fencelock.RebaseTokenEpoch(ctx, db.Pool, 5)
	require.NoError(t, err, "a standby connected through its slot")
	require.EqualValues(t, 5, epoch)
	require.EqualValues(t, 4, epochOffset(t, ctx, standbyPool), "replayed when the call returns")

	require.NoError(t, standby.Crash(ctx))
	awaitSlotInactive(t, ctx, db.Pool, rebaseSlot)

	epoch, elapsed, err := rebaseUntilWaiting(t, ctx, db.Pool, db.URL, 10)
	require.ErrorIs(t, err, fencelock.ErrRebaseNotReplayed)
	require.ErrorIs(t, err, context.Canceled)
	require.EqualValues(t, 10, epoch, "the committed epoch comes with the error")
	var rerr *fencelock.RebaseReplayError
	require.ErrorAs(t, err, &rerr)
	require.EqualValues(t, 10, rerr.Epoch)
	require.Empty(t, rerr.Standbys, "no standby is connected")
	require.Len(t, rerr.Slots, 1)
	got := rerr.Slots[0]
	require.Equal(t, rebaseSlot, got.Name)
	require.False(t, got.Active)
	var behind bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT $1::pg_lsn < $2::pg_lsn`, got.RestartLSN, rerr.LSN).Scan(&behind))
	require.True(t, behind, "restart_lsn %s, the rebase is at %s", got.RestartLSN, rerr.LSN)
	var restart string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT restart_lsn::text FROM pg_replication_slots WHERE slot_name = $1`,
		rebaseSlot).Scan(&restart))
	require.Equal(t, restart, got.RestartLSN, "the slot has not moved: its standby is down")
	for _, want := range []string{"committed on the primary", `"` + rebaseSlot + `"`, "inactive", got.RestartLSN, rerr.LSN,
		"context canceled", "atLeast 11", "ExceptSlot"} {
		require.ErrorContains(t, err, want)
	}
	t.Logf("after %v: %v", elapsed.Round(time.Millisecond), err)

	// pg_replication_slots shows the position to a role without any privilege.
	pc, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	conn := pc.Hijack() // its role is set below: not back to the pool
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `CREATE ROLE rebase_slot_reader; SET ROLE rebase_slot_reader`)
	require.NoError(t, err)
	var seen string
	require.NoError(t, conn.QueryRow(ctx, `SELECT restart_lsn::text FROM pg_replication_slots WHERE slot_name = $1`,
		rebaseSlot).Scan(&seen))
	require.Equal(t, restart, seen)

	rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
	epoch, err = fencelock.RebaseTokenEpochOpts(rctx, db.Pool, 11, fencelock.ExceptSlot(rebaseSlot))
	rcancel()
	require.NoError(t, err, "the slot left out")
	require.EqualValues(t, 11, epoch)
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT restart_lsn::text FROM pg_replication_slots WHERE slot_name = $1`,
		rebaseSlot).Scan(&seen))
	require.Equal(t, restart, seen, "the slot is still behind: the call did not wait for it")

	// Started again, the standby streams from its slot and replays the rebases. Once its WAL
	// sender streams from the slot, the call waits for its replay too, not only for the slot.
	require.NoError(t, standby.Restart(ctx))
	standbyPool.Reset() // its sessions ended with the crash; pgxpool pings an idle one only after a second
	awaitSlotActive(t, ctx, db.Pool, rebaseSlot)
	epoch, err = fencelock.RebaseTokenEpoch(ctx, db.Pool, 20)
	require.NoError(t, err, "the standby is back on its slot")
	require.EqualValues(t, 20, epoch)
	require.EqualValues(t, 19, epochOffset(t, ctx, standbyPool), "the standby has the rebase when the call returns")

	require.NoError(t, standby.Crash(ctx))
	awaitSlotInactive(t, ctx, db.Pool, rebaseSlot)
	_, err = db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, rebaseSlot)
	require.NoError(t, err)
	rctx, rcancel = context.WithTimeout(ctx, 20*time.Second)
	epoch, err = fencelock.RebaseTokenEpoch(rctx, db.Pool, 30)
	rcancel()
	require.NoError(t, err, "the slot dropped")
	require.EqualValues(t, 30, epoch)
}
