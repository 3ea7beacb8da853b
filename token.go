package fencelock

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/internal/db"
)

// Token is a fencing token: an int64 > 0 that a grant carries, larger than the token of every
// earlier grant of the same lease name (and unique across all names). A write guarded by a
// token is rejected once a larger token has been seen for the resource. Zero is never a valid
// token. This is the fencing-token scheme of Kleppmann (2016), "How to do distributed locking".
//
// A token is an epoch token: its high [TokenEpochBits] bits hold the epoch, the server's
// timeline when the token was drawn (plus an offset that [RebaseTokenEpoch] may raise), and its
// low [TokenSequenceBits] bits a value of the sequence fencelock.leases_token_seq. A promotion
// of a standby starts a new timeline, numbered above every timeline the promoted server knows
// of, so every token drawn after it is larger than every token the old primary issued, even
// when the promotion lost WAL (asynchronous replication). This holds when the promoted server
// knows every earlier timeline: a standby that never received a newer timeline's history file
// (it never followed that timeline's primary, and there is no shared WAL archive) picks that
// timeline's number again. Tokens issued before migration 00003 have epoch 0 and are smaller
// than every later token. The budget: 2^47 - 1 grants over the database's life and epochs 1 to
// 65535; past either, grants fail with [ErrTokenBudget]. Where the timeline went back
// (pg_upgrade, a logical copy), grants fail with [ErrTokenEpochBehind] until
// [RebaseTokenEpoch]. A base backup started without recovery keeps its timeline with an older
// sequence, and its tokens repeat: restore with recovery, which starts a new timeline. The
// timeline as the epoch is the idea of the WAL's own history: PostgreSQL advances it, durably,
// exactly when a server leaves recovery. docs/FAILOVER.md has the details and the measurements.
type Token int64

const (
	// TokenEpochBits is the number of high bits of a [Token] that hold its epoch (the
	// server's timeline plus an offset): epochs 1 to 65535.
	TokenEpochBits = 16
	// TokenSequenceBits is the number of low bits of a [Token] that hold its sequence value:
	// 1 to 2^47 - 1.
	TokenSequenceBits = 63 - TokenEpochBits
)

// Epoch returns the epoch of t: the timeline of the server that issued it plus the offset of
// [RebaseTokenEpoch] (0 unless raised), 1 to 65535, or 0 for a token issued before epoch
// tokens (migration 00003). Safe for concurrent use.
func (t Token) Epoch() uint32 { return uint32(uint64(t) >> TokenSequenceBits) }

// Sequence returns the sequence part of t: the value of fencelock.leases_token_seq it was
// drawn with, 1 to 2^47 - 1. Safe for concurrent use.
func (t Token) Sequence() int64 { return int64(t) & (1<<TokenSequenceBits - 1) }

// RebaseTokenEpoch makes the tokens issued from now on, by the database behind pool, larger
// than every token it, or the database it was copied from, has issued. A standby's promotion
// and a point-in-time recovery need nothing: they start a new, higher timeline. pg_upgrade (it
// starts the new cluster on timeline 1) and a logical copy (pg_dump and restore, logical
// replication) onto another cluster take the timeline back: grants then fail with
// [ErrTokenEpochBehind] (the database remembers the highest epoch it issued tokens in) until
// RebaseTokenEpoch is called on it. A logical copy that left out fencelock.token_epoch cannot
// know: call RebaseTokenEpoch after any copy, before any grant there. Let the standbys replay
// it (or use synchronous replication) before a failover can happen: a promotion that loses it
// loses the raised epoch too.
//
// It raises fencelock.token_epoch.epoch_offset, which is added to the timeline, so that the
// next epoch is at least atLeast and above both the highest epoch issued and the epoch of every
// token in fencelock.leases, fencelock.fences and fencelock.token_flushes; it never lowers it.
// Pass as atLeast the source's epoch plus one (a token it issued last, t.Epoch()+1) when its
// tokens are kept outside those tables too ([UpdateFencedTx] columns, external systems), else
// 0. It returns the epoch of the next token. It scans those three tables: run it once, not per
// grant. The role needs UPDATE on fencelock.token_epoch. Safe for concurrent use; concurrent
// calls serialise on the offset's row.
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
