package fencelock

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/internal/db"
)

// RebaseTokenEpoch makes the tokens issued from now on, by the database behind pool, larger
// than every token it, or the database it was copied from, has issued. A standby's promotion
// and a point-in-time recovery need nothing: they start a new, higher timeline. pg_upgrade (it
// starts the new cluster on timeline 1) and a logical copy (pg_dump and restore, logical
// replication) onto another cluster take the timeline back: grants then fail with
// [ErrTokenEpochBehind] until RebaseTokenEpoch is called on it. The database remembers the
// highest epoch it issued tokens in, whatever transaction drew the epoch's first token and
// however it ended (fencelock.token_epoch.last_epoch, and fencelock.token_epoch_marks for
// tokens drawn while another transaction held that row); a logical copy that left out either
// table cannot know: call RebaseTokenEpoch after any copy, before any grant there. Let the
// standbys replay it (or use synchronous replication) before a failover can happen: a
// promotion that loses it loses the raised epoch too.
//
// It raises fencelock.token_epoch.epoch_offset, which is added to the timeline, so that the
// next epoch is at least atLeast and above both the highest epoch recorded (last_epoch and
// every mark) and the epoch of every token in fencelock.leases, fencelock.fences and
// fencelock.token_flushes; it never lowers it. Pass as atLeast the source's epoch plus one (a
// token it issued last, t.Epoch()+1) when its tokens are kept outside those tables too
// ([UpdateFencedTx] columns, external systems), else 0. It returns the epoch of the next
// token. It scans those three tables: run it once, not per grant. The role needs UPDATE on
// fencelock.token_epoch and SELECT on fencelock.token_epoch_marks. Safe for concurrent use:
// concurrent calls serialise on the offset's row, and a call waits for a transaction that
// holds that row (a RunLocked that drew a new epoch's first token, or folded marks) to end.
//
// Errors: an [*ArgumentError] for a nil pool or atLeast > 65535 (before any SQL); an error
// wrapping [ErrTokenBudget] if the epoch would pass 65535; an error wrapping [ErrReadOnly] on a
// hot standby; otherwise the pgx error, wrapped.
func RebaseTokenEpoch(ctx context.Context, pool *pgxpool.Pool, atLeast uint32) (uint32, error) {
	if pool == nil {
		return 0, argError("pool", "must not be nil")
	}
	if atLeast > 1<<TokenEpochBits-1 {
		return 0, argError("atLeast", "%d is past the last epoch, %d", atLeast, 1<<TokenEpochBits-1)
	}
	epoch, err := db.New().TokenEpochRebase(ctx, pool, int32(atLeast))
	if err != nil {
		return 0, wrapPg("rebase token epoch", err)
	}
	return uint32(epoch), nil
}
