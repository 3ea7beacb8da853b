package fencelock

import "time"

// Defaults of [NewAdvisoryLocker].
const (
	// DefaultNamespace is the namespace names are hashed in when [WithNamespace] is not given.
	DefaultNamespace = "fencelock"
	// DefaultWatchdogInterval is how often a held session lock's session is probed.
	DefaultWatchdogInterval = 5 * time.Second
	// DefaultMaxHeld is the most session locks one locker holds at once.
	DefaultMaxHeld = 64
)

// WithNamespace sets the namespace that lock names are hashed in ([KeyHash]): lockers with
// different namespaces derive different keys for the same name. 1 to [MaxNameLength] bytes of
// UTF-8 without NUL. Applies to [NewAdvisoryLocker] only.
//
// Default: [DefaultNamespace].
func WithNamespace(ns string) Option {
	return func(c *config) error {
		c.set["WithNamespace"] = true
		if err := validateName("WithNamespace", ns); err != nil {
			return err
		}
		c.namespace = ns
		return nil
	}
}

// WithKeyHash sets how names map to advisory keys. h must not be nil; see [KeyHash] for what
// it must guarantee. Applies to [NewAdvisoryLocker] only.
//
// Default: [SHA256KeyHash].
func WithKeyHash(h KeyHash) Option {
	return func(c *config) error {
		c.set["WithKeyHash"] = true
		if h == nil {
			return argError("WithKeyHash", "must not be nil")
		}
		c.keyHash = h
		return nil
	}
}

// WithWatchdogInterval sets how often the session of each held session lock is probed, a
// time.Duration of at least 10ms. A probe that fails, or takes longer than the interval, or
// finds another backend behind the connection, ends the lock: its connection is closed and
// Done closes. So Done closes at most twice the interval after the session is lost, whatever
// the network does (TCP keepalive, which pgx sets to 5 minutes by default, is not relied on).
// Applies to [NewAdvisoryLocker] only.
//
// Default: [DefaultWatchdogInterval].
func WithWatchdogInterval(d time.Duration) Option {
	return func(c *config) error {
		c.set["WithWatchdogInterval"] = true
		if d < 10*time.Millisecond {
			return argError("WithWatchdogInterval", "is %v; it must be at least 10ms", d)
		}
		c.watchdog = d
		return nil
	}
}

// WithMaxHeld caps the session locks a locker holds at once, n >= 1. Each holds a connection
// of the pool for as long as it is held (size the pool for it) and a slot of the server's lock
// table (max_locks_per_transaction x max_connections slots, shared by all sessions); past the
// cap, lock calls fail with [ErrTooManyLocks] before any SQL runs. Applies to
// [NewAdvisoryLocker] only.
//
// Default: [DefaultMaxHeld], or the pool's MaxConns - 1 if that is smaller (at least 1).
func WithMaxHeld(n int) Option {
	return func(c *config) error {
		c.set["WithMaxHeld"] = true
		if n < 1 {
			return argError("WithMaxHeld", "is %d; it must be >= 1", n)
		}
		c.maxHeld = n
		return nil
	}
}

// WithFencingTokens makes every grant of the locker, session or transaction lock, also draw a
// fencing token from the sequence leases use, in the same statement, after the lock is
// granted: it is then larger than the token of any earlier holder of the lock, and [FenceTx]
// works with it as with a lease's. The token is drawn by fencelock.next_token, which writes the
// backend's row of fencelock.token_flushes and raises synchronous_commit from off to on, so that
// the statement's commit flushes the WAL: a session lock's token is durable before it is returned,
// a transaction lock's once the caller's transaction commits (do not hand it to another system
// before then), even when it falls in a range of the sequence that a rolled-back transaction
// WAL-logged. A misconfigured token sequence is refused ([ErrTokenSequence]), and so is a
// grant past the token budget ([ErrTokenBudget]) or on an epoch that went back
// ([ErrTokenEpochBehind]). Without this option
// Token() is 0. Applies to [NewAdvisoryLocker] only.
//
// Default: off.
func WithFencingTokens() Option {
	return func(c *config) error {
		c.set["WithFencingTokens"] = true
		c.tokens = true
		return nil
	}
}
