package fencelock

import (
	"strings"
	"time"
	"unicode/utf8"
)

// Limits on input, checked before any SQL runs.
const (
	// MaxNameLength is the longest lease name or fence resource, in bytes of UTF-8.
	MaxNameLength = 1024
	// MinTTL is the shortest lease TTL: shorter ones cannot outlast a round trip and a renewal.
	MinTTL = 10 * time.Millisecond
	// MaxTTL is the longest lease TTL. A lease meant to outlive a week is a configuration
	// mistake; a crashed holder would keep others out for that long.
	MaxTTL = 7 * 24 * time.Hour
)

// validateName checks a lease name or fence resource: 1 to MaxNameLength bytes of valid
// UTF-8 without NUL (Postgres text cannot hold NUL).
func validateName(arg, name string) error {
	switch {
	case name == "":
		return argError(arg, "must not be empty")
	case len(name) > MaxNameLength:
		return argError(arg, "is %d bytes long; the limit is %d", len(name), MaxNameLength)
	case !utf8.ValidString(name):
		return argError(arg, "is not valid UTF-8")
	case strings.IndexByte(name, 0) >= 0:
		return argError(arg, "contains a NUL byte")
	}
	return nil
}

// validateTTL checks a lease TTL against [MinTTL] and [MaxTTL].
func validateTTL(ttl time.Duration) error {
	if ttl < MinTTL || ttl > MaxTTL {
		return argError("ttl", "is %v; it must be between %v and %v", ttl, MinTTL, MaxTTL)
	}
	return nil
}

// validateToken checks that a fencing token could have been granted: tokens are > 0.
func validateToken(t Token) error {
	if t <= 0 {
		return argError("token", "is %d; fencing tokens are > 0", int64(t))
	}
	return nil
}

// validateIdent checks a SQL identifier before it is quoted: 1 to 63 bytes (Postgres would
// silently truncate a longer one to another name), valid UTF-8, no NUL.
func validateIdent(arg, id string) error {
	switch {
	case id == "":
		return argError(arg, "identifier must not be empty")
	case len(id) > 63:
		return argError(arg, "identifier %q is %d bytes; Postgres truncates identifiers past 63", id, len(id))
	case !utf8.ValidString(id):
		return argError(arg, "identifier is not valid UTF-8")
	case strings.IndexByte(id, 0) >= 0:
		return argError(arg, "identifier contains a NUL byte")
	}
	return nil
}
