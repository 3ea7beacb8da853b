package fencelock

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
