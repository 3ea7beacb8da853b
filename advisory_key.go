package fencelock

import "github.com/fencelock/fencelock/internal/advisory"

// AdvisoryKey identifies a Postgres advisory lock: one int64 key, or a pair of int32 keys.
// Postgres keeps the two forms in separate key spaces (pg_locks.objsubid 1 and 2): the pair
// (0, 5) is not the key 5. The zero value is the int64 key 0. Comparable; use it as a map key.
type AdvisoryKey struct {
	k advisory.Key
}

// Int64Key returns the advisory key k, as taken by pg_advisory_lock(bigint).
func Int64Key(k int64) AdvisoryKey { return AdvisoryKey{advisory.Key{Int64: k}} }

// Int32PairKey returns the advisory key (k1, k2), as taken by pg_advisory_lock(int, int).
func Int32PairKey(k1, k2 int32) AdvisoryKey {
	return AdvisoryKey{advisory.Key{Pair: true, K1: k1, K2: k2}}
}

// Int64 returns the int64 key and true, or 0 and false for a pair key. In pg_locks an int64
// key k shows as classid = k >> 32 and objid = k & 0xffffffff (both unsigned), objsubid 1.
func (k AdvisoryKey) Int64() (int64, bool) { return k.k.Int64, !k.k.Pair }

// String renders the key as Postgres's lock functions take it: "123" or "(1,2)".
func (k AdvisoryKey) String() string { return k.k.String() }

// KeyHash maps a namespace and a lock name to an int64 advisory key. It must be
// deterministic, stable across processes and versions (every process that locks a name must
// derive the same key), and safe for concurrent use.
type KeyHash func(namespace, name string) int64

// SHA256KeyHash is the default [KeyHash]: the first 8 bytes, big-endian, of
//
//	SHA-256(keyDomain || 0x00 || uvarint(len(namespace)) || namespace || uvarint(len(name)) || name)
//
// with keyDomain = "fencelock/advisory-key/v1", read as an int64. The length prefixes keep
// ("ab", "c") and ("a", "bc") apart; the domain string keeps the keys apart from other hashes.
// With 64 bits, 100,000 names collide with probability about 3e-10 (a 32-bit hash such as
// hashtext would collide with probability about 0.69). Stable: it will not change within v1.
func SHA256KeyHash(namespace, name string) int64 { return advisory.SHA256(namespace, name) }

// describeLock names a lock in messages: its name when it has one, else its key.
func describeLock(name string, key AdvisoryKey) string { return advisory.Describe(name, key.k) }
