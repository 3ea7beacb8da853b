// Package validate holds the checks on input that every fencelock package runs before any
// SQL, and the error they return: an [*ArgumentError], which matches [ErrInvalidArgument].
// Package fencelock and package ratelimit export both under their own names, as aliases of
// these (the same type and the same value), so a caller matches either name.
package validate

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Limits on input, checked before any SQL runs. Package fencelock exports them under the same
// names, with their documentation.
const (
	// MaxNameLength is the longest lease name, fence resource or rate-limit key, in bytes of
	// UTF-8.
	MaxNameLength = 1024
	// MaxTTL is the longest lease TTL, and the longest a rate limit may take to refill.
	MaxTTL = 7 * 24 * time.Hour
)

// ErrInvalidArgument matches every [*ArgumentError]: bad input refused before any SQL ran.
var ErrInvalidArgument = errors.New("fencelock: invalid argument")

// ArgumentError reports bad input, found before any SQL ran. It matches
// [ErrInvalidArgument] under [errors.Is].
type ArgumentError struct {
	Arg    string // the parameter or option, e.g. "name", "ttl", "WithHeartbeatInterval"
	Reason string // what is wrong with it
}

// Error describes the ArgumentError.
func (e *ArgumentError) Error() string {
	return "fencelock: invalid " + e.Arg + ": " + e.Reason
}

// Is reports whether target is [ErrInvalidArgument].
func (e *ArgumentError) Is(target error) bool { return target == ErrInvalidArgument }

// Errorf returns an [*ArgumentError] for arg, its Reason formatted from format and a as by
// [fmt.Sprintf].
func Errorf(arg, format string, a ...any) error {
	return &ArgumentError{Arg: arg, Reason: fmt.Sprintf(format, a...)}
}

// Name checks a lease name, fence resource or rate-limit key: 1 to [MaxNameLength] bytes of
// valid UTF-8 without NUL (Postgres text cannot hold NUL). It returns nil or an
// [*ArgumentError] for arg.
func Name(arg, name string) error {
	if name == "" {
		return Errorf(arg, "must not be empty")
	}
	return Text(arg, name, MaxNameLength)
}

// Text checks text bound for a Postgres text column: at most limit bytes of valid UTF-8
// without NUL. It returns nil or an [*ArgumentError] for arg.
func Text(arg, s string, limit int) error {
	switch {
	case len(s) > limit:
		return Errorf(arg, "is %d bytes long; the limit is %d", len(s), limit)
	case !utf8.ValidString(s):
		return Errorf(arg, "is not valid UTF-8")
	case strings.IndexByte(s, 0) >= 0:
		return Errorf(arg, "contains a NUL byte")
	}
	return nil
}
