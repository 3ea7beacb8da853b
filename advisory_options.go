package fencelock

import (
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/internal/timing"
)

// Defaults of [NewAdvisoryLocker].
const (
	// DefaultNamespace is the namespace names are hashed in when [WithNamespace] is not given.
	DefaultNamespace = "fencelock"
	// DefaultWatchdogInterval is how often a held session lock's session is probed.
	DefaultWatchdogInterval = 5 * time.Second
	// DefaultMaxSessionLocks is the most session locks one locker holds at once.
	DefaultMaxSessionLocks = 64
)

// AdvisoryOption configures an [AdvisoryLocker]; [NewAdvisoryLocker] takes them. Each is
// validated by the constructor, which fails with an [*ArgumentError] on a bad one. An option
// that does not apply to an AdvisoryLocker (a [LessorOption]) does not compile there. An
// option is an immutable value: one may be passed to any number of constructors, from any
// goroutine.
type AdvisoryOption interface {
	applyAdvisory(*advisoryConfig) error
}

// advisoryOption is an [AdvisoryOption] that sets the locker's own configuration.
type advisoryOption func(*advisoryConfig) error

func (o advisoryOption) applyAdvisory(c *advisoryConfig) error { return o(c) }

// advisoryConfig is an AdvisoryLocker's configuration, every default resolved by
// newAdvisoryConfig.
type advisoryConfig struct {
	common    commonConfig
	namespace string
	hash      KeyHash
	watchdog  time.Duration
	maxLocks  int // cap on session locks held and being acquired
	tokens    bool
	// sessionPooler: a pooler sits in front, pinning one server session per client connection.
	sessionPooler bool
	clock         timing.Clock
}

// newAdvisoryConfig applies opts over the defaults; the cap on held locks depends on pool.
func newAdvisoryConfig(pool *pgxpool.Pool, opts []AdvisoryOption) (advisoryConfig, error) {
	c := advisoryConfig{
		namespace: DefaultNamespace,
		hash:      SHA256KeyHash,
		watchdog:  DefaultWatchdogInterval,
		clock:     timing.System{},
	}
	if err := applyAll(opts, func(o AdvisoryOption) error { return o.applyAdvisory(&c) }); err != nil {
		return advisoryConfig{}, err
	}
	if c.maxLocks == 0 {
		// Every session lock holds a pooled connection: leave at least one to the rest of the
		// application.
		c.maxLocks = max(1, min(DefaultMaxSessionLocks, int(pool.Config().MaxConns)-1))
	}
	c.common.resolve()
	return c, nil
}

// WithNamespace sets the namespace that lock names are hashed in ([KeyHash]): lockers with
// different namespaces derive different keys for the same name. 1 to [MaxNameLength] bytes of
// UTF-8 without NUL.
//
// Default: [DefaultNamespace].
func WithNamespace(ns string) AdvisoryOption {
	return advisoryOption(func(c *advisoryConfig) error {
		if err := validateName("WithNamespace", ns); err != nil {
			return err
		}
		c.namespace = ns
		return nil
	})
}

// WithKeyHash sets how names map to advisory keys. h must not be nil; see [KeyHash] for what
// it must guarantee.
//
// Default: [SHA256KeyHash].
func WithKeyHash(h KeyHash) AdvisoryOption {
	return advisoryOption(func(c *advisoryConfig) error {
		if h == nil {
			return argError("WithKeyHash", "must not be nil")
		}
		c.hash = h
		return nil
	})
}

// WithWatchdogInterval sets how often the session of each held session lock is probed, a
// time.Duration of at least 10ms. A probe that fails, or takes longer than the interval, or
// finds another backend behind the connection, ends the lock: its connection is closed and
// Done closes. So Done closes at most twice the interval after the session is lost, whatever
// the network does (TCP keepalive, which pgx sets to 5 minutes by default, is not relied on).
// A lock's first probe also labels its session (application_name "fencelock <name>", shown by
// fencelock.advisory_locks): a lock is labelled within about one interval of its grant, and
// one released sooner is shown by key only.
//
// Default: [DefaultWatchdogInterval].
func WithWatchdogInterval(d time.Duration) AdvisoryOption {
	return advisoryOption(func(c *advisoryConfig) error {
		if d < 10*time.Millisecond {
			return argError("WithWatchdogInterval", "is %v; it must be at least 10ms", d)
		}
		c.watchdog = d
		return nil
	})
}

// WithMaxSessionLocks caps the session locks a locker holds at once (those being acquired
// included), n >= 1. Each holds a connection of the pool for as long as it is held (size the
// pool for it) and a slot of the server's lock table (max_locks_per_transaction x
// max_connections slots, shared by all sessions); past the cap, [AdvisoryLocker.TryLock] and
// [AdvisoryLocker.Lock] fail with [ErrTooManyLocks] before any SQL runs. Transaction locks
// are not counted.
//
// Default: [DefaultMaxSessionLocks], or the pool's MaxConns - 1 if that is smaller (at least
// 1).
func WithMaxSessionLocks(n int) AdvisoryOption {
	return advisoryOption(func(c *advisoryConfig) error {
		if n < 1 {
			return argError("WithMaxSessionLocks", "is %d; it must be >= 1", n)
		}
		c.maxLocks = n
		return nil
	})
}

// WithSessionPooler declares that a connection pooler between the pool and the server pins one
// server session to each client connection for the connection's whole life: PgBouncer with
// pool_mode = session, or RDS Proxy once it has pinned the session. Session locks are then safe,
// and are taken where, without this option, a pooler is detected (the server session's pid
// differs from the one the connection was given at startup) and refused with
// [ErrConnectionPooler]. fencelock cannot tell a session pooler from a transaction pooler: the
// pids differ behind both. Declaring it for a pooler that shares server sessions between
// clients (PgBouncer's transaction or statement mode) would let another client's transaction
// run on the session that holds the lock and hold it too: never do that.
//
// The watchdog ([WithWatchdogInterval]) checks that the lock's server session is still the
// one behind the connection and ends the lock if it is not. When the client connection closes,
// the pooler ends the lock by resetting the server session: PgBouncer runs server_reset_query,
// whose default DISCARD ALL releases advisory locks (keep it so). Transaction locks need no
// option: they work behind every pooler.
//
// Default: a detected pooler refuses session locks.
func WithSessionPooler() AdvisoryOption {
	return advisoryOption(func(c *advisoryConfig) error {
		c.sessionPooler = true
		return nil
	})
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
// ([ErrTokenEpochBehind]). Without this option Token() is 0.
//
// Default: off.
func WithFencingTokens() AdvisoryOption {
	return advisoryOption(func(c *advisoryConfig) error {
		c.tokens = true
		return nil
	})
}

// LockMode is the mode of an advisory lock. It is a [LockOption]: pass [Shared] to a lock call
// for a shared lock; the default is [Exclusive].
type LockMode int

const (
	// Exclusive conflicts with every other holder of the key.
	Exclusive LockMode = iota
	// Shared conflicts only with Exclusive holders of the key.
	Shared
)

// String returns "exclusive" or "shared".
func (m LockMode) String() string {
	if m == Shared {
		return "shared"
	}
	return "exclusive"
}

// LockOption configures one lock call of an [AdvisoryLocker] ([AdvisoryLocker.TryLock],
// [AdvisoryLocker.Lock], [AdvisoryLocker.TryLockTx], [AdvisoryLocker.LockTx]): its mode, given
// by a [LockMode] ([Shared]; default [Exclusive]), and its key ([AtKey]; default the key the
// name maps to, [AdvisoryLocker.Key]). The call validates them before any SQL runs: a nil
// option, a LockMode other than Exclusive and Shared, two modes that differ, or AtKey given
// twice with different keys is an [*ArgumentError]. An option of a constructor
// ([AdvisoryOption], [LessorOption]) does not compile here. Like them, a LockOption is an
// immutable value, safe to share between calls and goroutines.
type LockOption interface {
	applyLock(*lockConfig) error
}

// lockConfig is what one lock call's options ask for.
type lockConfig struct {
	mode    LockMode
	modeSet bool
	key     AdvisoryKey
	keySet  bool // AtKey: lock key, not the name's
}

// applyLock makes a LockMode a [LockOption]: the mode of the lock call it is given to.
func (m LockMode) applyLock(c *lockConfig) error {
	switch {
	case m != Exclusive && m != Shared:
		return argError("mode", "is %d; want Exclusive or Shared", int(m))
	case c.modeSet && c.mode != m:
		return argError("mode", "is given as both %v and %v", c.mode, m)
	}
	c.mode, c.modeSet = m, true
	return nil
}

// lockOption is a [LockOption] other than a mode.
type lockOption func(*lockConfig) error

func (o lockOption) applyLock(c *lockConfig) error { return o(c) }

// AtKey makes a lock call lock key, as it is, instead of the key its name maps to (so no
// [KeyHash] or namespace applies): for keys shared with code that calls Postgres's advisory
// lock functions itself. The name then only labels the lock (in messages, the
// application_name the watchdog gives a held lock's session at its first probe,
// [AdvisoryLock.Name] and the locker's held set, where taking a held key under another name is
// a [*KeyCollisionError]); it may be "", and the lock is then described by its key ("key 42",
// application_name "fencelock key 42"). Every key is valid, the zero AdvisoryKey (the int64
// key 0) included. Given twice with different keys, the call fails with an [*ArgumentError].
func AtKey(key AdvisoryKey) LockOption {
	return lockOption(func(c *lockConfig) error {
		if c.keySet && c.key != key {
			return argError("AtKey", "is given as both %v and %v", c.key, key)
		}
		c.key, c.keySet = key, true
		return nil
	})
}
