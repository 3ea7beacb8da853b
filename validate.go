package fencelock

import (
	"strings"
	"time"
	"unicode/utf8"

	"github.com/fencelock/fencelock/internal/validate"
)

// Limits on input, checked before any SQL runs.
const (
	// MaxNameLength is the longest lease name, fence resource or rate-limit key: 1024 bytes
	// of UTF-8.
	MaxNameLength = validate.MaxNameLength
	// MinTTL is the shortest lease TTL: shorter ones cannot outlast a round trip and a renewal.
	MinTTL = 10 * time.Millisecond
	// MaxTTL is the longest lease TTL, 7 days (168h). A lease meant to outlive a week is a
	// configuration mistake; a crashed holder would keep others out for that long. A rate
	// limit must also refill within MaxTTL.
	MaxTTL = validate.MaxTTL
)

// validateName checks a lease name or fence resource: 1 to MaxNameLength bytes of valid
// UTF-8 without NUL (Postgres text cannot hold NUL).
func validateName(arg, name string) error { return validate.Name(arg, name) }

// validateText checks text bound for a Postgres text column: at most limit bytes of valid UTF-8
// without NUL.
func validateText(arg, s string, limit int) error { return validate.Text(arg, s, limit) }

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
