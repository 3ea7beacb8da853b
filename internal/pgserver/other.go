//go:build !unix

package pgserver

import (
	"context"
	"errors"
	"net/url"
)

// ErrNoLocal says local servers need a Unix-like OS.
var ErrNoLocal = errors.New("pgserver: local servers and PgBouncer need a Unix-like OS")

// Local is never created outside Unix.
type Local struct{}

// Run is never created outside Unix.
type Run struct{}

// StartLocal returns [ErrNoLocal] outside Unix.
func StartLocal(context.Context, []Setting, bool) (*Local, *url.URL, error) {
	return nil, nil, ErrNoLocal
}

// HoldPristine does nothing outside Unix.
func HoldPristine(bool) error { return nil }

// Crash returns [ErrNoLocal].
func (*Local) Crash(context.Context) error { return ErrNoLocal }

// Restart returns [ErrNoLocal].
func (*Local) Restart(context.Context) error { return ErrNoLocal }

// IsRunning reports false.
func (*Local) IsRunning() bool { return false }

// Close does nothing.
func (*Local) Close() error { return nil }

// ArchiveDir returns "".
func (*Local) ArchiveDir() string { return "" }

// StartStandby returns [ErrNoLocal].
func (*Local) StartStandby(context.Context, *url.URL) (*Local, *url.URL, error) {
	return nil, nil, ErrNoLocal
}

// PauseWALSenders returns [ErrNoLocal].
func (*Local) PauseWALSenders([]int) error { return ErrNoLocal }

// ResumeWALSenders returns [ErrNoLocal].
func (*Local) ResumeWALSenders() error { return ErrNoLocal }

// HasExited reports true: a Run is never started outside Unix.
func (*Run) HasExited() bool { return true }
