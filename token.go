package fencelock

// Token is a fencing token: an int64 > 0 that a grant carries, larger than the token of every
// earlier grant of the same lease name (and unique across all names). A write guarded by a
// token is rejected once a larger token has been seen for the resource. Zero is never a valid
// token. This is the fencing-token scheme of Kleppmann (2016), "How to do distributed
// locking".
//
// A token is an epoch token: its high [TokenEpochBits] bits hold the epoch, the server's
// timeline when the token was drawn, and its low [TokenSequenceBits] bits a value of the
// sequence fencelock.leases_token_seq. A promotion of a standby starts a new timeline, so every
// token drawn after it is larger than every token the old primary issued, even when the
// promotion lost WAL (asynchronous replication). Tokens issued before migration 00003 have
// epoch 0 and are smaller than every later token. The budget: 2^47 - 1 grants over the
// database's life and timelines 1 to 65535; past either, grants fail with [ErrTokenBudget].
// The timeline as the epoch is the idea of the WAL's own history: PostgreSQL numbers each
// promotion's timeline above every timeline the promoted server knows of.
type Token int64

const (
	// TokenEpochBits is the number of high bits of a [Token] that hold its epoch (the
	// server's timeline): epochs 1 to 65535.
	TokenEpochBits = 16
	// TokenSequenceBits is the number of low bits of a [Token] that hold its sequence value:
	// 1 to 2^47 - 1.
	TokenSequenceBits = 63 - TokenEpochBits
)

// Epoch returns the epoch of t: the timeline of the server that issued it, 1 to 65535, or 0
// for a token issued before epoch tokens (migration 00003). Safe for concurrent use.
func (t Token) Epoch() uint32 { return uint32(uint64(t) >> TokenSequenceBits) }

// Sequence returns the sequence part of t: the value of fencelock.leases_token_seq it was
// drawn with, 1 to 2^47 - 1. Safe for concurrent use.
func (t Token) Sequence() int64 { return int64(t) & (1<<TokenSequenceBits - 1) }
