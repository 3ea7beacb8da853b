package advisory

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
)

// Key is an advisory lock key: one int64 (Pair false, Int64) or a pair of int32 (Pair true, K1
// and K2). The zero value is the int64 key 0. Comparable.
type Key struct {
	Pair   bool
	Int64  int64
	K1, K2 int32
}

// String renders the key as Postgres's lock functions take it: "123" or "(1,2)".
func (k Key) String() string {
	if k.Pair {
		return fmt.Sprintf("(%d,%d)", k.K1, k.K2)
	}
	return fmt.Sprint(k.Int64)
}

// keyDomain separates fencelock's advisory keys from any other use of SHA-256 over names.
const keyDomain = "fencelock/advisory-key/v1"

// SHA256 derives the int64 key of name in namespace: the first 8 bytes, big-endian, of
//
//	SHA-256(keyDomain || 0x00 || uvarint(len(namespace)) || namespace || uvarint(len(name)) || name)
//
// with keyDomain = "fencelock/advisory-key/v1". The root package's SHA256KeyHash is this
// function; it must never change within v1.
func SHA256(namespace, name string) int64 {
	// One buffer on the stack for the usual lengths: the hash of the concatenation is the hash
	// of the pieces written one by one, so a long name (the heap) derives the same key.
	var stack [256]byte
	buf := append(stack[:0], keyDomain...)
	buf = append(buf, 0)
	buf = binary.AppendUvarint(buf, uint64(len(namespace)))
	buf = append(buf, namespace...)
	buf = binary.AppendUvarint(buf, uint64(len(name)))
	buf = append(buf, name...)
	sum := sha256.Sum256(buf)
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

// Describe names a lock in messages: its name (quoted) and key when it has a name, else
// "key <key>".
func Describe(name string, key Key) string {
	if name != "" {
		return fmt.Sprintf("%q (key %v)", name, key)
	}
	return "key " + key.String()
}

// applicationName is the label a session holding a lock gets as its application_name, at the
// watchdog's first probe of the lock ([LabelSession]), so that pg_stat_activity shows who holds
// what: "fencelock <name>" or "fencelock key <key>", cut to the 63 bytes Postgres keeps, at a
// UTF-8 boundary. (Postgres shows non-ASCII bytes as '?'.)
func applicationName(name string, key Key) string {
	s := "fencelock " + name
	if name == "" {
		s = "fencelock key " + key.String()
	}
	const max = 63
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && s[cut]&0xC0 == 0x80 { // do not split a UTF-8 sequence
		cut--
	}
	return s[:cut]
}
